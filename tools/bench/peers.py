"""pgfleet against pgqueuer (pinned) and raw SQL, interleaved on one server.

    python -m tools.bench.peers --dsn postgresql://postgres@127.0.0.1:5432/postgres

(`make bench-peers` installs the pinned pgqueuer into .venv first.) Every
measurement runs once per repeat for each contender, one after the other, so
drift on a shared machine hits them alike; the report gives medians, ratios and
CPU per job (client and Postgres). A scratch database is created and dropped.

Contenders and settings (pgqueuer's best ones, per row):
- single enqueue: pgfleet ``Queue.enqueue`` on ``create_pool`` (default wakeups);
  pgqueuer ``Queries.enqueue`` on one connection and on a pool (the faster counts);
  raw SQL: one-row INSERT per commit (``../shared/bench/sol.py``'s single insert).
- batches of 500: ``enqueue_many`` / pgqueuer list enqueue / raw unnest insert.
- drain (no-op jobs, in process): pgfleet ``Worker`` at concurrency 1, 16, 64;
  pgqueuer ``QueueManager.run(mode=drain)`` with ``concurrency_limit=1`` (c1), its
  library defaults and ``batch_size=8, max_concurrent_tasks=16`` (c16: the faster
  counts), ``batch_size=32, max_concurrent_tasks=64`` (c64); raw SQL:
  claim-1000-then-complete on 2 connections (sol.py's drain loop).
- pickup latency at 500 jobs/s (4 paced producers, single-job enqueues, a worker
  process each): a plain run, and one right after TRUNCATE with stale statistics
  (100,000 queued rows analysed, then truncated).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg

from pgfleet import EnqueueRequest, Queue, create_pool
from tools.bench import rawsql
from tools.bench import suite as fb
from tools.devkit import drop_database, guarded

PGQUEUER_VERSION = "1.6.0"
RATE, PRODUCERS = 500, 4
_CHILD_DSN = "PGFLEET_DATABASE_URL"

STALE_FILL_PGFLEET = (
    "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts) "
    "SELECT gen_random_uuid(), 'noop', '{}', 25 FROM generate_series(1, $1)"
)
STALE_FILL_PGQUEUER = (
    "INSERT INTO pgqueuer (priority, entrypoint, payload, status) "
    "SELECT 0, 'noop', NULL, 'queued' FROM generate_series(1, $1)"
)


def _pgqueuer() -> Any:
    try:
        import pgqueuer
    except ImportError:
        raise SystemExit(
            f"pgqueuer is not installed: pip install pgqueuer=={PGQUEUER_VERSION} "
            "(or make bench-peers)"
        ) from None
    installed = importlib.metadata.version("pgqueuer")
    if installed != PGQUEUER_VERSION:
        raise SystemExit(
            f"pgqueuer {installed} is installed; this comparison pins "
            f"{PGQUEUER_VERSION}: pip install pgqueuer=={PGQUEUER_VERSION}"
        )
    return pgqueuer


@dataclass
class Runs:
    values: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)

    def add(self, key: str, value: float, meter: Any = None, jobs: int = 0) -> None:
        self.values.setdefault(key, []).append(value)
        if meter is not None:
            self.cpu.setdefault(key, []).append(meter.per_job(jobs))
        cpu = f"  cpu/job {self.cpu[key][-1]}" if meter is not None else ""
        print(f"    {key:<36} {value:>12,.2f}{cpu}", flush=True)

    def median(self, key: str) -> float:
        return statistics.median(self.values[key])

    def cpu_median(self, key: str) -> tuple[float | None, float | None]:
        runs = self.cpu.get(key)
        if not runs:
            return None, None
        server = [s for _, s in runs if s is not None]
        return (
            statistics.median(c for c, _ in runs),
            statistics.median(server) if len(server) == len(runs) else None,
        )


_METER = getattr(fb, "Cpu", None)  # absent from pgfleet versions before the CPU meter


async def _measure(
    runs: Runs, dsn: str, key: str, jobs: int, fn: Callable[[], Awaitable[Any]]
) -> None:
    """Time fn() (which handles ``jobs`` jobs) and record jobs/s and CPU per job."""
    if _METER is None:
        start = time.perf_counter()
        await fn()
        runs.add(key, jobs / (time.perf_counter() - start))
        return
    async with _METER(dsn) as meter:
        start = time.perf_counter()
        await fn()
        elapsed = time.perf_counter() - start
    runs.add(key, jobs / elapsed, meter, jobs)


# ---------------------------------------------------------------- setup


async def _database(admin_dsn: str, name: str) -> str:
    dsn = await fb._fresh_database(admin_dsn, name)
    conn = await asyncpg.connect(dsn)
    try:
        pgq = _pgqueuer()
        from pgqueuer.db import AsyncpgDriver

        await pgq.Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()
    return dsn


RESET = "TRUNCATE bench_raw.jobs, pgfleet.jobs, pgqueuer, pgqueuer_log; DELETE FROM pgfleet.workers"


# ---------------------------------------------------------------- enqueue


async def enqueue_round(
    runs: Runs, dsn: str, single: int, batch_total: int, flip: bool = False
) -> None:
    from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver

    pgq = _pgqueuer()
    pool = await create_pool(dsn, min_size=2, max_size=2)
    conn = await asyncpg.connect(dsn)
    payload = json.dumps({"n": 1})
    try:

        async def raw_single() -> None:
            for _ in range(single):
                await conn.execute(rawsql.RAW_INSERT_ONE, payload)

        async def fleet_single(held: Any = None) -> None:
            queue = Queue(pool)
            for i in range(single):
                await queue.enqueue("noop", {"n": i}, connection=held)
            await queue.flush_notifications()

        async def pgq_single(queries: Any) -> None:
            for _ in range(single):
                await queries.enqueue("noop", b'{"n": 1}')

        async def raw_batch() -> None:
            for _ in range(0, batch_total, 500):
                await conn.execute(rawsql.RAW_INSERT_MANY, [payload] * 500)

        async def fleet_batch() -> None:
            queue = Queue(pool)
            for start in range(0, batch_total, 500):
                await queue.enqueue_many(
                    [EnqueueRequest("noop", {"n": start + i}) for i in range(500)]
                )
            await queue.flush_notifications()

        async def pgq_batch() -> None:
            queries = pgq.Queries(AsyncpgPoolDriver(pool))
            for _ in range(0, batch_total, 500):
                await queries.enqueue(["noop"] * 500, [b'{"n": 1}'] * 500, [0] * 500)

        steps: list[tuple[str, int, Callable[[], Awaitable[Any]]]] = [
            ("enqueue single raw", single, raw_single),
            ("enqueue single pgfleet pool", single, fleet_single),
            ("enqueue single pgfleet conn", single, lambda: fleet_single(conn)),
            ("enqueue single pgqueuer conn", single, lambda: pgq_single(pgq_queries_conn)),
            ("enqueue single pgqueuer pool", single, lambda: pgq_single(pgq_queries_pool)),
            ("enqueue batch500 raw", batch_total, raw_batch),
            ("enqueue batch500 pgfleet", batch_total, fleet_batch),
            ("enqueue batch500 pgqueuer", batch_total, pgq_batch),
        ]
        pgq_queries_conn = pgq.Queries(AsyncpgDriver(conn))
        pgq_queries_pool = pgq.Queries(AsyncpgPoolDriver(pool))
        for key, jobs, fn in reversed(steps) if flip else steps:
            await pool.execute(RESET)
            await _measure(runs, dsn, key, jobs, fn)
    finally:
        await conn.close()
        await pool.close()


# ---------------------------------------------------------------- drain


async def _fill_pgqueuer(dsn: str, total: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for start in range(0, total, 1000):
            size = min(1000, total - start)
            await conn.execute(
                "INSERT INTO pgqueuer (priority, entrypoint, payload, status) "
                "SELECT 0, 'noop', NULL, 'queued' FROM generate_series(1, $1)",
                size,
            )
    finally:
        await conn.close()


async def _drain_pgqueuer(dsn: str, total: int, settings: dict[str, Any]) -> None:
    pgq = _pgqueuer()
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg.connect(dsn)
    try:
        qm = pgq.QueueManager(pgq.Queries(AsyncpgDriver(conn)))
        done = 0

        @qm.entrypoint("noop", concurrency_limit=settings.pop("concurrency_limit", 0))  # type: ignore[untyped-decorator]  # pgqueuer is imported lazily, as Any
        async def noop(job: Any) -> None:
            nonlocal done
            done += 1

        await qm.run(
            mode=QueueExecutionMode.drain, dequeue_timeout=timedelta(seconds=1), **settings
        )
        if done != total:
            raise RuntimeError(f"pgqueuer drained {done} jobs, expected {total}")
    finally:
        await conn.close()


PGQUEUER_DRAIN = {
    "c1": [{"concurrency_limit": 1, "batch_size": 1}],
    "c16": [{}, {"batch_size": 8, "max_concurrent_tasks": 16}],
    "c64": [{"batch_size": 32, "max_concurrent_tasks": 64}],
}


async def drain_round(runs: Runs, dsn: str, total: int, single_total: int) -> None:
    pool = await create_pool(dsn, min_size=4, max_size=8)
    try:
        await pool.execute(RESET)
        await pool.execute(rawsql.RAW_FILL, total)

        async def raw() -> None:
            await fb._raw_drain(pool, 2, 1000)

        await _measure(runs, dsn, "drain raw claim1000+complete x2", total, raw)
        for level, concurrency in (("c1", 1), ("c16", 16), ("c64", 64)):
            # pgfleet drains the full count at every level (at concurrency 1 it
            # runs thousands of jobs a second: a small count would time start-up);
            # pgqueuer's one-slot drain, at a few hundred a second, gets fewer.
            await pool.execute(RESET)
            await fb._fill(pool, total)

            async def fleet(c: int = concurrency) -> None:
                await fb._drain_in_process(pool, c)

            await _measure(runs, dsn, f"drain {level} pgfleet", total, fleet)
            n = single_total if concurrency == 1 else total
            for i, settings in enumerate(PGQUEUER_DRAIN[level]):
                await pool.execute(RESET)
                await _fill_pgqueuer(dsn, n)

                async def peer(s: dict[str, Any] = settings, jobs: int = n) -> None:
                    await _drain_pgqueuer(dsn, jobs, dict(s))

                await _measure(runs, dsn, f"drain {level} pgqueuer #{i}", n, peer)
    finally:
        await pool.close()


# ---------------------------------------------------------------- pickup latency


async def _pgqueuer_latency_child(dsn: str) -> None:
    pgq = _pgqueuer()
    from pgqueuer.db import AsyncpgDriver

    conn = await asyncpg.connect(dsn)
    out = sys.stdout
    qm = pgq.QueueManager(pgq.Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop")  # type: ignore[untyped-decorator]  # pgqueuer is imported lazily, as Any
    async def noop(job: Any) -> None:
        out.write(f"{job.id} {time.time():.6f}\n")

    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), qm.shutdown.set)
    task = loop.create_task(qm.run())
    await asyncio.sleep(0.5)  # its listener is up once run() has started
    print("ready", flush=True)
    await task
    out.flush()
    await conn.close()


async def _latency(
    dsn: str, child_args: list[str], enqueue: Callable[[], Awaitable[str]], seconds: float
) -> list[float]:
    child = await asyncio.create_subprocess_exec(
        *guarded([sys.executable, *child_args]),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=fb.child_env(dsn),
    )
    assert child.stdout is not None
    assert child.stdin is not None
    if (await child.stdout.readline()).strip() != b"ready":
        raise RuntimeError(f"latency worker {child_args} failed to start")
    started: dict[str, float] = {}

    async def read(stream: asyncio.StreamReader) -> None:
        async for raw in stream:
            job_id, _, at = raw.decode().partition(" ")
            started[job_id] = float(at)

    reader = asyncio.get_running_loop().create_task(read(child.stdout))
    expected = await fb.paced_producers(enqueue, PRODUCERS, RATE, seconds)
    deadline = time.monotonic() + 30
    while len(started.keys() & expected.keys()) < len(expected) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    child.stdin.write(b"stop\n")
    await child.stdin.drain()
    await child.wait()
    await reader
    missing = len(expected) - len(started.keys() & expected.keys())
    if missing:
        raise RuntimeError(f"{missing} jobs did not run ({child_args})")
    return sorted((started[j] - t) * 1000 for j, t in expected.items())


async def latency_round(runs: Runs, dsn: str, seconds: float, stale: bool, flip: bool) -> None:
    pgq = _pgqueuer()
    from pgqueuer.db import AsyncpgPoolDriver

    pool = await create_pool(dsn, min_size=PRODUCERS + 2, max_size=PRODUCERS + 2)
    tag = "stale" if stale else "plain"
    try:
        for peer in ("pgqueuer", "pgfleet") if flip else ("pgfleet", "pgqueuer"):
            await pool.execute(RESET)
            if stale:
                # Statistics analysed over a deep backlog that is gone by the run.
                fill = STALE_FILL_PGFLEET if peer == "pgfleet" else STALE_FILL_PGQUEUER
                await pool.execute(fill, 100_000)
                await pool.execute("ANALYZE pgfleet.jobs; ANALYZE pgqueuer")
                await pool.execute(RESET)
            enqueue: Callable[[], Awaitable[str]]
            if peer == "pgfleet":
                queue = Queue(pool)

                async def enqueue(queue: Queue = queue) -> str:
                    return str(await queue.enqueue("noop", None))

                child = ["-m", "tools.bench", "--child-latency", "16"]
            else:
                queries = pgq.Queries(AsyncpgPoolDriver(pool))

                async def enqueue(queries: Any = queries) -> str:
                    return str((await queries.enqueue("noop", None))[0])

                child = ["-m", "tools.bench.peers", "--child-pgqueuer-latency"]
            delays = await _latency(dsn, child, enqueue, seconds)
            for q in (50, 99):
                runs.add(f"pickup p{q} {tag} {peer}", fb._quantile(delays, q / 100))
    finally:
        await pool.close()


# ---------------------------------------------------------------- report


def _ratio(runs: Runs, a: str, b: str) -> float:
    return runs.median(a) / runs.median(b)


def report(runs: Runs) -> dict[str, Any]:
    best = {
        f"enqueue single {peer}": max(
            runs.median(f"enqueue single {peer} conn"), runs.median(f"enqueue single {peer} pool")
        )
        for peer in ("pgfleet", "pgqueuer")
    }
    for level, settings in PGQUEUER_DRAIN.items():
        best[f"drain {level} pgqueuer"] = max(
            runs.median(f"drain {level} pgqueuer #{i}") for i in range(len(settings))
        )
    m = runs.median
    rows = {
        "enqueue single": (best["enqueue single pgfleet"], best["enqueue single pgqueuer"]),
        "enqueue single, pool": (
            m("enqueue single pgfleet pool"),
            m("enqueue single pgqueuer pool"),
        ),
        "enqueue single, one connection": (
            m("enqueue single pgfleet conn"),
            m("enqueue single pgqueuer conn"),
        ),
        "enqueue batches of 500": (m("enqueue batch500 pgfleet"), m("enqueue batch500 pgqueuer")),
        "drain c1": (m("drain c1 pgfleet"), best["drain c1 pgqueuer"]),
        "drain c16": (m("drain c16 pgfleet"), best["drain c16 pgqueuer"]),
        "drain c64": (m("drain c64 pgfleet"), best["drain c64 pgqueuer"]),
    }
    print("\nmedians (pgfleet / pgqueuer; a row without a setting: each at its best)")
    out: dict[str, Any] = {"rows": {}, "criteria": {}}
    for name, (fleet, peer) in rows.items():
        print(f"  {name:<28} {fleet:>10,.0f}/s {peer:>10,.0f}/s   {fleet / peer:5.2f}x")
        out["rows"][name] = {"pgfleet": fleet, "pgqueuer": peer, "ratio": fleet / peer}
    for tag in ("plain", "stale"):
        key = f"pickup p99 {tag}"
        if f"{key} pgfleet" in runs.values:
            fleet, peer = m(f"{key} pgfleet"), m(f"{key} pgqueuer")
            p50 = m(f"pickup p50 {tag} pgfleet"), m(f"pickup p50 {tag} pgqueuer")
            print(
                f"  pickup p50/p99 {tag:<14} {p50[0]:.1f}/{fleet:.1f} ms  "
                f"{p50[1]:.1f}/{peer:.1f} ms   {fleet / peer:5.2f}x p99"
            )
            out["rows"][f"pickup {tag}"] = {
                "pgfleet_p50": p50[0],
                "pgfleet_p99": fleet,
                "pgqueuer_p50": p50[1],
                "pgqueuer_p99": peer,
                "ratio_p99": fleet / peer,
            }
    print("\nCPU per job, ms (client, postgres), medians")
    for key in sorted(runs.cpu):
        client, server = runs.cpu_median(key)
        srv = "n/a" if server is None else f"{server:.3f}"
        print(f"  {key:<36} {client:.3f}  {srv}")
        out.setdefault("cpu", {})[key] = {"client_ms": client, "postgres_ms": server}
    raw_single = m("enqueue single raw")
    raw_drain = m("drain raw claim1000+complete x2")
    criteria = {
        "drain c16 >= 2x pgqueuer's fastest": rows["drain c16"][0] / rows["drain c16"][1],
        "drain c1 >= 0.8x raw single commit": rows["drain c1"][0] / raw_single,
        "drain c64 >= 0.6x raw claim+complete": rows["drain c64"][0] / raw_drain,
        "enqueue single >= 1.1x pgqueuer": rows["enqueue single"][0] / rows["enqueue single"][1],
        "enqueue single >= 0.9x raw single insert": rows["enqueue single"][0] / raw_single,
    }
    for tag in ("plain", "stale"):
        if f"pickup {tag}" in out["rows"]:
            criteria[f"pickup p99 {tag} <= 0.5x pgqueuer"] = out["rows"][f"pickup {tag}"][
                "ratio_p99"
            ]
    print("\nthe issue's criteria (ratios)")
    for name, value in criteria.items():
        print(f"  {name:<44} {value:6.2f}")
    out["criteria"] = criteria
    out["raw"] = {"single insert": raw_single, "claim+complete x2": raw_drain}
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    _pgqueuer()
    dsn = await _database(args.dsn, args.database)
    runs = Runs()
    try:
        admin = await asyncpg.connect(dsn)
        try:
            server = await admin.fetchval("SHOW server_version")
            settings = {
                r["name"]: r["setting"]
                for r in await admin.fetch(
                    "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])",
                    [
                        "fsync",
                        "synchronous_commit",
                        "shared_buffers",
                        "jit",
                        "max_connections",
                        "wal_level",
                    ],
                )
            }
        finally:
            await admin.close()
        print(f"PostgreSQL {server} {settings}; pgqueuer {PGQUEUER_VERSION}", flush=True)
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}/{args.repeats}", flush=True)
            if "enqueue" in args.suites:
                await enqueue_round(runs, dsn, args.single, args.batch_total, rep % 2 == 1)
            if "drain" in args.suites:
                await drain_round(runs, dsn, args.drain_total, args.single_drain_total)
            if "latency" in args.suites:
                # Who goes first alternates between repeats (checkpoints, neighbours).
                flip = rep % 2 == 1
                await latency_round(runs, dsn, args.latency_seconds, stale=False, flip=flip)
                await latency_round(runs, dsn, args.latency_seconds, stale=True, flip=flip)
        result = report(runs) if set(args.suites) >= {"enqueue", "drain"} else {}
        result.update(
            {
                "runs": runs.values,
                "postgres": server,
                "settings": settings,
                "machine": {
                    "python": sys.version.split()[0],
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                },
                "repeats": args.repeats,
            }
        )
        return result
    finally:
        if not args.keep:
            await drop_database(args.dsn, args.database)


def cli(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child-pgqueuer-latency"]:
        asyncio.run(_pgqueuer_latency_child(os.environ[_CHILD_DSN]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGFLEET_BENCH_DSN"), required=False)
    parser.add_argument("--database", default="pgfleet_peers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--suites", default="enqueue,drain,latency")
    parser.add_argument("--single", type=int, default=2000, help="single enqueues per run")
    parser.add_argument("--batch-total", type=int, default=20_000)
    parser.add_argument("--drain-total", type=int, default=20_000)
    parser.add_argument(
        "--single-drain-total", type=int, default=3000, help="jobs of pgqueuer's c1 drain"
    )
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("--dsn (or PGFLEET_BENCH_DSN) is required")
    args.suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    result = asyncio.run(main(args))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2, default=str)
        print(f"wrote {args.json_path}")


if __name__ == "__main__":
    cli()
