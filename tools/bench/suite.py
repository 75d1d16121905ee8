"""The benchmark suites (``make bench``, ``python -m tools.bench``, ``pgfleet bench``
from a checkout): reproducible throughput and latency measurements.

Each measurement is repeated and reported as a median, next to a raw-SQL reference
run in the same process and the same minute (alternating runs), so the ratio holds
on a noisy machine even when absolute numbers drift. The benchmark creates its own
database on the server it is given and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from pgfleet import (
    EnqueueRequest,
    Job,
    NotifyMode,
    Queue,
    Registry,
    Worker,
    WorkerConfig,
    create_pool,
)
from tools.bench import rawsql
from tools.devkit import drop_database, fresh_database, guarded, with_database

#: The checkout this suite lives in: its children import ``tools`` from there.
ROOT = Path(__file__).resolve().parents[2]

SUITES = ("enqueue", "drain", "latency", "retention")
#: How the benchmark's child processes receive the database URL.
_CHILD_DSN = "PGFLEET_DATABASE_URL"
#: "1": the child's DSN goes through a transaction-mode pooler (--pooled-dsn).
_CHILD_POOLED = "PGFLEET_BENCH_POOLED"
_CHILD_LISTEN = "PGFLEET_LISTEN_DATABASE_URL"


@dataclass
class Result:
    name: str
    unit: str
    runs: list[float]
    reference: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


@dataclass
class Bench:
    dsn: str
    repeats: int
    scale: float
    results: list[Result] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    cpu: CpuRuns = field(default_factory=lambda: CpuRuns())
    pooled_dsn: str | None = None

    def n(self, count: int) -> int:
        return max(1, int(count * self.scale))

    def add(self, result: Result) -> None:
        self.results.append(result)
        digits = 2 if result.unit == "ms" else 0
        line = f"  {result.name:<44} median {result.median:>11,.{digits}f} {result.unit}"
        runs = [round(r, digits) for r in result.runs]
        print(f"{line}   runs {runs}{_cpu_text(result)}", flush=True)


def _cpu_text(result: Result) -> str:
    client = result.extra.get("client_cpu_ms_per_job")
    if client is None:
        return ""
    server = result.extra.get("pg_cpu_ms_per_job")
    pg = "n/a" if server is None else f"{server:.3f}"
    return f"   cpu/job client {client:.3f} ms, postgres {pg} ms"


async def _metered(bench: Bench, dsn: str, key: str, jobs: int, run: Awaitable[float]) -> float:
    """Await a measurement that returns a rate, metering its CPU for ``jobs`` jobs."""
    async with Cpu(dsn) as meter:
        rate = await run
    bench.cpu.add(key, meter, jobs)
    return rate


_with_database = with_database


async def _fresh_database(admin_dsn: str, name: str) -> str:
    """The benchmark's scratch database: migrated, plus the raw-SQL reference table."""
    dsn = await fresh_database(admin_dsn, name)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(rawsql.RAW_SCHEMA)
    finally:
        await conn.close()
    return dsn


async def _reset(pool: asyncpg.Pool) -> None:
    await pool.execute(rawsql.RESET)


class Cpu:
    """CPU seconds spent during a measurement, on both sides of the wire.

    Client: this process (``time.process_time``) plus the benchmark's child
    processes that exited meanwhile (``RUSAGE_CHILDREN``). Postgres: the backends
    connected to the benchmark's database (``pg_stat_activity``), read from
    ``/proc/<pid>/stat`` every ``interval`` seconds, so backends that connect and
    leave during the run are counted too; the meter's own backend and the server's
    shared background processes (WAL writer, checkpointer) are not. Postgres CPU is
    None when the server's processes are not readable here (another host).
    """

    _TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self, dsn: str, interval: float = 0.1) -> None:
        self._dsn = dsn
        self._interval = interval
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._readable = True
        self._conn: Any = None
        self._task: asyncio.Task[None] | None = None
        self.client = 0.0
        self.server: float | None = None

    @staticmethod
    def _children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def _read(self, pid: int) -> float | None:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / self._TICK  # utime + stime

    async def _sample(self, first: bool) -> None:
        pids = await self._conn.fetch(rawsql.BACKEND_PIDS)
        for row in pids:
            pid = int(row["pid"])
            seconds = self._read(pid)
            if seconds is None:
                self._readable = self._readable and pid in self._last
                continue
            if pid not in self._first:
                # Present at the start: count from now. Connected later: its whole life.
                self._first[pid] = seconds if first else 0.0
            self._last[pid] = seconds

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            with contextlib.suppress(Exception):
                await self._sample(False)

    async def __aenter__(self) -> Cpu:
        self._conn = await asyncpg.connect(self._dsn)
        await self._sample(True)
        self._client0 = time.process_time() + self._children()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.client = time.process_time() + self._children() - self._client0
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        try:
            await self._sample(False)
        finally:
            await self._conn.close()
        if self._readable and self._last:
            self.server = sum(self._last[p] - self._first[p] for p in self._last)

    def per_job(self, jobs: int) -> tuple[float, float | None]:
        """(client, Postgres) CPU milliseconds per job."""
        n = max(1, jobs)
        return self.client * 1000 / n, None if self.server is None else self.server * 1000 / n


