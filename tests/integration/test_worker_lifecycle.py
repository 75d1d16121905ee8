"""Worker lifecycle edges: cancellation, a crashing claim loop, cron enqueue counts."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from pgfleet import (
    CronJob,
    EnqueueRequest,
    InvalidOptions,
    Queue,
    Worker,
    WorkerConfig,
    WorkerEvents,
    create_pool,
)
from pgfleet.cron.runner import Outcome
from tests.apps import runtime_app
from tests.helpers import Gate
from tests.integration.conftest import FAST, Recorder


async def test_cancelling_run_leaves_no_claim_loop_and_no_running_job(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("long", {"s": 0.02}) for _ in range(400)])
    rec = Recorder()
    worker = Worker(pool, runtime_app.registry, WorkerConfig(concurrency=8, **FAST), events=rec)
    task = asyncio.create_task(worker.run())
    await rec.until(lambda: len(rec.finished) >= 20)  # jobs are flowing
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not [
        t for t in asyncio.all_tasks() if t.get_name() in ("pgfleet-claim", "pgfleet-flush")
    ]
    running = await pool.fetchval(
        "SELECT count(*) FROM pgfleet.jobs WHERE status = 'running' AND locked_by = $1", worker.id
    )
    assert running == 0
    # Everything not finished is back in the queue, with no attempt spent on it and
    # its place in line (run_at) kept.
    leftover = await pool.fetch(
        "SELECT attempt, run_at = created_at AS in_place FROM pgfleet.jobs WHERE status = 'queued'"
    )
    assert leftover and all(r["attempt"] == 0 and r["in_place"] for r in leftover)


class CrashingEvents(WorkerEvents):
    """Hits a bug in the claim loop (an event hook raising) once four jobs run."""

    def __init__(self) -> None:
        self.claimed = 0
        self.crashed = False

    def jobs_claimed(self, count: int) -> None:
        self.claimed += count

    def wakeup(self, source: str) -> None:
        if self.claimed >= 4 and not self.crashed:
            self.crashed = True
            raise RuntimeError("a bug in the claim loop")


async def test_a_crashed_claim_loop_still_drains_running_handlers(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("long", {"s": 0.05}) for _ in range(4)])
    events = CrashingEvents()
    worker = Worker(pool, runtime_app.registry, WorkerConfig(concurrency=4, **FAST), events=events)
    with pytest.raises(RuntimeError, match="a bug in the claim loop"):
        await worker.run()
    rows = await pool.fetch("SELECT status::text, count(*) AS n FROM pgfleet.jobs GROUP BY 1")
    counts = {row["status"]: row["n"] for row in rows}
    assert counts == {"succeeded": 4}  # the handlers finished and their outcomes were written
    assert await queue.workers() == []


async def test_cron_jobs_count_as_enqueued(pool: asyncpg.Pool) -> None:
    cron = CronJob.interval("counted", "record", timedelta(minutes=1))
    worker = Worker(pool, runtime_app.registry, WorkerConfig(**FAST), crons=[cron])
    seen: list[tuple[str, int]] = []
    worker.on_enqueued = lambda name, n: seen.append((name, n))
    service = worker.cron_runner
    assert service is not None
    await service.prepare()
    slot = await pool.fetchval("SELECT date_trunc('minute', now()) + interval '1 minute'")
    assert await service.hand_out("counted", slot) is Outcome.ENQUEUED
    assert seen == [("record", 1)]
    # A second slot absorbed by the still-queued job (same key) creates no job.
    assert await service.hand_out("counted", slot + timedelta(minutes=1)) is Outcome.DEDUPLICATED
    assert seen == [("record", 1)]


async def test_a_worker_started_before_postgres_answers_waits_for_it(
    pool: asyncpg.Pool, database: str
) -> None:
    job_id = await Queue(pool).enqueue("record", {"n": 1})
    gate = Gate(database)
    gated = await asyncpg.create_pool(await gate.start(), min_size=0, max_size=4)
    worker = Worker(gated, runtime_app.registry, WorkerConfig(**FAST))
    task = asyncio.create_task(worker.run(burst=True))
    # The worker keeps retrying while Postgres does not answer (a start-up error
    # would end the task first and fail here).
    refused = asyncio.ensure_future(gate.refusals(2))
    try:
        await asyncio.wait([task, refused], return_when=asyncio.FIRST_COMPLETED)
        assert refused.done() and not task.done(), task.done() and task.exception()
        gate.opened = True
        stats = await task
    finally:
        for pending in (task, refused):
            pending.cancel()
        await gated.close()
        await gate.close()
    assert stats.succeeded == 1
    job = await Queue(pool).get(job_id)
    assert job is not None and job.status.value == "succeeded"


async def test_the_claim_connection_goes_back_to_the_pool_with_default_settings(
    database: str,
) -> None:
    # The claim loop tunes its own session (it walks the runnable index); the pool
    # from create_pool skips asyncpg's reset, so the loop must undo that itself.
    size = 6
    pool = await create_pool(database, min_size=size, max_size=size)
    try:
        await Queue(pool).enqueue_many([EnqueueRequest("record", {"n": i}) for i in range(20)])
        stats = await Worker(pool, runtime_app.registry, WorkerConfig(**FAST)).run(burst=True)
        assert stats.succeeded == 20
        held = [await pool.acquire() for _ in range(size)]  # every connection of the pool
        try:
            for conn in held:
                settings = await conn.fetchrow(
                    "SELECT current_setting('enable_seqscan') AS seqscan, "
                    "current_setting('enable_bitmapscan') AS bitmapscan"
                )
                assert settings is not None
                assert dict(settings) == {"seqscan": "on", "bitmapscan": "on"}
        finally:
            for conn in held:
                await pool.release(conn)
    finally:
        await pool.close()


async def test_a_pool_too_small_for_a_worker_is_refused(database: str) -> None:
    # Two connections would be held by the claim loop and the listener, leaving the
    # heartbeat waiting forever: refuse it up front instead of hanging.
    small = await asyncpg.create_pool(database, min_size=0, max_size=2)
    try:
        with pytest.raises(InvalidOptions, match="at least 3 connections.*max_size=2"):
            Worker(small, runtime_app.registry)
    finally:
        await small.close()


class CancelRunAfterClaim(WorkerEvents):
    """Cancels the worker's run() the moment a claim round took jobs, so that the
    drain cancels handler tasks that have not taken their first step."""

    def __init__(self) -> None:
        self.run_task: asyncio.Task[Any] | None = None
        self.launched_unstarted = 0

    def jobs_claimed(self, count: int) -> None:
        if self.run_task is not None:
            # Requested before the handler tasks exist, so the event loop runs the
            # cancelled run() (and its drain) before those tasks' first steps.
            self.run_task.cancel()
            self.run_task = None
            self.launched_unstarted = count


async def test_jobs_whose_tasks_were_cancelled_before_starting_are_handed_back(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    await Queue(pool).enqueue_many([EnqueueRequest("record", {"n": i}) for i in range(5)])
    config = WorkerConfig(concurrency=5, completion_flush_timeout=5, **FAST)
    events = CancelRunAfterClaim()
    worker = Worker(pool, runtime_app.registry, config, events=events)
    task = asyncio.create_task(worker.run())
    events.run_task = task
    with pytest.raises(asyncio.CancelledError):
        await task
    assert events.launched_unstarted == 5
    assert "could not write" not in caplog.text
    rows = await pool.fetch("SELECT status::text, attempt, locked_by FROM pgfleet.jobs")
    # Never started, so never attempted: all five are queued again, unlocked.
    assert [tuple(r) for r in rows] == [("queued", 0, None)] * 5
    assert worker.stats.aborted == 5
