"""Flow control across real `pgfleet worker` processes: the limits hold for the
whole fleet, measured from outside the workers (handlers write their entry and
exit to ``public.executions``; attempt starts are the jobs' ``started_at``)."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, Queue
from tests.apps import runtime_app
from tests.procs import eventually, processes, start_worker

pytestmark = pytest.mark.slow

LIVENESS = ("--heartbeat-interval", "0.5", "--dead-worker-timeout", "2", "--poll-interval", "0.2")

#: The most executions of a name (and of a key, when given) in progress at once,
#: from the handlers' entry and exit times.
PEAK = """
SELECT COALESCE(max(n), 0) FROM (
    SELECT (SELECT count(*) FROM public.executions e2 JOIN pgfleet.jobs j2 ON j2.id = e2.job_id
            WHERE e2.name = $1 AND e2.started_at <= e1.started_at
              AND (e2.finished_at IS NULL OR e2.finished_at > e1.started_at)
              AND ($2::boolean IS false OR j2.limit_key IS NOT DISTINCT FROM j1.limit_key)) AS n
    FROM public.executions e1 JOIN pgfleet.jobs j1 ON j1.id = e1.job_id
    WHERE e1.name = $1
) peaks
"""


async def _done(pool: asyncpg.Pool, name: str, want: int) -> bool:
    n = await pool.fetchval(
        "SELECT count(*) FROM pgfleet.jobs WHERE name = $1 AND status = 'succeeded'", name
    )
    return int(n) == want


async def _fleet(database: str, tmp_path: Path, n: int = 3) -> list[object]:
    return [
        await start_worker(database, tmp_path, "--concurrency", "16", *LIVENESS, name=f"w{i}")
        for i in range(n)
    ]


async def test_a_concurrency_limit_of_five_holds_across_three_processes_of_16_slots(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    await queue.set_limits("serial", concurrency=5)
    await queue.enqueue_many([EnqueueRequest("serial", {"ms": 40}) for _ in range(150)])
    workers = await _fleet(database, tmp_path)
    async with processes(*workers):  # type: ignore[arg-type]
        await eventually(lambda: _done(pool, "serial", 150), timeout=180, what="150 jobs")
    assert await pool.fetchval(PEAK, "serial", False) == 5
    pids = await pool.fetchval("SELECT count(DISTINCT pid) FROM public.executions")
    assert pids >= 2  # the limit was shared, not one process's


async def test_a_rate_of_50_per_second_holds_in_every_window_and_over_the_run(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    await queue.set_limits("record", rate=50, per=1)
    total = 300
    await queue.enqueue_many([EnqueueRequest("record", {"i": i}) for i in range(total)])
    workers = await _fleet(database, tmp_path)
    async with processes(*workers):  # type: ignore[arg-type]
        await eventually(lambda: _done(pool, "record", total), timeout=180, what="300 jobs")
    # Every window of one second that opens at an attempt start holds at most 50.
    busiest = await pool.fetchval(
        """SELECT max((SELECT count(*) FROM pgfleet.jobs j2 WHERE j2.name = 'record'
                        AND j2.started_at >= j1.started_at
                        AND j2.started_at < j1.started_at + interval '1 second'))
           FROM pgfleet.jobs j1 WHERE j1.name = 'record'"""
    )
    assert busiest == 50
    # The long-run rate: past the first window, each start waits for the start 50
    # before it to leave the window; 50 per the mean of those waits.
    mean_wait = await pool.fetchval(
        """SELECT avg(w)::float8 FROM (
               SELECT extract(epoch FROM started_at
                              - lag(started_at, 50) OVER (ORDER BY started_at)) AS w
               FROM pgfleet.jobs WHERE name = 'record') waits"""
    )
    assert 45 <= 50 / mean_wait <= 55, mean_wait


async def test_a_per_key_concurrency_limit_holds_for_each_key_across_processes(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    await queue.set_limits("serial", concurrency=2, per_key=True)
    for key in ("a", "b", "c", "d"):
        await queue.enqueue_many(
            [EnqueueRequest("serial", {"ms": 40}, EnqueueOptions(limit_key=key)) for _ in range(25)]
        )
    workers = await _fleet(database, tmp_path)
    async with processes(*workers):  # type: ignore[arg-type]
        await eventually(lambda: _done(pool, "serial", 100), timeout=180, what="100 jobs")
    assert await pool.fetchval(PEAK, "serial", True) == 2
    assert await pool.fetchval(PEAK, "serial", False) >= 5  # keys ran side by side


async def test_a_concurrency_limit_holds_while_workers_are_killed_and_nothing_is_lost(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    """SIGKILL a worker four times mid-drain (restarted at once, as a process manager
    would): the jobs its handlers held stay counted until the rescue gives them
    back, so the running count sampled from outside never passes the limit."""
    import asyncio
    import signal

    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    await queue.set_limits("serial", concurrency=5)
    total = 120
    await queue.enqueue_many(
        [EnqueueRequest("serial", {"ms": 60}, EnqueueOptions(max_attempts=25))] * total
    )
    workers = await _fleet(database, tmp_path)
    peak = 0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            n = await pool.fetchval(
                "SELECT count(*) FROM pgfleet.jobs WHERE name = 'serial' AND status = 'running'"
            )
            peak = max(peak, int(n))
            await asyncio.sleep(0.02)  # sampling pace, not synchronisation

    sampler = asyncio.create_task(sample())
    try:
        async with processes(*workers):  # type: ignore[arg-type]
            for _ in range(4):
                index = await eventually(
                    lambda: _holder(pool, workers), timeout=60, what="a worker holding a job"
                )
                victim = workers[index - 1]
                victim.signal(signal.SIGKILL)  # type: ignore[attr-defined]
                await victim.process.wait()  # type: ignore[attr-defined]
                workers[index - 1] = await start_worker(
                    database, tmp_path, "--concurrency", "16", *LIVENESS, name="again"
                )
            async with processes(*workers):  # type: ignore[arg-type]
                await eventually(lambda: _done(pool, "serial", total), timeout=240, what="120 jobs")
    finally:
        done.set()
        await sampler
    assert peak <= 5, peak
    lost = await pool.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE status <> 'succeeded'")
    assert lost == 0


async def _holder(pool: asyncpg.Pool, workers: list[object]) -> int:
    """1 + the index of a worker process holding a running job (0: none)."""
    pids = await pool.fetch(
        "SELECT DISTINCT w.pid FROM pgfleet.jobs j JOIN pgfleet.workers w ON w.id = j.locked_by "
        "WHERE j.status = 'running'"
    )
    held = {r["pid"] for r in pids}
    for index, worker in enumerate(workers):
        if worker.pid in held and worker.process.returncode is None:  # type: ignore[attr-defined]
            return index + 1
    return 0