@dataclass
class CpuRuns:
    """CPU per job of each run of each measurement, reported next to its rate."""

    runs: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)

    def add(self, key: str, cpu: Cpu, jobs: int) -> None:
        self.runs.setdefault(key, []).append(cpu.per_job(jobs))

    def extra(self, key: str) -> dict[str, Any]:
        runs = self.runs.get(key)
        if not runs:
            return {}
        server = [s for _, s in runs if s is not None]
        return {
            "client_cpu_ms_per_job": statistics.median(c for c, _ in runs),
            "pg_cpu_ms_per_job": statistics.median(server) if len(server) == len(runs) else None,
        }


async def _timed(
    fn: Callable[[], Awaitable[int]],
    dsn: str | None = None,
    cpu: CpuRuns | None = None,
    key: str = "",
) -> float:
    if dsn is None or cpu is None:
        start = time.perf_counter()
        count = await fn()
        return count / (time.perf_counter() - start)
    async with Cpu(dsn) as meter:
        start = time.perf_counter()
        count = await fn()
        elapsed = time.perf_counter() - start
    cpu.add(key, meter, count)
    return count / elapsed


# ---------------------------------------------------------------- enqueue suite


async def suite_enqueue(bench: Bench, dsn: str) -> None:
    print("enqueue", flush=True)
    single_n = bench.n(3000)
    batch_total, batch_size = bench.n(100_000), 1000
    producers, seconds = 32, max(1.0, 3.0 * bench.scale)
    light = await create_pool(dsn, min_size=2, max_size=2)
    default = await asyncpg.create_pool(dsn, min_size=2, max_size=2)
    big = await create_pool(dsn, min_size=producers + 1, max_size=producers + 1)
    held = await asyncpg.connect(dsn)
    runs: dict[str, list[float]] = {}

    def record(key: str, value: float) -> None:
        runs.setdefault(key, []).append(value)

    try:
        for _ in range(bench.repeats):
            # Every variant once per repeat, interleaved, so drift hits them alike.
            await _reset(light)
            raw_single = functools.partial(_raw_single, held, single_n)
            record("raw single", await _timed(raw_single, dsn, bench.cpu, "raw single"))
            for key, queue, conn in (
                ("single held", Queue(light), held),
                ("single held off", Queue(light, notify=NotifyMode.OFF), held),
                ("single pool", Queue(light), None),
                ("single pool off", Queue(light, notify=NotifyMode.OFF), None),
                ("single default pool", Queue(default), None),
            ):
                await _reset(light)
                single = functools.partial(_single, queue, single_n, conn)
                record(key, await _timed(single, dsn, bench.cpu, key))
            await _reset(light)
            raw_batch = functools.partial(_raw_batch, held, batch_total, batch_size)
            record("raw batch", await _timed(raw_batch, dsn, bench.cpu, "raw batch"))
            for key, mode in (("batch", NotifyMode.COALESCED), ("batch off", NotifyMode.OFF)):
                await _reset(light)
                queue = Queue(light, notify=mode)
                batch = functools.partial(_batch, queue, batch_total, batch_size)
                record(key, await _timed(batch, dsn, bench.cpu, key))
            await _reset(big)
            key = "raw 32 producers"
            record(
                key,
                await _metered_rate(bench, dsn, key, _concurrent(big, producers, seconds, None)),
            )
            for mode in (NotifyMode.COALESCED, NotifyMode.TRANSACTION, NotifyMode.OFF):
                await _reset(big)
                key = f"32 producers {mode.value}"
                run = _concurrent(big, producers, seconds, Queue(big, notify=mode))
                record(key, await _metered_rate(bench, dsn, key, run))
    finally:
        await held.close()
        for p in (light, default, big):
            await p.close()
    labels = {
        "raw single": ("raw SQL single-row insert, 1 connection", "commits/s", None),
        "single held": ("enqueue(connection=conn), 1 producer", "jobs/s", "raw single"),
        "single held off": ("enqueue(connection=conn), notify off", "jobs/s", "raw single"),
        "single pool": ("enqueue() on pgfleet.create_pool", "jobs/s", "raw single"),
        "single pool off": ("enqueue() on pgfleet.create_pool, notify off", "jobs/s", "raw single"),
        "single default pool": ("enqueue() on a default asyncpg pool", "jobs/s", "raw single"),
        "raw batch": ("raw SQL unnest insert, batches of 1000", "jobs/s", None),
        "batch": ("enqueue_many(), batches of 1000", "jobs/s", "raw batch"),
        "batch off": ("enqueue_many(), batches of 1000, notify off", "jobs/s", "raw batch"),
        "raw 32 producers": ("raw SQL single-row insert, 32 connections", "commits/s", None),
        "32 producers coalesced": ("enqueue(), 32 producers", "jobs/s", "32 producers off"),
        "32 producers transaction": (
            "enqueue(), 32 producers, notify per commit",
            "jobs/s",
            "32 producers off",
        ),
        "32 producers off": ("enqueue(), 32 producers, notify off", "jobs/s", "raw 32 producers"),
    }
    for key, (title, unit, ref) in labels.items():
        extra = {"title": title, **bench.cpu.extra(key)}
        bench.add(Result(key, unit, runs[key], reference=ref, extra=extra))


