"""The flow-control suite (``pgfleet bench --suites flow``): what limits and keys
cost the claim, against unlimited drains run in the same minute (alternating).

- a concurrency limit that does not bind (1000) against no limit, at 16 slots;
- head of line: jobs of a name limited to 2 queued before unlimited jobs, the
  unlimited ones' drain rate against the same jobs alone;
- fairness: one key with a deep backlog and 100 keys with 10 jobs each, the claim
  round (of a 64-slot worker) in which each small key's first job starts;
- keyed drain: jobs over 1,000 keys against the same number without keys.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg

from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    Job,
    NotifyMode,
    Queue,
    Registry,
    Worker,
    WorkerConfig,
    WorkerEvents,
    create_pool,
)
from tools.bench import rawsql

FLOW_RESET = (
    "TRUNCATE pgfleet.limits, pgfleet.queue_pauses, pgfleet.flow_turns, pgfleet.limit_starts"
)


def _registry() -> Registry:
    registry = Registry()

    @registry.job("noop")
    async def noop(job: Job) -> None:
        return None

    @registry.job("limited")
    async def limited(job: Job) -> None:
        await asyncio.sleep(0.01)

    return registry


def _config(concurrency: int) -> WorkerConfig:
    return WorkerConfig(
        concurrency=concurrency,
        finished_job_retention=None,
        poll_interval=0.5,
        heartbeat_interval=5,
        dead_worker_timeout=30,
    )


async def _reset(pool: asyncpg.Pool) -> None:
    await pool.execute(rawsql.RESET)
    await pool.execute(FLOW_RESET)
    # Turn numbers start again from 0 (flow_fronts: 0017; older schemas lack it).
    if await pool.fetchval("SELECT to_regclass('pgfleet.flow_fronts') IS NOT NULL"):
        await pool.execute("TRUNCATE pgfleet.flow_fronts")


async def _fill(
    pool: asyncpg.Pool, total: int, name: str = "noop", keys: int = 0, first_key: int = 0
) -> None:
    queue = Queue(pool, notify=NotifyMode.OFF)
    for start in range(0, total, 1000):
        size = min(1000, total - start)
        if keys:
            requests = [
                EnqueueRequest(
                    name, None, EnqueueOptions(limit_key=f"k{first_key + (start + i) % keys:05d}")
                )
                for i in range(size)
            ]
        else:
            requests = [EnqueueRequest(name, None) for _ in range(size)]
        await queue.enqueue_many(requests)


async def _vacuum(pool: asyncpg.Pool) -> None:
    await pool.execute("VACUUM (ANALYZE) pgfleet.jobs")


async def _drain(pool: asyncpg.Pool, concurrency: int) -> float:
    worker = Worker(pool, _registry(), _config(concurrency))
    start = time.perf_counter()
    stats = await worker.run(burst=True)
    return stats.succeeded / (time.perf_counter() - start)


class _Done(WorkerEvents):
    """Stops the worker once ``want`` jobs of ``name`` finished; records when."""

    def __init__(self, name: str, want: int, stop: asyncio.Event) -> None:
        self.name, self.want, self.stop = name, want, stop
        self.done = 0
        self.finished_at = 0.0

    def job_finished(self, job: Job, outcome: str, duration: float) -> None:
        if job.name == self.name:
            self.done += 1
            if self.done == self.want:
                self.finished_at = time.perf_counter()
                self.stop.set()


async def _drain_name(pool: asyncpg.Pool, concurrency: int, name: str, want: int) -> float:
    """The rate at which ``want`` jobs of ``name`` drain (others may run beside)."""
    stop = asyncio.Event()
    events = _Done(name, want, stop)
    worker = Worker(pool, _registry(), _config(concurrency), events=events)
    start = time.perf_counter()
    await worker.run(shutdown=stop.wait())
    return want / (events.finished_at - start)


class _Rounds(WorkerEvents):
    """The claim round in which each key's first job started."""

    def __init__(self, keys: set[str], stop: asyncio.Event, by_id: dict[Any, str]) -> None:
        self.rounds = 0
        self.first: dict[str, int] = {}
        self.keys, self.stop, self.by_id = keys, stop, by_id

    def jobs_claimed(self, count: int) -> None:
        self.rounds += 1

    def job_started(self, job: Job, pickup_delay: float) -> None:
        key = self.by_id.get(job.id)
        if key is not None and key not in self.first:
            self.first[key] = self.rounds
            if self.keys <= self.first.keys():
                self.stop.set()


