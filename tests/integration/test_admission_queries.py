"""The reads behind the jobs API's admission control and enqueue answers: bounded
backlog counts, per-name backlogs and bulk statuses."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, InvalidName, InvalidOptions, JobStatus, Queue
from tests.helpers import put_in_state


async def test_runnable_backlog_counts_only_due_queued_jobs_up_to_a_bound(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("a")] * 5 + [EnqueueRequest("b")] * 2)
    await queue.enqueue("a", options=EnqueueOptions(delay=3600))  # not runnable yet
    running = await queue.enqueue("a")
    await put_in_state(pool, running, "running")

    assert await queue.runnable_backlog() == 7
    assert await queue.runnable_backlog("a") == 5
    assert await queue.runnable_backlog(at_most=3) == 3
    assert await queue.runnable_backlog("b", at_most=10) == 2
    assert await queue.runnable_backlog(at_most=0) == 0
    with pytest.raises(InvalidOptions, match="at_most"):
        await queue.runnable_backlog(at_most=-1)


async def test_a_horizon_counts_the_jobs_due_within_it(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.enqueue("a")
    await queue.enqueue("a", options=EnqueueOptions(delay=60))
    await queue.enqueue("b", options=EnqueueOptions(delay=7200))
    assert await queue.runnable_backlog() == 1
    assert await queue.runnable_backlog(horizon=600) == 2
    assert await queue.runnable_backlog(horizon=86400) == 3
    assert await queue.runnable_backlog_by_name(["a", "b"], horizon=600) == {"a": 2, "b": 0}
    with pytest.raises(InvalidOptions, match="horizon"):
        await queue.runnable_backlog(horizon=-1)


async def test_runnable_backlog_by_name_reports_every_name_asked(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("a")] * 4 + [EnqueueRequest("b")])

    assert await queue.runnable_backlog_by_name(["a", "b", "c"]) == {"a": 4, "b": 1, "c": 0}
    assert await queue.runnable_backlog_by_name(["a", "b"], at_most=2) == {"a": 2, "b": 1}
    assert await queue.runnable_backlog_by_name([]) == {}
    with pytest.raises(InvalidName):
        await queue.runnable_backlog_by_name(["not a name"])


async def test_statuses_of_many_jobs_in_one_query(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    queued, running = await queue.enqueue_many([EnqueueRequest("a"), EnqueueRequest("a")])
    await put_in_state(pool, running, "running")
    unknown = uuid.uuid4()

    found = await queue.statuses([queued, str(running), unknown, "not-a-uuid"])

    assert found == {queued: JobStatus.QUEUED, running: JobStatus.RUNNING}
    assert await queue.statuses([]) == {}