async def _raw_single(conn: Any, n: int) -> int:
    payload = json.dumps({"n": 1})
    for _ in range(n):
        await conn.execute(rawsql.RAW_INSERT_ONE, payload)
    return n


async def _single(queue: Queue, n: int, conn: Any = None) -> int:
    for i in range(n):
        await queue.enqueue("noop", {"n": i}, connection=conn)
    await queue.flush_notifications()
    return n


async def _raw_batch(conn: Any, total: int, size: int) -> int:
    payload = json.dumps({"n": 1})
    for _ in range(0, total, size):
        await conn.execute(rawsql.RAW_INSERT_MANY, [payload] * size)
    return total


async def _batch(queue: Queue, total: int, size: int) -> int:
    for start in range(0, total, size):
        await queue.enqueue_many([EnqueueRequest("noop", {"n": start + i}) for i in range(size)])
    await queue.flush_notifications()
    return total


async def _metered_rate(bench: Bench, dsn: str, key: str, run: Awaitable[float]) -> float:
    """Like _metered, for a timed run whose job count follows from its rate."""
    async with Cpu(dsn) as meter:
        start = time.perf_counter()
        rate = await run
        elapsed = time.perf_counter() - start
    bench.cpu.add(key, meter, round(rate * elapsed))
    return rate


async def _concurrent(
    pool: asyncpg.Pool, producers: int, seconds: float, queue: Queue | None
) -> float:
    payload = json.dumps({"n": 1})
    done = 0
    stop = time.perf_counter() + seconds

    async def raw() -> None:
        nonlocal done
        async with pool.acquire() as conn:
            while time.perf_counter() < stop:
                await conn.execute(rawsql.RAW_INSERT_ONE, payload)
                done += 1

    async def lib(q: Queue) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await q.enqueue("noop", {"n": done})
            done += 1

    start = time.perf_counter()
    if queue is None:
        await asyncio.gather(*(raw() for _ in range(producers)))
    else:
        await asyncio.gather(*(lib(queue) for _ in range(producers)))
        await queue.flush_notifications()
    return done / (time.perf_counter() - start)


# ---------------------------------------------------------------- drain suite


def _noop_registry() -> Registry:
    registry = Registry()

    @registry.job("noop")
    async def noop(job: Job) -> None:
        return None

    return registry


def _bench_config(concurrency: int) -> WorkerConfig:
    return WorkerConfig(
        concurrency=concurrency,
        finished_job_retention=None,
        poll_interval=0.5,
        heartbeat_interval=5,
        dead_worker_timeout=30,
    )


