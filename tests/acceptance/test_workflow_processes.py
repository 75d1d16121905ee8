"""Workflows run by real `pgfleet worker` processes: a batch's fan-in of 10,000
jobs on 3 processes x 16 slots with its callback run once, and diamonds whose
parents finish at the same time on different processes."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, JobStatus, Queue
from tests.apps import runtime_app
from tests.procs import eventually, processes, start_worker

pytestmark = pytest.mark.slow

LIVENESS = ("--heartbeat-interval", "0.5", "--dead-worker-timeout", "2", "--poll-interval", "0.2")


async def _status_is(queue: Queue, job_id: object, want: JobStatus) -> bool:
    job = await queue.get(str(job_id))
    return job is not None and job.status is want


async def test_a_fan_in_of_10000_jobs_on_three_processes_runs_its_callback_once(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    batch_id, members = await queue.enqueue_batch(
        [EnqueueRequest("record", {"i": i}) for i in range(10_000)],
        callback=EnqueueRequest("record", {"callback": True}),
    )
    workers = [
        await start_worker(database, tmp_path, "--concurrency", "16", *LIVENESS) for _ in range(3)
    ]
    async with processes(*workers):
        await eventually(
            lambda: _status_is(queue, batch_id, JobStatus.SUCCEEDED),
            timeout=300,
            what="the batch's callback to succeed",
        )
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    rows = await pool.fetch("SELECT job_id, pid, started_at, finished_at FROM public.executions")
    assert len(rows) == 10_001  # every member and the callback ran once
    callback = [r for r in rows if r["job_id"] == batch_id]
    assert len(callback) == 1
    assert len({r["pid"] for r in rows}) == 3
    last_member = max(r["finished_at"] for r in rows if r["job_id"] != batch_id)
    assert callback[0]["started_at"] > last_member
    job = await queue.get(batch_id)
    assert job is not None and job.payload["batch"]["succeeded"] == 10_000
    assert len(members) == 10_000


async def test_diamonds_whose_parents_finish_together_run_each_child_once_and_after_them(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    edges: list[tuple[object, list[object]]] = []
    for _ in range(200):
        top, left, right, bottom = await queue.enqueue_many(
            [
                EnqueueRequest("record", {}),
                EnqueueRequest("record", {}, EnqueueOptions(after=(0,))),
                EnqueueRequest("record", {}, EnqueueOptions(after=(0,))),
                EnqueueRequest("record", {}, EnqueueOptions(after=(1, 2))),
            ]
        )
        edges += [(left, [top]), (right, [top]), (bottom, [left, right])]
    workers = [
        await start_worker(database, tmp_path, "--concurrency", "16", *LIVENESS) for _ in range(3)
    ]
    async with processes(*workers):
        await eventually(
            lambda: _count_is(
                pool, "SELECT count(*) FROM pgfleet.jobs WHERE status = 'succeeded'", 800
            ),
            timeout=180,
            what="800 jobs to succeed",
        )
        codes = [await w.stop() for w in workers]
    assert codes == [0, 0, 0], [w.output()[-2000:] for w in workers]
    rows = await pool.fetch("SELECT job_id, started_at, finished_at FROM public.executions")
    assert len(rows) == 800
    by_id = {r["job_id"]: r for r in rows}
    assert len(by_id) == 800  # once each
    for child, parents in edges:
        assert all(by_id[child]["started_at"] > by_id[p]["finished_at"] for p in parents)


async def _count_is(pool: asyncpg.Pool, sql: str, want: int) -> bool:
    return int(await pool.fetchval(sql)) == want
