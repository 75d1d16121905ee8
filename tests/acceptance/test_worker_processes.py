"""Real `pgfleet worker` processes against a real Postgres: exactly-once, crashes,
named queues across processes, graceful shutdown, the supervisor."""

from __future__ import annotations

import itertools
import os
import re
import signal
from collections.abc import Awaitable
from pathlib import Path

import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, JobStatus, Queue
from tests.apps import runtime_app
from tests.helpers import Gate
from tests.procs import eventually, processes, start_worker
from tests.procs import processes as processes_guard

pytestmark = pytest.mark.slow

LIVENESS = ("--heartbeat-interval", "0.5", "--dead-worker-timeout", "2", "--poll-interval", "0.2")


async def count(pool: asyncpg.Pool, sql: str, *args: object) -> int:
    return int(await pool.fetchval(sql, *args))


async def succeeded(pool: asyncpg.Pool) -> int:
    return await count(pool, "SELECT count(*) FROM pgfleet.jobs WHERE status = 'succeeded'")


async def test_three_processes_run_every_job_exactly_once(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    ids: list[object] = []
    for start_at in range(0, 5000, 1000):
        ids += await queue.enqueue_many(
            [EnqueueRequest("record", {"i": start_at + i}) for i in range(1000)]
        )
    workers = [
        await start_worker(database, tmp_path, "--concurrency", "16", *LIVENESS) for _ in range(3)
    ]
    async with processes(*workers):
        await eventually(
            lambda: _equals(succeeded(pool), 5000), timeout=180, what="5000 jobs to succeed"
        )
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    rows = await pool.fetch("SELECT job_id, pid FROM public.executions")
    assert len(rows) == 5000  # each job ran once: no duplicate executions
    assert {r["job_id"] for r in rows} == set(ids)
    assert len({r["pid"] for r in rows}) == 3  # all three processes took part
    assert await queue.counts() == {
        JobStatus.QUEUED: 0,
        JobStatus.RUNNING: 0,
        JobStatus.SUCCEEDED: 5000,
        JobStatus.FAILED: 0,
        JobStatus.CANCELLED: 0,
        JobStatus.WAITING: 0,
    }


async def _equals(value: Awaitable[int], want: int) -> bool:
    return await value == want


async def test_sigkill_mid_job_is_recovered_by_another_worker(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    job_id = await queue.enqueue("long", {"s": 1.5}, options=EnqueueOptions(max_attempts=3))
    first = await start_worker(database, tmp_path, *LIVENESS, name="first")
    second = None
    async with processes(first):
        await eventually(
            lambda: count(pool, "SELECT count(*) FROM public.executions WHERE job_id = $1", job_id),
            what="the first attempt to start",
        )
        assert await first.stop(signal.SIGKILL) == -signal.SIGKILL
        second = await start_worker(database, tmp_path, *LIVENESS, name="second")
        async with processes(second):
            await eventually(lambda: succeeded(pool), timeout=60, what="the job to be recovered")
            assert await second.stop() == 0
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.attempt == 2
    runs = await pool.fetch(
        "SELECT attempt, pid, finished_at FROM public.executions WHERE job_id = $1 ORDER BY seq",
        job_id,
    )
    assert [r["attempt"] for r in runs] == [1, 2]
    assert runs[0]["pid"] == first.pid and runs[0]["finished_at"] is None
    assert runs[1]["pid"] == second.pid and runs[1]["finished_at"] is not None
    assert "recovered job" in second.output()


async def test_a_job_that_kills_its_worker_every_time_is_buried(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    """Also: the supervisor restarts children killed by SIGKILL and the fleet
    recovers what they held."""
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    poison = await queue.enqueue("kill_worker", None, options=EnqueueOptions(max_attempts=2))
    supervisor = await start_worker(
        database, tmp_path, "--processes", "2", *LIVENESS, name="supervisor"
    )
    async with processes(supervisor):

        async def buried() -> bool:
            job = await queue.get(poison)
            return job is not None and job.status is JobStatus.FAILED

        await eventually(buried, timeout=90, what="the poison job to be buried")
        # The fleet still works after losing two processes to the poison job.
        healthy = await queue.enqueue("record", {})
        await eventually(
            lambda: _status_is(queue, healthy, JobStatus.SUCCEEDED), what="a healthy job to run"
        )
        assert await supervisor.stop() == 0
    job = await queue.get(poison)
    assert job is not None and job.attempt == 2
    assert job.last_error is not None and "stopped heartbeating" in job.last_error
    assert (
        await count(pool, "SELECT count(*) FROM public.executions WHERE job_id = $1", poison) == 2
    )
    log = supervisor.output()
    assert log.count("died with signal SIGKILL; restarting") >= 2
    assert await count(pool, "SELECT count(*) FROM pgfleet.jobs WHERE status = 'running'") == 0


async def _status_is(queue: Queue, job_id: object, status: JobStatus) -> bool:
    job = await queue.get(job_id)  # type: ignore[arg-type]
    return job is not None and job.status is status


async def test_named_queue_is_serial_across_three_processes(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    ids = [
        await queue.enqueue("serial", {"ms": 3}, options=EnqueueOptions(queue_name="ledger"))
        for _ in range(50)
    ]
    workers = [
        await start_worker(database, tmp_path, "--concurrency", "4", *LIVENESS) for _ in range(3)
    ]
    async with processes(*workers):
        await eventually(lambda: _equals(succeeded(pool), 50), timeout=120, what="50 serial jobs")
        assert [await w.stop() for w in workers] == [0, 0, 0]
    rows = await pool.fetch(
        "SELECT job_id, pid, started_at, finished_at FROM public.executions ORDER BY started_at"
    )
    assert [r["job_id"] for r in rows] == ids  # in enqueue order
    for before, after in itertools.pairwise(rows):
        assert before["finished_at"] <= after["started_at"]  # never two at once
    assert len({r["pid"] for r in rows}) >= 2


async def test_sigterm_lets_short_jobs_finish_and_requeues_long_ones(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    short = await queue.enqueue("long", {"s": 0.3})
    long = await queue.enqueue("long", {"s": 600})
    worker = await start_worker(database, tmp_path, "--shutdown-grace-period", "1.5", *LIVENESS)
    async with processes(worker):
        await eventually(
            lambda: _equals(count(pool, "SELECT count(*) FROM public.executions"), 2),
            what="both jobs to start",
        )
        assert await worker.stop(signal.SIGTERM) == 0
    short_job, long_job = await queue.get(short), await queue.get(long)
    assert short_job is not None and short_job.status is JobStatus.SUCCEEDED
    assert long_job is not None and long_job.status is JobStatus.QUEUED
    assert long_job.attempt == 0 and long_job.worker_id is None
    assert await count(pool, "SELECT count(*) FROM pgfleet.jobs WHERE status = 'running'") == 0
    assert await count(pool, "SELECT count(*) FROM pgfleet.workers") == 0
    log = worker.output()
    assert "draining" in log and "requeued" in log


async def test_supervisor_restarts_a_killed_child_and_drains_on_sigterm(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    supervisor = await start_worker(
        database, tmp_path, "--processes", "2", *LIVENESS, name="supervisor"
    )
    async with processes(supervisor):
        await eventually(
            lambda: _equals(count(pool, "SELECT count(*) FROM pgfleet.workers"), 2),
            what="two registered children",
        )
        job_id = await queue.enqueue("long", {"s": 1.0})
        holder = await eventually(
            lambda: pool.fetchval(
                "SELECT w.pid FROM pgfleet.jobs j JOIN pgfleet.workers w ON w.id = j.locked_by "
                "WHERE j.id = $1",
                job_id,
            ),
            what="a child to claim the job",
        )
        import os

        os.kill(holder, signal.SIGKILL)
        await eventually(
            lambda: _status_is(queue, job_id, JobStatus.SUCCEEDED),
            timeout=60,
            what="the killed child's job to be recovered",
        )
        await eventually(
            lambda: _equals(
                count(pool, "SELECT count(*) FROM pgfleet.workers WHERE expires_at > now()"), 2
            ),
            what="the child to be back",
        )
        pids = {r["pid"] for r in await pool.fetch("SELECT pid FROM pgfleet.workers")}
        assert holder not in pids
        assert await supervisor.stop(signal.SIGTERM) == 0
    job = await queue.get(job_id)
    assert job is not None and job.attempt == 2
    assert "restarting" in supervisor.output()
    assert await count(pool, "SELECT count(*) FROM pgfleet.workers") == 0


@pytest.mark.parametrize("processes", ["1", "2"])
async def test_sigterm_while_starting_is_a_clean_stop(
    database: str, tmp_path: Path, processes: str
) -> None:
    proc = await start_worker(database, tmp_path, "--processes", processes, name="early")
    async with processes_guard(proc):
        # At once: the process is most likely still importing. It may die from the
        # signal before Python runs any of its code (nothing started, nothing to
        # drain); once its code runs, the stop is a drain that exits 0 (and a
        # supervisor counts a child killed while starting as a clean stop).
        code = await proc.stop(signal.SIGTERM)
    assert code in (0, -signal.SIGTERM), proc.output()[-2000:]
    assert "Traceback" not in proc.output()


async def test_supervised_children_do_not_show_the_dsn(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    secret_dsn = database.replace("postgres@", "postgres:not-a-real-secret@")
    supervisor = await start_worker(secret_dsn, tmp_path, "--processes", "2", name="supervisor")
    async with processes_guard(supervisor):
        pids = await eventually(
            lambda: pool.fetch("SELECT pid FROM pgfleet.workers"), what="children to register"
        )
        for row in pids:
            cmdline = Path(f"/proc/{row['pid']}/cmdline").read_bytes()
            assert b"not-a-real-secret" not in cmdline
            assert b"--dsn" not in cmdline
        assert await supervisor.stop() == 0


async def test_a_worker_process_started_before_postgres_answers_waits_for_it(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    job_id = await Queue(pool).enqueue("record", {"i": 1})
    gate = Gate(database)
    worker = await start_worker(await gate.start(), tmp_path, *LIVENESS)
    try:
        async with processes(worker):

            async def refused_twice() -> bool:  # it retries instead of exiting
                if worker.process.returncode is not None:
                    pytest.fail(f"the worker exited:\n{worker.output()[-3000:]}")
                return gate.refused >= 2

            await eventually(refused_twice, what="two refused connection attempts")
            gate.opened = True
            await eventually(lambda: _equals(succeeded(pool), 1), what="the job to succeed")
            assert await worker.stop() == 0
    finally:
        await gate.close()
    assert "database unavailable at worker start" in worker.output()
    job = await Queue(pool).get(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED


async def test_worker_processes_end_when_their_supervisor_is_killed(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    """SIGKILL gives the supervisor no chance to stop its children: the kernel does
    (die-with-parent), and they shut down cleanly, deregistering."""
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    supervisor = await start_worker(
        database, tmp_path, "--processes", "2", *LIVENESS, name="supervisor"
    )
    async with processes(supervisor):

        async def two_registered() -> bool:
            return len(await queue.workers()) == 2

        await eventually(two_registered, what="two worker processes to register")
        pids = [int(p) for p in re.findall(r"started \(pid (\d+)\)", supervisor.output())]
        assert len(pids) == 2
        assert await supervisor.stop(signal.SIGKILL) == -signal.SIGKILL

        def alive(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            # A zombie (exited, not yet reaped by init) counts as gone.
            stat = Path(f"/proc/{pid}/stat")
            return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"

        async def children_gone() -> bool:
            return not any(alive(pid) for pid in pids)

        await eventually(children_gone, what="the orphaned worker processes to end")

        async def deregistered() -> bool:
            return await queue.workers() == []

        await eventually(deregistered, what="the worker processes to deregister")