async def _fill(pool: asyncpg.Pool, total: int) -> None:
    queue = Queue(pool, notify=NotifyMode.OFF)
    for start in range(0, total, 1000):
        size = min(1000, total - start)
        await queue.enqueue_many([EnqueueRequest("noop", None) for _ in range(size)])


async def _drain_in_process(pool: asyncpg.Pool, concurrency: int) -> float:
    worker = Worker(pool, _noop_registry(), _bench_config(concurrency))
    start = time.perf_counter()
    stats = await worker.run(burst=True)
    return stats.succeeded / (time.perf_counter() - start)


async def _drain_processes(dsn: str, processes: int, concurrency: int, total: int) -> float:
    """Children start, connect and wait for 'go' on stdin, so process start-up is
    not timed; the clock runs from 'go' to the last child's report."""
    children = [await _spawn_child("--child-drain", concurrency, dsn) for _ in range(processes)]
    for child in children:
        assert child.stdout is not None
        line = await child.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"benchmark child failed to start: {line!r}")
    start = time.perf_counter()
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        await child.stdin.drain()
    done = 0
    for child in children:
        assert child.stdout is not None
        done += int(json.loads(await child.stdout.readline())["succeeded"])
    elapsed = time.perf_counter() - start
    for child in children:
        await child.wait()
    if done != total:
        raise RuntimeError(f"children drained {done} jobs, expected {total}")
    return done / elapsed


async def _child_drain(concurrency: int, dsn: str) -> None:
    pool = await create_pool(dsn, min_size=3, max_size=6)
    try:
        async with pool.acquire() as conn:
            await conn.fetchval(rawsql.PING)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        worker = Worker(pool, _noop_registry(), _bench_config(concurrency))
        stats = await worker.run(burst=True)
        print(json.dumps({"succeeded": stats.succeeded}), flush=True)
    finally:
        await pool.close()


async def _raw_drain(pool: asyncpg.Pool, claimers: int, batch: int) -> float:
    done = 0

    async def claimer() -> None:
        nonlocal done
        async with pool.acquire() as conn:
            while True:
                rows = await conn.fetch(rawsql.RAW_CLAIM, batch)
                if not rows:
                    return
                await conn.execute(rawsql.RAW_COMPLETE, [r["id"] for r in rows])
                done += len(rows)

    start = time.perf_counter()
    await asyncio.gather(*(claimer() for _ in range(claimers)))
    return done / (time.perf_counter() - start)


async def suite_drain(bench: Bench, dsn: str) -> None:
    print("drain (no-op jobs)", flush=True)
    total = bench.n(20_000)
    single_total = bench.n(5_000)
    pool = await create_pool(dsn, min_size=4, max_size=8)
    runs: dict[str, list[float]] = {}
    try:
        for _ in range(bench.repeats):
            for claimers in (1, 2):
                await _reset(pool)
                await pool.execute(rawsql.RAW_FILL, total)
                key = f"raw drain {claimers}"
                runs.setdefault(key, []).append(
                    await _metered(bench, dsn, key, total, _raw_drain(pool, claimers, 1000))
                )
            for concurrency in (1, 16, 64):
                n = single_total if concurrency == 1 else total
                await _reset(pool)
                await _fill(pool, n)
                key = f"drain c{concurrency}"
                runs.setdefault(key, []).append(
                    await _metered(bench, dsn, key, n, _drain_in_process(pool, concurrency))
                )
            await _reset(pool)
            await _fill(pool, total)
            key = "drain 2 processes c64"
            runs.setdefault(key, []).append(
                await _metered(bench, dsn, key, total, _drain_processes(dsn, 2, 64, total))
            )
        stats = await pool.fetchrow(rawsql.TABLE_STATS)
        assert stats is not None  # one row: the jobs table's statistics
    finally:
        await pool.close()
    titles = {
        "raw drain 1": ("raw SQL claim 1000 + complete, 1 connection", None),
        "raw drain 2": ("raw SQL claim 1000 + complete, 2 connections", None),
        "drain c1": ("1 process, concurrency 1", "raw drain 1"),
        "drain c16": ("1 process, concurrency 16", "raw drain 1"),
        "drain c64": ("1 process, concurrency 64", "raw drain 1"),
        "drain 2 processes c64": ("2 processes, concurrency 64 each", "raw drain 2"),
    }
    for key, (title, ref) in titles.items():
        extra = {"title": title, **bench.cpu.extra(key)}
        bench.add(Result(key, "jobs/s", runs[key], reference=ref, extra=extra))
    bench.facts["after drain"] = {
        "table_bytes": int(stats["total_bytes"]),
        "heap_bytes": int(stats["heap_bytes"]),
        "dead_tuples": int(stats["dead_tuples"]),
        "live_tuples": int(stats["live_tuples"]),
    }
    print(f"  table after the last drain: {bench.facts['after drain']}", flush=True)


