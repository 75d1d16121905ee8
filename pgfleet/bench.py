"""``pgfleet bench``: reproducible throughput and latency measurements.

Each measurement is repeated and reported as a median, next to a raw-SQL reference
run in the same process and the same minute (alternating runs), so the ratio holds
on a noisy machine even when absolute numbers drift. The benchmark creates its own
database on the server it is given and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from pgfleet.db import benchsql
from pgfleet.db.migrate import migrate
from pgfleet.jobs import EnqueueRequest
from pgfleet.queue import NotifyMode, Queue, create_pool

SUITES = ("enqueue",)


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

    def n(self, count: int) -> int:
        return max(1, int(count * self.scale))

    def add(self, result: Result) -> None:
        self.results.append(result)
        line = f"  {result.name:<44} median {result.median:>11,.0f} {result.unit}"
        print(line + f"   runs {[round(r) for r in result.runs]}", flush=True)


def _with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


async def _fresh_database(admin_dsn: str, name: str) -> str:
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(benchsql.drop_database(name))
        await admin.execute(benchsql.create_database(name))
    finally:
        await admin.close()
    dsn = _with_database(admin_dsn, name)
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
        await conn.execute(benchsql.RAW_SCHEMA)
    finally:
        await conn.close()
    return dsn


async def _reset(pool: asyncpg.Pool) -> None:
    await pool.execute(benchsql.RESET)


async def _timed(fn: Callable[[], Awaitable[int]]) -> float:
    start = time.perf_counter()
    count = await fn()
    return count / (time.perf_counter() - start)


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
            record("raw single", await _timed(lambda: _raw_single(held, single_n)))
            for key, queue, conn in (
                ("single held", Queue(light), held),
                ("single held off", Queue(light, notify=NotifyMode.OFF), held),
                ("single pool", Queue(light), None),
                ("single pool off", Queue(light, notify=NotifyMode.OFF), None),
                ("single default pool", Queue(default), None),
            ):
                await _reset(light)
                record(key, await _timed(functools.partial(_single, queue, single_n, conn)))
            await _reset(light)
            record("raw batch", await _timed(lambda: _raw_batch(held, batch_total, batch_size)))
            for key, mode in (("batch", NotifyMode.COALESCED), ("batch off", NotifyMode.OFF)):
                await _reset(light)
                queue = Queue(light, notify=mode)
                record(key, await _timed(functools.partial(_batch, queue, batch_total, batch_size)))
            await _reset(big)
            record("raw 32 producers", await _concurrent(big, producers, seconds, None))
            for mode in (NotifyMode.COALESCED, NotifyMode.TRANSACTION, NotifyMode.OFF):
                await _reset(big)
                record(
                    f"32 producers {mode.value}",
                    await _concurrent(big, producers, seconds, Queue(big, notify=mode)),
                )
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
        bench.add(Result(key, unit, runs[key], reference=ref, extra={"title": title}))


async def _raw_single(conn: Any, n: int) -> int:
    payload = json.dumps({"n": 1})
    for _ in range(n):
        await conn.execute(benchsql.RAW_INSERT_ONE, payload)
    return n


async def _single(queue: Queue, n: int, conn: Any = None) -> int:
    for i in range(n):
        await queue.enqueue("noop", {"n": i}, connection=conn)
    await queue.flush_notifications()
    return n


async def _raw_batch(conn: Any, total: int, size: int) -> int:
    payload = json.dumps({"n": 1})
    for _ in range(0, total, size):
        await conn.execute(benchsql.RAW_INSERT_MANY, [payload] * size)
    return total


async def _batch(queue: Queue, total: int, size: int) -> int:
    for start in range(0, total, size):
        await queue.enqueue_many([EnqueueRequest("noop", {"n": start + i}) for i in range(size)])
    await queue.flush_notifications()
    return total


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
                await conn.execute(benchsql.RAW_INSERT_ONE, payload)
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


# ---------------------------------------------------------------- report


def _report(bench: Bench) -> dict[str, Any]:
    by_name = {r.name: r for r in bench.results}
    rows = []
    print("\nsummary (medians)")
    for r in bench.results:
        ratio = None
        if r.reference and r.reference in by_name:
            ratio = r.median / by_name[r.reference].median
        title = r.extra.get("title", r.name)
        tail = f"  {ratio:6.0%} of {r.reference}" if ratio is not None else ""
        print(f"  {title:<48} {r.median:>11,.0f} {r.unit}{tail}")
        rows.append(
            {
                "name": r.name,
                "title": title,
                "unit": r.unit,
                "median": r.median,
                "runs": r.runs,
                "reference": r.reference,
                "ratio": ratio,
                **{k: v for k, v in r.extra.items() if k != "title"},
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
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args.dsn, args.repeats, args.scale)
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
            admin = await asyncpg.connect(args.dsn)
            try:
                await admin.execute(benchsql.drop_database(args.database))
            finally:
                await admin.close()


SUITE_FUNCTIONS: dict[str, Callable[[Bench, str], Awaitable[None]]] = {
    "enqueue": suite_enqueue,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suites", default=",".join(SUITES), help=f"comma list of {SUITES}")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the job counts")
    parser.add_argument("--database", default="pgfleet_bench", help="database to create and drop")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database")
    parser.add_argument("--json", dest="json_path", help="write the results here as JSON")


def main(args: argparse.Namespace) -> None:
    args.suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in args.suites if s not in SUITE_FUNCTIONS]
    if unknown:
        raise SystemExit(
            f"pgfleet bench: unknown suites {unknown}; choose from {list(SUITE_FUNCTIONS)}"
        )
    if args.repeats < 1 or args.scale <= 0:
        raise SystemExit("pgfleet bench: --repeats must be >= 1 and --scale > 0")
    report = asyncio.run(run(args))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, default=str)
        print(f"wrote {args.json_path}")
