"""Workflow benchmarks (issue 30), one measurement per run, printed as JSON.

    python -m tools.bench.workflows --dsn postgresql://... --case drain --jobs 50000

Cases: ``drain`` (jobs without dependencies: jobs/s of an in-process worker, the
number to compare with the code before workflows: run this module with that code
first on ``PYTHONPATH``); ``fanin`` (a batch of ``--jobs`` members and a callback:
seconds from the first member's start to the callback's start, next to the same
members drained without a batch); ``pairs`` (``--jobs`` jobs as parent-child pairs
against as many independent jobs: seconds per job of each drain). Each run makes a
database of its own and drops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import asyncpg

import pgfleet
from pgfleet import EnqueueRequest, Job, NotifyMode, Queue, Registry, Worker, WorkerConfig
from tools.devkit import drop_database, fresh_database


def _config(concurrency: int) -> WorkerConfig:
    return WorkerConfig(
        concurrency=concurrency,
        finished_job_retention=None,
        poll_interval=0.5,
        heartbeat_interval=5,
        dead_worker_timeout=30,
    )


class _Clock:
    """A registry whose handler notes when each job started."""

    def __init__(self) -> None:
        self.started: dict[uuid.UUID, float] = {}
        self.registry = Registry()

        @self.registry.job("noop")
        async def noop(job: Job) -> None:
            self.started.setdefault(job.id, time.perf_counter())


async def _fill(queue: Queue, total: int) -> None:
    for start in range(0, total, 1000):
        size = min(1000, total - start)
        await queue.enqueue_many([EnqueueRequest("noop") for _ in range(size)])


async def _drain(pool: asyncpg.Pool, registry: Registry, concurrency: int) -> tuple[int, float]:
    start = time.perf_counter()
    done = 0
    while True:  # a burst ends on a round that only released dependents
        stats = await Worker(pool, registry, _config(concurrency)).run(burst=True)
        done += stats.succeeded
        if not stats.claimed:
            return done, time.perf_counter() - start


async def case_drain(pool: asyncpg.Pool, jobs: int, concurrency: int) -> dict[str, Any]:
    await _fill(Queue(pool, notify=NotifyMode.OFF), jobs)
    await pool.execute("VACUUM ANALYZE pgfleet.jobs")
    done, seconds = await _drain(pool, _Clock().registry, concurrency)
    return {"jobs": done, "seconds": seconds, "jobs_per_s": done / seconds}


async def case_fanin(pool: asyncpg.Pool, jobs: int, concurrency: int) -> dict[str, Any]:
    queue = Queue(pool, notify=NotifyMode.OFF)
    clock = _Clock()
    batch_id, members = await queue.enqueue_batch(
        [EnqueueRequest("noop") for _ in range(jobs)], callback=EnqueueRequest("noop")
    )
    await pool.execute("VACUUM ANALYZE pgfleet.jobs")
    _, seconds = await _drain(pool, clock.registry, concurrency)
    first = min(clock.started[m] for m in members)
    fan_in = clock.started[batch_id] - first
    await pool.execute("TRUNCATE pgfleet.jobs CASCADE")
    plain = _Clock()
    await _fill(queue, jobs)
    await pool.execute("VACUUM ANALYZE pgfleet.jobs")
    _, plain_seconds = await _drain(pool, plain.registry, concurrency)
    plain_span = max(plain.started.values()) - min(plain.started.values())
    return {
        "members": jobs,
        "first_member_to_callback_start_s": fan_in,
        "same_jobs_without_batch_first_to_last_start_s": plain_span,
        "drain_s": seconds,
        "plain_drain_s": plain_seconds,
    }


async def case_pairs(pool: asyncpg.Pool, jobs: int, concurrency: int) -> dict[str, Any]:
    queue = Queue(pool, notify=NotifyMode.OFF)
    for start in range(0, jobs, 1000):
        requests: list[EnqueueRequest] = []
        for i in range(min(1000, jobs - start) // 2):
            requests.append(EnqueueRequest("noop"))
            requests.append(EnqueueRequest("noop", None, pgfleet.EnqueueOptions(after=(2 * i,))))
        await queue.enqueue_many(requests)
    await pool.execute("VACUUM ANALYZE pgfleet.jobs")
    dependent, dependent_s = await _drain(pool, _Clock().registry, concurrency)
    await pool.execute("TRUNCATE pgfleet.jobs CASCADE")
    await _fill(queue, jobs)
    await pool.execute("VACUUM ANALYZE pgfleet.jobs")
    independent, independent_s = await _drain(pool, _Clock().registry, concurrency)
    return {
        "jobs": dependent,
        "pairs_us_per_job": dependent_s / dependent * 1e6,
        "independent_us_per_job": independent_s / independent * 1e6,
    }


CASES = {"drain": case_drain, "fanin": case_fanin, "pairs": case_pairs}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    name = f"bench_wf_{uuid.uuid4().hex[:8]}"
    dsn = await fresh_database(args.dsn, name)
    try:
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=8)
        try:
            result = await CASES[args.case](pool, args.jobs, args.concurrency)
        finally:
            await pool.close()
    finally:
        await drop_database(args.dsn, name)
    print(json.dumps({"case": args.case, "pgfleet": pgfleet.__file__, **result}))


if __name__ == "__main__":
    asyncio.run(main())