# ---------------------------------------------------------------- pgbouncer suite


async def _drain_route(url: str, pooled: bool, total: int, concurrency: int) -> float:
    """Drain ``total`` queued jobs with one in-process worker whose pool uses ``url``."""
    pool = await create_pool(url, min_size=4, max_size=8, pgbouncer=pooled)
    try:
        config = dataclasses.replace(_bench_config(concurrency), pgbouncer=pooled, listen=False)
        worker = Worker(pool, _noop_registry(), config)
        start = time.perf_counter()
        stats = await worker.run(burst=True)
        if stats.succeeded != total:
            raise RuntimeError(f"drained {stats.succeeded} jobs, expected {total}")
        return stats.succeeded / (time.perf_counter() - start)
    finally:
        await pool.close()


async def suite_pgbouncer(bench: Bench, dsn: str) -> None:
    """Direct against through a transaction-mode pooler (--pooled-dsn): drain rate
    and pickup latency, plus the cost of no prepared statements on its own."""
    if not bench.pooled_dsn:
        raise SystemExit(
            "pgfleet bench: the pgbouncer suite needs --pooled-dsn, a PgBouncer in "
            "transaction mode in front of the same server"
        )
    pooled_dsn = _with_database(bench.pooled_dsn, urlsplit(dsn).path.lstrip("/"))
    print("pgbouncer (transaction mode, no prepared statements) against direct", flush=True)
    total = bench.n(10_000)
    rate, producers, seconds = 500, 4, max(2.0, 10.0 * bench.scale)
    admin = await create_pool(dsn, min_size=1, max_size=2)
    runs: dict[str, list[float]] = {}
    drains = {
        "direct": (dsn, False),
        "direct no statement cache": (dsn, None),
        "pgbouncer": (pooled_dsn, True),
    }
    latencies = {
        "direct": (dsn, None),
        "pgbouncer listen-dsn": (pooled_dsn, {_CHILD_POOLED: "1", _CHILD_LISTEN: dsn}),
        "pgbouncer polling": (pooled_dsn, {_CHILD_POOLED: "1", _CHILD_LISTEN: ""}),
    }
    try:
        for _ in range(bench.repeats):
            for route, (url, pooled) in drains.items():
                await _reset(admin)
                await _fill(admin, total)
                if pooled is None:  # direct, statement cache off, session settings on
                    pool_rate = await _drain_nocache(url, total, 16)
                else:
                    pool_rate = await _drain_route(url, pooled, total, 16)
                runs.setdefault(f"drain c16 {route}", []).append(pool_rate)
            for route, (url, env) in latencies.items():
                await _reset(admin)
                pool = await create_pool(
                    url, min_size=producers, max_size=producers, pgbouncer=env is not None
                )
                try:
                    delays = await _latency_run(pool, url, producers, rate, seconds, env)
                finally:
                    await pool.close()
                for q in (50, 99):
                    runs.setdefault(f"pickup p{q} {route}", []).append(_quantile(delays, q / 100))
    finally:
        await admin.close()
    for route in drains:
        ref = None if route == "direct" else "drain c16 direct"
        title = f"drain, 1 process concurrency 16, {route}"
        bench.add(
            Result(
                f"drain c16 {route}", "jobs/s", runs[f"drain c16 {route}"], ref, {"title": title}
            )
        )
    for route in latencies:
        for q in (50, 99):
            key = f"pickup p{q} {route}"
            title = f"pickup latency p{q} at {rate} jobs/s, {route}"
            bench.add(Result(key, "ms", runs[key], extra={"title": title}))


