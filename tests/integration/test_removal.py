"""Removal at completion (``remove_succeeded_jobs``) against a real Postgres and
real workers: which succeeded jobs the claim round deletes, which it keeps, and
what readers see afterwards."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    JobNotFound,
    JobStatus,
    Queue,
    WorkerConfig,
)
from pgfleet.testing import drain
from tests.apps import runtime_app
from tools.devkit import until


async def statuses(pool: asyncpg.Pool, ids: list[uuid.UUID]) -> dict[uuid.UUID, str]:
    rows = await pool.fetch(
        "SELECT id, status::text FROM pgfleet.jobs WHERE id = ANY($1::uuid[])", ids
    )
    return {r[0]: r[1] for r in rows}


async def test_succeeded_jobs_are_deleted_failed_ones_and_results_kept(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    plain = await queue.enqueue_many([EnqueueRequest("record", {"i": i}) for i in range(40)])
    # A named queue: each removed job frees the queue for the next in line.
    serial = await queue.enqueue_many(
        [EnqueueRequest("record", {"s": i}, EnqueueOptions(queue_name="one")) for i in range(5)]
    )
    failed = await queue.enqueue("fail", {})
    with_result = await queue.enqueue("echo", {"kept": True})
    without_result = await queue.enqueue("echo", None)
    stats = await drain(pool, runtime_app.registry, remove_succeeded_jobs=True, concurrency=4)

    # Every job ran once and the counters say what happened, as without removal.
    assert stats.succeeded == 47 and stats.failed == 1 and stats.claimed == 48
    ran = await pool.fetch("SELECT job_id FROM public.executions WHERE name = 'record'")
    assert sorted(r[0] for r in ran) == sorted(plain + serial)
    left = await statuses(pool, [*plain, *serial, failed, with_result, without_result])
    assert left == {failed: "failed", with_result: "succeeded"}
    job = await queue.get(with_result)
    assert job is not None and job.result == {"kept": True}
    assert await queue.get(plain[0]) is None
    with pytest.raises(JobNotFound, match="remove_succeeded_jobs"):
        await queue.wait(plain[0], timeout=1)


async def test_without_the_setting_succeeded_jobs_stay(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(5)])
    await drain(pool, runtime_app.registry, concurrency=2)
    assert set((await statuses(pool, ids)).values()) == {"succeeded"}


async def test_a_job_someone_waits_for_is_kept(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    awaited, other = await queue.enqueue_many(
        [EnqueueRequest("record", {}), EnqueueRequest("record", {})]
    )
    waiting = asyncio.create_task(queue.wait(awaited, timeout=30))

    async def marked() -> bool:
        value: Any = await pool.fetchval("SELECT awaited FROM pgfleet.jobs WHERE id = $1", awaited)
        return value is True

    await until(marked)
    await drain(pool, runtime_app.registry, remove_succeeded_jobs=True)
    job = await waiting
    assert job.status is JobStatus.SUCCEEDED
    assert await statuses(pool, [awaited, other]) == {awaited: "succeeded"}


async def test_jobs_in_a_workflow_are_kept(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    parent, child, alone = await queue.enqueue_many(
        [
            EnqueueRequest("record", {"p": 1}),
            EnqueueRequest("record", {"c": 1}, EnqueueOptions(after=(0,))),
            EnqueueRequest("record", {"a": 1}),
        ]
    )
    stats = await drain(pool, runtime_app.registry, remove_succeeded_jobs=True)
    assert stats.succeeded == 3
    # The parent released its child (the trigger runs on the update, not a delete),
    # and both stay readable with their edge.
    assert await statuses(pool, [parent, child, alone]) == {
        parent: "succeeded",
        child: "succeeded",
    }
    assert [p.id for p in await queue.parents(child)] == [parent]


def test_the_setting_must_be_a_boolean() -> None:
    with pytest.raises(Exception, match="remove_succeeded_jobs must be True or False"):
        WorkerConfig(remove_succeeded_jobs="yes")  # type: ignore[arg-type]
