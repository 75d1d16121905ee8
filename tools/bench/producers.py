"""Single-enqueue throughput of every producer, interleaved rounds, medians.

``python -m tools.bench.producers --dsn postgresql://.../mydb [--rounds 3] [--n 3000]
[--only queue]``: one producer, one connection, one job per commit (autocommit), for
``Queue.enqueue`` (on ``pgfleet.create_pool`` and on a held connection), the psycopg
producers (sync and async) and a bare psycopg insert of the same row (sync and async:
what the driver costs before pgfleet adds anything). Each rate is also given as the
median of its per-round ratio to the bare sync insert. The table is
emptied before each measurement. ``--only queue`` measures Queue alone (what an
older checkout has, for an A/B run with ``PYTHONPATH``). Run under
``flock /tmp/pgfleet-bench.lock`` on a database of your own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

import pgfleet

BARE_INSERT = (
    "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts) VALUES ($1, $2, $3::jsonb, 25)"
)


async def _queue(dsn: str, n: int, held: bool) -> float:
    pool = await pgfleet.create_pool(dsn, min_size=1, max_size=2)
    try:
        queue = pgfleet.Queue(pool)
        async with pool.acquire() as conn:
            start = time.perf_counter()
            for i in range(n):
                await queue.enqueue("bench", {"n": i}, connection=conn if held else None)
            return n / (time.perf_counter() - start)
    finally:
        await pool.close()


async def _psycopg_async(dsn: str, n: int) -> float:
    import psycopg

    from pgfleet.contrib.psycopg import AsyncProducer

    producer = AsyncProducer()
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        start = time.perf_counter()
        for i in range(n):
            await producer.enqueue(conn, "bench", {"n": i})
        return n / (time.perf_counter() - start)


def _psycopg_sync(dsn: str, n: int) -> float:
    import psycopg

    from pgfleet.contrib.psycopg import Producer

    producer = Producer()
    with psycopg.connect(dsn, autocommit=True) as conn:
        start = time.perf_counter()
        for i in range(n):
            producer.enqueue(conn, "bench", {"n": i})
        return n / (time.perf_counter() - start)


def _bare_psycopg(dsn: str, n: int) -> float:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.RawCursor(conn) as cur:
        start = time.perf_counter()
        for i in range(n):
            cur.execute(BARE_INSERT, (uuid.uuid4(), "bench", json.dumps({"n": i})))
        return n / (time.perf_counter() - start)


async def _bare_psycopg_async(dsn: str, n: int) -> float:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with conn, psycopg.AsyncRawCursor(conn) as cur:
        start = time.perf_counter()
        for i in range(n):
            await cur.execute(BARE_INSERT, (uuid.uuid4(), "bench", json.dumps({"n": i})))
        return n / (time.perf_counter() - start)


async def _empty(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE pgfleet.jobs, pgfleet.job_dependencies")
        await conn.execute("VACUUM ANALYZE pgfleet.jobs")
    finally:
        await conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["queue"], default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    pool = await asyncpg.create_pool(args.dsn, min_size=1, max_size=1)
    await pgfleet.migrate(pool)
    await pool.close()
    runs: dict[str, Callable[[], Awaitable[float]]] = {
        "Queue.enqueue (pool)": lambda: _queue(args.dsn, args.n, held=False),
        "Queue.enqueue (held connection)": lambda: _queue(args.dsn, args.n, held=True),
    }
    if args.only is None:
        runs["psycopg AsyncProducer"] = lambda: _psycopg_async(args.dsn, args.n)
        runs["psycopg Producer (sync)"] = lambda: asyncio.to_thread(_psycopg_sync, args.dsn, args.n)
        runs["bare psycopg insert"] = lambda: asyncio.to_thread(_bare_psycopg, args.dsn, args.n)
        runs["bare psycopg async insert"] = lambda: _bare_psycopg_async(args.dsn, args.n)
    found: dict[str, list[float]] = {key: [] for key in runs}
    for _ in range(args.rounds):
        for key, run in runs.items():
            await _empty(args.dsn)
            found[key].append(await run())
    out: dict[str, Any] = {}
    # Each round's rate over the same round's reference (bare insert, else the pool's
    # Queue.enqueue): a burst of noise moves both sides of a ratio.
    reference = "bare psycopg insert" if "bare psycopg insert" in found else "Queue.enqueue (pool)"
    for key, values in found.items():
        median = statistics.median(values)
        ratios = [v / r for v, r in zip(values, found[reference], strict=True)]
        ratio = statistics.median(ratios)
        out[key] = {
            "median": round(median),
            "runs": [round(v) for v in values],
            f"ratio to {reference}": round(ratio, 2),
        }
        print(
            f"{key:34s} {median:8.0f} jobs/s  x{ratio:4.2f} of {reference}  "
            f"runs {[round(v) for v in values]}"
        )
    if args.json:
        await asyncio.to_thread(Path(args.json).write_text, json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