async def _drain_nocache(url: str, total: int, concurrency: int) -> float:
    """A direct pool without asyncpg's statement cache: the cost of unnamed statements
    alone, without the pooler's hop."""
    pool = await create_pool(url, min_size=4, max_size=8, statement_cache_size=0)
    try:
        worker = Worker(pool, _noop_registry(), _bench_config(concurrency))
        start = time.perf_counter()
        stats = await worker.run(burst=True)
        return stats.succeeded / (time.perf_counter() - start)
    finally:
        await pool.close()


# ---------------------------------------------------------------- pickup latency suite


async def _latency_child(dsn: str, concurrency: int) -> None:
    """A worker process that reports (job id, wall clock at handler start)."""
    pooled = os.environ.get(_CHILD_POOLED) == "1"
    pool = await create_pool(dsn, min_size=3, max_size=6, pgbouncer=pooled)
    registry = Registry()
    out = sys.stdout

    @registry.job("noop")
    async def noop(job: Job) -> None:
        out.write(f"{job.id} {time.time():.6f}\n")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), stop.set)
    config = _bench_config(concurrency)
    if pooled:
        listen = os.environ.get(_CHILD_LISTEN) or None
        config = dataclasses.replace(config, pgbouncer=True, listen_dsn=listen)
    worker = Worker(pool, registry, config)
    task = loop.create_task(worker.run(shutdown=stop.wait()))
    await worker.wait_started()
    print("ready", flush=True)
    await task
    out.flush()
    await pool.close()


async def suite_latency(bench: Bench, dsn: str) -> None:
    rate, producers, seconds = 500, 4, max(2.0, 10.0 * bench.scale)
    print(f"pickup latency ({producers} producers, {rate} jobs/s, single-job enqueue)", flush=True)
    pool = await create_pool(dsn, min_size=producers + 2, max_size=producers + 2)
    runs: dict[str, list[float]] = {}
    try:
        for _ in range(bench.repeats):
            await _reset(pool)
            delays = await _latency_run(pool, dsn, producers, rate, seconds)
            for q in (50, 95, 99):
                runs.setdefault(f"pickup p{q}", []).append(_quantile(delays, q / 100))
            runs.setdefault("enqueue rate", []).append(len(delays) / seconds)
    finally:
        await pool.close()
    for key in ("p50", "p95", "p99"):
        title = f"pickup latency {key} at {rate} jobs/s"
        bench.add(Result(f"pickup {key}", "ms", runs[f"pickup {key}"], extra={"title": title}))
    title = "achieved enqueue rate"
    bench.add(Result("enqueue rate", "jobs/s", runs["enqueue rate"], extra={"title": title}))


async def _latency_run(
    pool: asyncpg.Pool,
    dsn: str,
    producers: int,
    rate: int,
    seconds: float,
    env: dict[str, str] | None = None,
) -> list[float]:
    """Milliseconds from each enqueue's commit to its handler's start, sorted."""
    child = await _spawn_child("--child-latency", 16, dsn, env)
    assert child.stdout is not None
    assert child.stdin is not None
    if (await child.stdout.readline()).strip() != b"ready":
        raise RuntimeError("latency worker failed to start")
    started: dict[str, float] = {}
    expected: dict[str, float] = {}
    all_seen = asyncio.Event()

    async def read_starts(stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            job_id, _, at = raw.decode().partition(" ")
            started[job_id] = float(at)
            if expected and len(started) >= len(expected):
                all_seen.set()

    reader = asyncio.get_running_loop().create_task(read_starts(child.stdout))
    queue = Queue(pool)
    expected.update(
        await paced_producers(lambda: queue.enqueue("noop", None), producers, rate, seconds)
    )
    await queue.flush_notifications()
    if len(started) < len(expected):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_seen.wait(), 30)
    child.stdin.write(b"stop\n")
    await child.stdin.drain()
    await child.wait()
    await reader
    missing = len(expected) - len(started.keys() & expected.keys())
    if missing:
        raise RuntimeError(f"{missing} jobs did not run")
    return sorted((started[job_id] - t) * 1000 for job_id, t in expected.items())


async def paced_producers(
    enqueue: Callable[[], Awaitable[object]], producers: int, rate: int, seconds: float
) -> dict[str, float]:
    """``producers`` coroutines each call ``enqueue`` at rate/producers per second on a
    fixed schedule, noting the wall clock right after each commit, by job id."""
    committed: dict[str, float] = {}
    interval = producers / rate
    begin = time.perf_counter() + 0.05

    async def producer(offset: float) -> None:
        n = 0
        while True:
            due = begin + offset + n * interval
            if due - begin > seconds:
                return
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            job_id = await enqueue()
            committed[str(job_id)] = time.time()
            n += 1

    await asyncio.gather(*(producer(i * interval / producers) for i in range(producers)))
    return committed


