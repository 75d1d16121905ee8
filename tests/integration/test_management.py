"""Management operations in every state they accept and every state they refuse."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from pgfleet import (
    DuplicateJobKey,
    EnqueueOptions,
    InvalidJobState,
    InvalidOptions,
    Job,
    JobNotFound,
    JobStatus,
    Queue,
)
from tests.helpers import job_count, put_in_state, register_worker

STATES = ["queued", "running", "succeeded", "failed", "cancelled"]
UTC = dt.UTC

Op = Callable[[Queue, uuid.UUID], Awaitable[Job]]

OPERATIONS: dict[str, tuple[Op, set[str]]] = {
    "cancel": (lambda q, i: q.cancel(i), {"queued", "running"}),
    "retry": (lambda q, i: q.retry(i), {"failed", "cancelled"}),
    "reschedule": (lambda q, i: q.reschedule(i, delay=60), {"queued"}),
    "permanently_fail": (
        lambda q, i: q.permanently_fail(i, "operator says no"),
        {"queued", "running"},
    ),
    "complete": (lambda q, i: q.complete(i), {"queued", "running"}),
}


async def _job_in(pool: asyncpg.Pool, state: str, **options: Any) -> tuple[Queue, uuid.UUID]:
    queue = Queue(pool)
    job_id = await queue.enqueue("managed", {"n": 1}, options=EnqueueOptions(**options))
    await put_in_state(pool, job_id, state)
    return queue, job_id


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("operation", list(OPERATIONS))
async def test_operation_in_state(pool: asyncpg.Pool, operation: str, state: str) -> None:
    op, allowed = OPERATIONS[operation]
    queue, job_id = await _job_in(pool, state)
    before = await pool.fetchrow("SELECT * FROM pgfleet.jobs WHERE id = $1", job_id)
    if state in allowed:
        job = await op(queue, job_id)
        assert job.id == job_id
        _check_effect(operation, before, job)
    else:
        with pytest.raises(InvalidJobState) as info:
            await op(queue, job_id)
        assert info.value.status == state
        assert f"cannot {operation} job {job_id}: it is {state}" in str(info.value)
        after = await pool.fetchrow("SELECT * FROM pgfleet.jobs WHERE id = $1", job_id)
        assert after is not None and before is not None
        assert dict(after) == dict(before), "a refused operation must change nothing"


def _check_effect(operation: str, before: Any, job: Job) -> None:
    if operation == "cancel" and before["status"] == "running":
        # Asked of the worker running it: still running until its handler stops.
        assert job.status is JobStatus.RUNNING and job.cancel_requested_at is not None
        assert job.cancelled_by == "application" and job.lock_token == before["lock_token"]
    elif operation == "cancel":
        assert job.status is JobStatus.CANCELLED
        assert job.finished_at is not None
    elif operation == "retry":
        assert job.status is JobStatus.QUEUED
        assert job.attempt == 0
        assert job.finished_at is None
        assert job.last_error is None
    elif operation == "reschedule":
        assert job.status is JobStatus.QUEUED
        assert job.run_at > before["run_at"] + dt.timedelta(seconds=50)
    elif operation in ("permanently_fail", "complete"):
        want = JobStatus.FAILED if operation == "permanently_fail" else JobStatus.SUCCEEDED
        assert job.status is want
        assert job.finished_at is not None
        # The lock of a running job is released, so its handler's outcome is discarded.
        assert job.worker_id is None
        assert job.lock_token is None
        if operation == "permanently_fail":
            assert job.last_error == "operator says no"


@pytest.mark.parametrize("operation", list(OPERATIONS))
async def test_operations_on_unknown_ids(pool: asyncpg.Pool, operation: str) -> None:
    op, _ = OPERATIONS[operation]
    queue = Queue(pool)
    with pytest.raises(JobNotFound, match="no job with id"):
        await op(queue, uuid.uuid4())
    with pytest.raises(JobNotFound, match="no job with id not-a-uuid"):
        await op(queue, "not-a-uuid")  # type: ignore[arg-type]


async def test_operations_accept_string_ids(pool: asyncpg.Pool) -> None:
    queue, job_id = await _job_in(pool, "queued")
    job = await queue.cancel(str(job_id))
    assert job.status is JobStatus.CANCELLED


async def test_complete_of_a_running_named_queue_job_frees_the_queue(pool: asyncpg.Pool) -> None:
    queue, first = await _job_in(pool, "running", queue_name="serial")
    second = await queue.enqueue("managed", {}, options=EnqueueOptions(queue_name="serial"))
    # While first runs, the claim takes nothing of that queue (0009: the claim keeps
    # the rule, no longer a unique index).
    claim = "SELECT id FROM pgfleet.claim_flow(gen_random_uuid(), '{managed}', NULL, 4, 4)"
    assert await pool.fetch(claim) == []
    await queue.complete(first)
    assert [r["id"] for r in await pool.fetch(claim)] == [second]


async def test_retry_refuses_when_another_job_holds_the_key(pool: asyncpg.Pool) -> None:
    queue, failed = await _job_in(pool, "failed", job_key="k")
    await queue.enqueue("managed", {}, options=EnqueueOptions(job_key="k"))
    with pytest.raises(
        DuplicateJobKey, match="job_key 'k' is held by another queued or running job"
    ):
        await queue.retry(failed)
    job = await queue.get(failed)
    assert job is not None
    assert job.status is JobStatus.FAILED


async def test_reschedule_to_a_time_or_now(pool: asyncpg.Pool) -> None:
    queue, job_id = await _job_in(pool, "queued", delay=3600)
    at = dt.datetime(2031, 6, 1, tzinfo=UTC)
    assert (await queue.reschedule(job_id, run_at=at)).run_at == at
    now_job = await queue.reschedule(job_id)
    assert now_job.run_at <= await pool.fetchval("SELECT now()")
    with pytest.raises(InvalidOptions, match="timezone-aware"):
        await queue.reschedule(job_id, run_at=dt.datetime(2031, 6, 1))


async def test_get_and_recent(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    assert await queue.get(uuid.uuid4()) is None
    assert await queue.get("garbage") is None
    ids = [await queue.enqueue("a" if i % 2 else "b", {"i": i}) for i in range(6)]
    await put_in_state(pool, ids[0], "failed")
    recent = await queue.recent(4)
    assert [j.id for j in recent] == list(reversed(ids))[:4]
    assert [j.id for j in await queue.recent(name="a")] == [ids[5], ids[3], ids[1]]
    assert [j.id for j in await queue.recent(status="failed")] == [ids[0]]
    assert [j.id for j in await queue.recent(status=JobStatus.QUEUED, name="b")] == [ids[4], ids[2]]
    with pytest.raises(InvalidOptions, match="unknown job status 'dead'"):
        await queue.recent(status="dead")
    with pytest.raises(InvalidOptions, match="limit must be an integer from 1 to 10000"):
        await queue.recent(0)


async def test_counts_are_exact_per_status(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    assert await queue.counts() == dict.fromkeys(JobStatus, 0)
    for state, n in {
        "queued": 3,
        "running": 2,
        "succeeded": 4,
        "failed": 1,
        "cancelled": 2,
    }.items():
        for _ in range(n):
            job_id = await queue.enqueue("c", {})
            await put_in_state(pool, job_id, state)
    assert await queue.counts() == {
        JobStatus.QUEUED: 3,
        JobStatus.RUNNING: 2,
        JobStatus.SUCCEEDED: 4,
        JobStatus.FAILED: 1,
        JobStatus.CANCELLED: 2,
        JobStatus.WAITING: 0,
    }
    assert await queue.runnable_backlog() == 3
    assert await queue.runnable_backlog("other") == 0


async def test_prune_finished_deletes_only_old_finished_jobs(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    keep: list[uuid.UUID] = []
    for state in STATES:
        for age, survives in ((7200.0, state in ("queued", "running")), (10.0, True)):
            for _ in range(3):
                job_id = await queue.enqueue("p", {})
                await put_in_state(pool, job_id, state, finished_ago_s=age)
                if survives:
                    keep.append(job_id)
    deleted = await queue.prune_finished(dt.timedelta(hours=1), batch_size=2)
    assert deleted == 9  # 3 old jobs in each of the three finished states
    remaining = {r["id"] for r in await pool.fetch("SELECT id FROM pgfleet.jobs")}
    assert remaining == set(keep)
    assert await queue.prune_finished(3600) == 0
    with pytest.raises(InvalidOptions, match="older_than must be a non-negative duration"):
        await queue.prune_finished(-1)
    with pytest.raises(InvalidOptions, match="batch_size"):
        await queue.prune_finished(1, batch_size=0)


async def test_workers_lists_live_and_stale_registrations(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    live, stale = uuid.uuid4(), uuid.uuid4()
    await register_worker(pool, live)
    await register_worker(pool, stale, alive=False)
    job_id = await queue.enqueue("w", {})
    await put_in_state(pool, job_id, "running", worker_id=live)
    workers = {w.id: w for w in await queue.workers()}
    assert set(workers) == {live, stale}
    assert workers[live].alive
    assert not workers[stale].alive
    assert workers[live].running_jobs == 1
    assert workers[stale].running_jobs == 0
    assert workers[live].job_names == ("x",)
    assert workers[live].pid == 4242
    assert not workers[live].is_leader


async def test_force_unlock_worker_requeues_and_buries_and_deregisters(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    gone, other = uuid.uuid4(), uuid.uuid4()
    await register_worker(pool, gone)
    await register_worker(pool, other)
    retryable = await queue.enqueue("w", {}, options=EnqueueOptions(max_attempts=3))
    exhausted = await queue.enqueue("w", {}, options=EnqueueOptions(max_attempts=2))
    untouched = await queue.enqueue("w", {})
    await put_in_state(pool, retryable, "running", worker_id=gone, attempt=1)
    await put_in_state(pool, exhausted, "running", worker_id=gone, attempt=2)
    await put_in_state(pool, untouched, "running", worker_id=other)
    before_other = await pool.fetchrow("SELECT * FROM pgfleet.jobs WHERE id = $1", untouched)

    result = await queue.force_unlock_worker(gone)

    assert result == {"requeued": 1, "failed": 1, "deregistered": 1}
    r = await queue.get(retryable)
    e = await queue.get(exhausted)
    assert r is not None
    assert r.status is JobStatus.QUEUED
    assert r.worker_id is None
    assert r.attempt == 1
    assert r.last_error is not None
    assert "force-unlocked" in r.last_error
    assert e is not None
    assert e.status is JobStatus.FAILED
    assert e.finished_at is not None
    after_other = await pool.fetchrow("SELECT * FROM pgfleet.jobs WHERE id = $1", untouched)
    assert after_other is not None and before_other is not None
    assert dict(after_other) == dict(before_other)
    assert [w.id for w in await queue.workers()] == [other]
    # A second call finds nothing to do.
    assert await queue.force_unlock_worker(gone) == {"requeued": 0, "failed": 0, "deregistered": 0}
    with pytest.raises(InvalidOptions, match="worker id must be a UUID"):
        await queue.force_unlock_worker("nope")


async def test_permanently_fail_needs_a_reason(pool: asyncpg.Pool) -> None:
    queue, job_id = await _job_in(pool, "queued")
    with pytest.raises(InvalidOptions, match="reason must be a non-empty string"):
        await queue.permanently_fail(job_id, "")
    assert await job_count(pool) == 1
