"""Prefetch: jobs claimed ahead of free slots, held in memory, and what the
database knows about them (a rescue or force-unlock never counts an attempt that
never started)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg

from pgfleet import EnqueueOptions, EnqueueRequest, Job, Queue, Registry, Worker, WorkerConfig
from pgfleet.db.store import Store
from tests.apps import runtime_app
from tests.integration.conftest import FAST, Recorder, running_worker


class ClaimCounter(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.claims: list[int] = []
        #: Jobs claimed and not finished, each time a round's claims are reported.
        self.outstanding: list[int] = []

    def jobs_claimed(self, count: int) -> None:
        self.claims.append(count)
        self.outstanding.append(sum(self.claims) - len(self.finished))
        self._changed.set()


async def _claim(
    pool: asyncpg.Pool,
    worker_id: uuid.UUID,
    *,
    limit: int = 0,
    start: int = 0,
    started: list[uuid.UUID] | None = None,
) -> list[Any]:
    """One claim round of a worker that is not running (nothing else claims)."""
    async with pool.acquire() as conn:
        return await Store(conn).job_complete_and_claim(
            ids=[],
            tokens=[],
            actions=[],
            delays=[],
            errors=[],
            ran=[],
            results=[],
            worker_id=worker_id,
            job_names=["record"],
            queue_names=None,
            limit=limit,
            start=start,
            started=started or [],
        )


async def _rows(pool: asyncpg.Pool, ids: list[uuid.UUID]) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT status::text, attempt, started_at IS NOT NULL AS started, "
        "run_at = created_at AS in_place FROM pgfleet.jobs WHERE id = ANY($1) "
        "ORDER BY array_position($1, id)",
        ids,
    )
    return [tuple(r) for r in rows]


async def _wait_for(pool: asyncpg.Pool, sql: str, *args: Any) -> None:
    """Until the query returns true (a round the test cannot observe otherwise)."""
    async with asyncio.timeout(60):
        while not await pool.fetchval(sql, *args):
            await asyncio.sleep(0.02)


# ------------------------------------------------------------------ what the database knows


async def test_held_jobs_are_claimed_unstarted_and_marked_when_they_start(
    pool: asyncpg.Pool,
) -> None:
    ids = await Queue(pool).enqueue_many([EnqueueRequest("record", {"n": i}) for i in range(3)])
    dead = uuid.uuid4()
    rows = await _claim(pool, dead, limit=3, start=1)
    claimed = {r["id"]: r["held"] for r in rows if r["claimed"]}
    assert claimed == {ids[0]: False, ids[1]: True, ids[2]: True}  # the first in line starts
    assert (
        await _rows(pool, ids) == [("running", 1, True, True)] + [("running", 1, False, True)] * 2
    )
    await _claim(pool, dead, started=[ids[1]])  # the worker started one of its held jobs
    assert [r[2] for r in await _rows(pool, ids)] == [True, True, False]
    # Another worker's mark changes nothing.
    await _claim(pool, uuid.uuid4(), started=[ids[2]])
    assert [r[2] for r in await _rows(pool, ids)] == [True, True, False]


async def test_a_rescue_never_counts_an_attempt_that_never_started(pool: asyncpg.Pool) -> None:
    # Single-attempt jobs: a counted attempt buries them.
    once = EnqueueOptions(max_attempts=1)
    ids = await Queue(pool).enqueue_many(
        [EnqueueRequest("record", {"n": i}, once) for i in range(3)]
    )
    dead = uuid.uuid4()  # never registered: its jobs are orphaned at once
    await _claim(pool, dead, limit=3, start=1)
    await _claim(pool, dead, started=[ids[1]])
    rescued = await Store(pool).job_rescue(limit=100)
    assert {r.job_id: r.status for r in rescued if r.job_id} == {
        ids[0]: "failed",  # started: its one attempt is spent
        ids[1]: "failed",  # started from the hold and marked: the same
        ids[2]: "queued",  # held, never started: back in line, nothing spent
    }
    assert (await _rows(pool, ids[2:])) == [("queued", 0, False, True)]
    error = await pool.fetchval("SELECT last_error FROM pgfleet.jobs WHERE id = $1", ids[2])
    assert error.startswith(f"held unstarted by worker {dead}")

    # Held again by a worker that dies: now it counts, so that a job that kills its
    # worker as soon as it leaves the hold (before any round marks it) still ends.
    await _claim(pool, dead, limit=1, start=0)
    [again] = await Store(pool).job_rescue(limit=100)
    assert (again.job_id, again.status) == (ids[2], "failed")


async def test_held_jobs_are_not_counted_as_running(pool: asyncpg.Pool) -> None:
    await Queue(pool).enqueue_many([EnqueueRequest("record", {"n": i}) for i in range(4)])
    await _claim(pool, uuid.uuid4(), limit=3, start=1)
    [stats] = await Store(pool).queue_stats()
    # One runs, two are held (neither queued nor running), one waits.
    assert (stats.running, stats.queued) == (1, 1)


async def test_force_unlock_requeues_held_jobs_without_counting_them(pool: asyncpg.Pool) -> None:
    once = EnqueueOptions(max_attempts=1)
    ids = await Queue(pool).enqueue_many(
        [EnqueueRequest("record", {"n": i}, once) for i in range(2)]
    )
    gone = uuid.uuid4()
    await _claim(pool, gone, limit=2, start=1)
    result = await Store(pool).worker_force_unlock(worker_id=gone)
    assert (result.requeued, result.failed) == (1, 1)
    assert await _rows(pool, ids) == [("failed", 1, True, False), ("queued", 0, False, True)]


# ------------------------------------------------------------------ the worker


async def test_a_worker_claims_ahead_and_runs_every_job_once(pool: asyncpg.Pool) -> None:
    ids = await Queue(pool).enqueue_many([EnqueueRequest("record", {"n": i}) for i in range(200)])
    rec = ClaimCounter()
    config = WorkerConfig(concurrency=2, prefetch=16, **FAST)
    async with running_worker(pool, runtime_app.registry, config, rec) as (_worker, task):
        await rec.until(lambda: len(rec.finished) == 200)
    stats = task.result()
    assert (stats.succeeded, stats.claimed, stats.released) == (200, 200, 0)
    # Rounds claimed more than the two slots, never more than slots + prefetch;
    # nor did rounds sent before the previous one's jobs were launched pile up
    # more than that between them.
    assert max(rec.claims) > 2
    assert max(rec.claims) <= 2 + 16
    assert max(rec.outstanding) <= 2 + 16
    runs = await pool.fetch("SELECT job_id, count(*) AS n FROM public.executions GROUP BY job_id")
    assert sorted(r["job_id"] for r in runs) == sorted(ids)
    assert all(r["n"] == 1 for r in runs)
    # Every job that ran was marked started (by its claim or a later round).
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE started_at IS NULL") == 0


async def test_without_prefetch_a_round_claims_no_more_than_the_free_slots(
    pool: asyncpg.Pool,
) -> None:
    await Queue(pool).enqueue_many([EnqueueRequest("record", {"n": i}) for i in range(40)])
    rec = ClaimCounter()
    config = WorkerConfig(concurrency=2, prefetch=0, **FAST)
    async with running_worker(pool, runtime_app.registry, config, rec):
        await rec.until(lambda: len(rec.finished) == 40)
    assert max(rec.claims) <= 2


#: Prefetch that holds up to 16 jobs whatever the handlers' pace (a long window):
#: once the first job has finished, the next round claims everything in line.
HOLD_ALL: dict[str, Any] = {"prefetch": 16, "prefetch_window": 600, **FAST}


def _quick_then_long(quick: int, after: int) -> list[EnqueueRequest]:
    """``quick`` fast jobs (they set the pace that prefetch goes by), a long one,
    then ``after`` more fast jobs: all in line behind the long one."""
    return (
        [EnqueueRequest("record", {"n": i}) for i in range(quick)]
        + [EnqueueRequest("long", {"s": 120, "polite": True})]
        + [EnqueueRequest("record", {"n": quick + i}) for i in range(after)]
    )


async def test_a_held_job_that_starts_is_marked_started_while_it_runs(
    pool: asyncpg.Pool,
) -> None:
    ids = await Queue(pool).enqueue_many(_quick_then_long(4, 0))
    long_id = ids[4]
    rec = ClaimCounter()
    config = WorkerConfig(concurrency=1, shutdown_grace_period=0.1, **HOLD_ALL)
    async with running_worker(pool, runtime_app.registry, config, rec) as (_worker, task):
        await rec.until(lambda: any(job.id == long_id for job in rec.started))
        # Claimed ahead (a round took more than the one slot) ...
        assert max(rec.claims) > 1
        # ... and marked by a later round, so a crash from here on counts the attempt.
        await _wait_for(
            pool, "SELECT started_at IS NOT NULL FROM pgfleet.jobs WHERE id = $1", long_id
        )
    stats = task.result()
    assert stats.succeeded == 5  # the long one ends politely at shutdown


async def test_held_jobs_go_back_when_the_slots_stay_busy_and_another_worker_runs_them(
    pool: asyncpg.Pool,
) -> None:
    ids = await Queue(pool).enqueue_many(_quick_then_long(6, 5))
    long_id, behind = ids[6], ids[7:]
    busy, other = ClaimCounter(), ClaimCounter()
    config = WorkerConfig(concurrency=1, shutdown_grace_period=0.1, **HOLD_ALL)
    async with running_worker(pool, runtime_app.registry, config, busy) as (_, task):
        await busy.until(lambda: any(job.id == long_id for job in busy.started))
        assert sum(busy.claims) == len(ids)  # the jobs behind the long one: held
        async with running_worker(pool, runtime_app.registry, config, other) as (second, _):
            await other.until(lambda: {job.id for job, _ in other.finished} >= set(behind))
    stats = task.result()
    # The busy worker handed back what it held, unstarted; the other one ran it,
    # as a first attempt.
    assert stats.released == len(behind)
    assert stats.succeeded == 7  # the long one ends politely at shutdown
    runs = await pool.fetch(
        "SELECT job_id, attempt, worker_id FROM public.executions WHERE job_id = ANY($1)", behind
    )
    assert sorted(r["job_id"] for r in runs) == sorted(behind)
    assert {(r["attempt"], r["worker_id"]) for r in runs} == {(1, second.id)}


async def test_the_drain_hands_back_held_jobs_unstarted(pool: asyncpg.Pool) -> None:
    ids = await Queue(pool).enqueue_many(_quick_then_long(6, 5))
    long_id, behind = ids[6], ids[7:]
    rec = ClaimCounter()
    config = WorkerConfig(concurrency=1, shutdown_grace_period=0.1, **HOLD_ALL)
    async with running_worker(pool, runtime_app.registry, config, rec):
        await rec.until(lambda: any(job.id == long_id for job in rec.started))
        assert sum(rec.claims) == len(ids)
    # Stopped within the hold time: what it held goes back in line in place,
    # nothing spent, never started.
    assert {job.id for job in rec.started}.isdisjoint(behind)
    assert await _rows(pool, behind) == [("queued", 0, False, True)] * len(behind)


async def test_jobs_that_start_and_finish_between_rounds_still_record_their_start(
    pool: asyncpg.Pool,
) -> None:
    # No-op handlers finish long before the next round could mark them started:
    # their outcome carries the start instead.
    registry = Registry()

    @registry.job("noop")
    async def noop(job: Job) -> None:
        return None

    await Queue(pool).enqueue_many([EnqueueRequest("noop") for _ in range(300)])
    stats = await Worker(pool, registry, WorkerConfig(concurrency=1, **HOLD_ALL)).run(burst=True)
    assert stats.succeeded == 300
    row = await pool.fetchrow(
        "SELECT count(*) FILTER (WHERE started_at IS NULL) AS unknown, "
        "count(*) FILTER (WHERE started_at < run_at OR started_at > finished_at) AS wrong "
        "FROM pgfleet.jobs"
    )
    assert row is not None and (row["unknown"], row["wrong"]) == (0, 0)