def _quantile(values: list[float], q: float) -> float:
    index = min(len(values) - 1, max(0, round(q * (len(values) - 1))))
    return values[index]


# ---------------------------------------------------------------- retained history suite


async def suite_retention(bench: Bench, dsn: str) -> None:
    retained = bench.n(1_000_000)
    total = bench.n(20_000)
    print(f"claim rate with {retained:,} finished jobs retained vs an empty table", flush=True)
    pool = await create_pool(dsn, min_size=4, max_size=8)
    runs: dict[str, list[float]] = {}
    try:
        await _reset(pool)
        for _ in range(bench.repeats):
            await _reset(pool)
            await _fill(pool, total)
            runs.setdefault("claim empty", []).append(await _drain_in_process(pool, 64))
        await _reset(pool)
        await pool.execute(rawsql.FILL_FINISHED, retained)
        await pool.execute(rawsql.VACUUM_JOBS)
        for _ in range(bench.repeats):
            await _fill(pool, total)
            runs.setdefault("claim retained", []).append(await _drain_in_process(pool, 64))
    finally:
        await pool.close()
    bench.add(
        Result(
            "claim empty", "jobs/s", runs["claim empty"], extra={"title": "drain c64, empty table"}
        )
    )
    bench.add(
        Result(
            "claim retained",
            "jobs/s",
            runs["claim retained"],
            reference="claim empty",
            extra={"title": f"drain c64, {retained:,} finished jobs retained"},
        )
    )


# ---------------------------------------------------------------- report


def _report(bench: Bench) -> dict[str, Any]:
    by_name = {r.name: r for r in bench.results}
    rows = []
    print("\nsummary (medians)")
    for r in bench.results:
        ratio = paired = None
        if r.reference and r.reference in by_name:
            ref = by_name[r.reference]
            ratio = r.median / ref.median
            if r.extra.get("paired") and len(r.runs) == len(ref.runs):
                # Measured in turn with its reference, repeat by repeat: the median
                # of each repeat's ratio moves less with a noisy machine's load.
                paired = statistics.median(a / b for a, b in zip(r.runs, ref.runs, strict=True))
        title = r.extra.get("title", r.name)
        tail = f"  {ratio:6.0%} of {r.reference}" if ratio is not None else ""
        if paired is not None:
            tail += f" (each repeat's ratio: median {paired:.0%})"
        digits = 2 if r.unit == "ms" else 0
        print(f"  {title:<48} {r.median:>11,.{digits}f} {r.unit}{tail}{_cpu_text(r)}")
        rows.append(
            {
                "name": r.name,
                "title": title,
                "unit": r.unit,
                "median": r.median,
                "runs": r.runs,
                "reference": r.reference,
                "ratio": ratio,
                "paired_ratio": paired,
                **{k: v for k, v in r.extra.items() if k not in ("title", "paired")},
            }
        )
    return {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "repeats": bench.repeats,
        "scale": bench.scale,
        "results": rows,
        "facts": bench.facts,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args.dsn, args.repeats, args.scale)
    bench.pooled_dsn = getattr(args, "pooled_dsn", None)
    dsn = await _fresh_database(args.dsn, args.database)
    try:
        admin = await asyncpg.connect(dsn)
        try:
            server = await admin.fetchval("SHOW server_version")
        finally:
            await admin.close()
        print(f"pgfleet bench: PostgreSQL {server}, {args.repeats} repeats, scale {args.scale}")
        for suite in args.suites:
            await SUITE_FUNCTIONS[suite](bench, dsn)
        report = _report(bench)
        report["postgres"] = server
        return report
    finally:
        if not args.keep:
            await drop_database(args.dsn, args.database)


async def _suite_flow(bench: Bench, dsn: str) -> None:
    from tools.bench.flow import suite_flow  # it imports this module's Result

    await suite_flow(bench, dsn)