async def _fairness(pool: asyncpg.Pool, big: int) -> int:
    """The last claim round (1-based) in which a small key's first job started."""
    await _reset(pool)
    queue = Queue(pool, notify=NotifyMode.OFF)
    for start in range(0, big, 1000):
        await queue.enqueue_many(
            [
                EnqueueRequest("noop", None, EnqueueOptions(limit_key="big"))
                for _ in range(min(1000, big - start))
            ]
        )
    await _fill(pool, 1000, keys=100)
    await _vacuum(pool)
    rows = await pool.fetch(
        "SELECT id, limit_key FROM pgfleet.jobs WHERE limit_key <> 'big' AND status = 'queued'"
    )
    by_id = {r["id"]: r["limit_key"] for r in rows}
    stop = asyncio.Event()
    events = _Rounds(set(by_id.values()), stop, by_id)
    worker = Worker(pool, _registry(), _config(64), events=events)
    await asyncio.wait_for(worker.run(shutdown=stop.wait()), 600)
    return max(events.first.values())


async def suite_flow(bench: Any, dsn: str) -> None:
    from tools.bench.suite import Result  # a cycle otherwise: suite registers this one

    print("flow control", flush=True)
    # The drains against no limit: long enough (about 4 s) that a worker's start and
    # its first rounds do not decide the ratio. Head of line: the 20,000
    # unlimited jobs behind a backlog of 100,000.
    drain = bench.n(100_000)
    total = bench.n(20_000)
    backlog = bench.n(100_000)
    pool = await create_pool(dsn, min_size=4, max_size=8)
    runs: dict[str, list[float]] = {}

    def record(key: str, value: float) -> None:
        runs.setdefault(key, []).append(value)
        print(f"  {key}: {value:,.1f}", flush=True)

    try:
        for _ in range(bench.repeats):
            # A limit that does not bind, against none.
            await _reset(pool)
            await _fill(pool, drain)
            await _vacuum(pool)
            record("flow unlimited c16", await _drain(pool, 16))
            await _reset(pool)
            await Queue(pool).set_limits("noop", concurrency=1000)
            await _fill(pool, drain)
            await _vacuum(pool)
            record("flow concurrency 1000 c16", await _drain(pool, 16))
            # Keys: the same jobs over 1,000 keys.
            await _reset(pool)
            await _fill(pool, drain, keys=1000)
            await _vacuum(pool)
            record("flow 1000 keys c16", await _drain(pool, 16))
            # Head of line: a limited backlog queued first.
            await _reset(pool)
            await _fill(pool, total)
            await _vacuum(pool)
            record("flow unlimited alone c16", await _drain_name(pool, 16, "noop", total))
            await _reset(pool)
            await Queue(pool).set_limits("limited", concurrency=2)
            await _fill(pool, backlog, name="limited")
            await _fill(pool, total)
            await _vacuum(pool)
            record("flow behind limited c16", await _drain_name(pool, 16, "noop", total))
            record("flow fairness rounds c64", float(await _fairness(pool, backlog)))
    finally:
        await pool.close()
    titles = {
        "flow unlimited c16": ("flow: no limit, concurrency 16", None),
        "flow concurrency 1000 c16": (
            "flow: concurrency limit 1000 (not binding)",
            "flow unlimited c16",
        ),
        "flow 1000 keys c16": ("flow: 1,000 limit keys, no limit", "flow unlimited c16"),
        "flow unlimited alone c16": ("flow: unlimited jobs alone", None),
        "flow behind limited c16": (
            "flow: unlimited jobs behind a backlog limited to 2",
            "flow unlimited alone c16",
        ),
    }
    for key, (title, ref) in titles.items():
        extra = {"title": title, "paired": ref is not None}
        bench.add(Result(key, "jobs/s", runs[key], reference=ref, extra=extra))
    bench.add(
        Result(
            "flow fairness rounds c64",
            "rounds",
            runs["flow fairness rounds c64"],
            extra={"title": "flow: round of the last small key's first start (100 keys)"},
        )
    )