SUITE_FUNCTIONS: dict[str, Callable[[Bench, str], Awaitable[None]]] = {
    "enqueue": suite_enqueue,
    "drain": suite_drain,
    "latency": suite_latency,
    "retention": suite_retention,
    # Not in the default set: it needs --pooled-dsn.
    "pgbouncer": suite_pgbouncer,
    # Not in the default set: flow control's costs (tools/bench/flow.py).
    "flow": _suite_flow,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_loop_argument(parser)
    parser.add_argument(
        "--dsn",
        default=os.environ.get("PGFLEET_DATABASE_URL"),
        help="a server to create the benchmark database on (default: $PGFLEET_DATABASE_URL)",
    )
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma list of {SUITES}")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the job counts")
    parser.add_argument("--database", default="pgfleet_bench", help="database to create and drop")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    parser.add_argument("--json", dest="json_path", help="write the results here as JSON")
    parser.add_argument(
        "--pooled-dsn",
        help="for --suites pgbouncer: a PgBouncer in transaction mode in front of --dsn's "
        "server (its database name is replaced by the benchmark's)",
    )


def main(args: argparse.Namespace) -> None:
    if not args.dsn:
        raise SystemExit(
            "pgfleet bench: no database given: pass --dsn or set PGFLEET_DATABASE_URL "
            "(for example postgresql://user@host:5432/postgres)"
        )
    args.suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in args.suites if s not in SUITE_FUNCTIONS]
    if unknown:
        raise SystemExit(
            f"pgfleet bench: unknown suites {unknown}; choose from {list(SUITE_FUNCTIONS)}"
        )
    if args.repeats < 1 or args.scale <= 0:
        raise SystemExit("pgfleet bench: --repeats must be >= 1 and --scale > 0")
    install_loop(args.loop)
    report = asyncio.run(run(args))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, default=str)
        print(f"wrote {args.json_path}")


async def _spawn_child(
    mode: str, concurrency: int, dsn: str, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """One of the benchmark's own worker processes (see _child_main), talking over
    stdin/stdout, ending with this process. The DSN travels in the environment: a
    password never shows in `ps`."""
    return await asyncio.create_subprocess_exec(
        *guarded([sys.executable, "-m", "tools.bench", mode, str(concurrency)]),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=child_env(dsn, env),
    )


def child_env(dsn: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark child: ``tools`` importable from this
    checkout wherever the benchmark was started, the DSN out of the command line."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, _CHILD_DSN: dsn, **(extra or {})}


#: The event loops a benchmark's Python side can run on (``--loop``).
LOOPS = ("uvloop", "asyncio")


def add_loop_argument(parser: argparse.ArgumentParser) -> None:
    """``--loop``: uvloop by default, as ``pgfleet worker`` runs (the benchmark
    children always did); ``asyncio`` for an application's own loop."""
    parser.add_argument(
        "--loop",
        choices=LOOPS,
        default="uvloop",
        help="the event loop of the in-process workers and Python peers: uvloop (the "
        "default, as `pgfleet worker` runs; asyncio's own when uvloop is not installed) "
        "or asyncio's own, as an application that embeds the Worker may run",
    )


def install_loop(name: str) -> str:
    """Run the next ``asyncio.run`` on ``name``'s loop; returns the loop in use."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            print("uvloop is not installed: running on asyncio's own loop", file=sys.stderr)
            asyncio.set_event_loop_policy(None)
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    if name != "asyncio":
        raise ValueError(f"unknown event loop {name!r}: one of {', '.join(LOOPS)}")
    asyncio.set_event_loop_policy(None)
    return "asyncio"


def _install_uvloop() -> None:
    install_loop("uvloop")


def _child_main(argv: list[str]) -> None:
    """Hidden entry points for the benchmark's own worker processes."""
    mode, concurrency, dsn = argv[0], int(argv[1]), os.environ[_CHILD_DSN]
    _install_uvloop()
    if mode == "--child-drain":
        asyncio.run(_child_drain(concurrency, dsn))
    elif mode == "--child-latency":
        asyncio.run(_latency_child(dsn, concurrency))
    else:
        raise SystemExit(f"unknown benchmark child mode {mode}")


def cli(argv: list[str] | None = None) -> None:
    """``python -m tools.bench [options]`` (and the children's hidden modes)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0].startswith("--child-"):
        _child_main(argv)
        return
    parser = argparse.ArgumentParser(
        prog="pgfleet bench", description="measure throughput and latency against raw SQL"
    )
    add_arguments(parser)
    main(parser.parse_args(argv))
