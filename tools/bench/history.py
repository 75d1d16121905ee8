"""History in day partitions, measured (issue 31).

- prune: 1,000,000 finished jobs past the retention removed by the leader's old
  way (batched DELETEs of 1,000 on pgfleet.jobs, then the VACUUM they call for)
  against dropping the day partition of pgfleet.jobs_history that holds them:
  time and WAL bytes (``pg_current_wal_lsn()`` before and after), each repeated;
- migration: 0010 applied on a jobs table of 1,000,000 finished jobs;
- claim: drain rate at 16 slots with 10,000,000 finished jobs in history against
  an empty history, in two databases drained alternately.

Run it under the bench lock: ``flock /tmp/pgfleet-bench.lock .venv/bin/python -m
tools.bench.history --dsn ...``. Prints medians and ratios, and JSON with every run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

import asyncpg

from pgfleet import (
    EnqueueRequest,
    Job,
    NotifyMode,
    Queue,
    Registry,
    Worker,
    WorkerConfig,
    migrations,
)
from pgfleet import migrate as pgfleet_migrate
from pgfleet.db.store import Store

RESET = "TRUNCATE pgfleet.jobs, pgfleet.job_dependencies, pgfleet.jobs_history"
WAL = "SELECT pg_current_wal_lsn()"
WAL_BYTES = "SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::bigint"
#: Finished jobs of one UTC day 40 days ago (past a 30-day retention), $1 of them,
#: into the table named first.
FINISHED = """ (id, name, payload, status, attempt, max_attempts, run_at, created_at,
               started_at, finished_at)
SELECT gen_random_uuid(), 'noop', '{}'::jsonb, 'succeeded'::pgfleet.job_status, 1, 25,
       t, t, t, t
FROM (SELECT date_trunc('day', now() - interval '40 days') + make_interval(secs => g % 86000)
             AS t
      FROM generate_series(1, $1) AS g) s
"""
RETENTION = 30 * 86400.0
#: $1 finished jobs spread over the last ten days, into history (one statement).
HISTORY_FILL = """
INSERT INTO pgfleet.jobs_history (id, name, payload, status, attempt, max_attempts, run_at,
                                  created_at, started_at, finished_at)
SELECT gen_random_uuid(), 'noop', '{}'::jsonb, 'succeeded', 1, 25, t, t, t, t
FROM (SELECT now() - make_interval(secs => g * (864000.0 / $1)) AS t
      FROM generate_series(1, $1) AS g) s
"""


def _registry() -> Registry:
    registry = Registry()

    @registry.job("noop")
    async def noop(job: Job) -> None:
        return None

    return registry


async def _database(admin: asyncpg.Connection, dsn: str, name: str) -> str:
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.execute(f'CREATE DATABASE "{name}"')
    target = dsn.rsplit("/", 1)[0] + "/" + name
    conn = await asyncpg.connect(target)
    try:
        await pgfleet_migrate(conn)
    finally:
        await conn.close()
    return target


async def _wal_and_time(pool: asyncpg.Pool, work: Any) -> tuple[float, int]:
    await pool.execute("CHECKPOINT")
    before = await pool.fetchval(WAL)
    start = time.perf_counter()
    await work()
    elapsed = time.perf_counter() - start
    after = await pool.fetchval(WAL)
    return elapsed, int(await pool.fetchval(WAL_BYTES, before, after))


async def prune(pool: asyncpg.Pool, rows: int, repeats: int) -> dict[str, list[float]]:
    store = Store(pool)
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        # Today's way: the Pruner's batched DELETE on pgfleet.jobs, then VACUUM.
        await pool.execute(RESET)
        await pool.execute("INSERT INTO pgfleet.jobs" + FINISHED, rows)
        await pool.execute("VACUUM (ANALYZE) pgfleet.jobs")

        async def delete() -> None:
            while await store.job_prune_finished(older_than_seconds=RETENTION, batch_size=1000):
                pass

        async def vacuum() -> None:
            await pool.execute("VACUUM pgfleet.jobs")

        seconds, wal = await _wal_and_time(pool, delete)
        vseconds, vwal = await _wal_and_time(pool, vacuum)
        runs.setdefault("delete s", []).append(seconds)
        runs.setdefault("delete WAL bytes", []).append(wal)
        runs.setdefault("delete's vacuum s", []).append(vseconds)
        runs.setdefault("delete's vacuum WAL bytes", []).append(vwal)

        # History: the same rows in their day's partition, dropped whole.
        await pool.execute(RESET)
        await pool.execute(
            "SELECT pgfleet.jobs_history_add_day((now() - interval '40 days')::date)"
        )
        await pool.execute("INSERT INTO pgfleet.jobs_history" + FINISHED, rows)
        await pool.execute("VACUUM (ANALYZE) pgfleet.jobs_history")

        async def drop() -> None:
            dropped = await store.jobs_history_drop(older_than_seconds=RETENTION)
            assert len(dropped) == 1, dropped

        seconds, wal = await _wal_and_time(pool, drop)
        runs.setdefault("drop s", []).append(seconds)
        runs.setdefault("drop WAL bytes", []).append(wal)
    await pool.execute(RESET)
    return runs


UNDO_0010 = """
DROP VIEW pgfleet.jobs_all; DROP TABLE pgfleet.jobs_history;
DROP FUNCTION pgfleet.jobs_history_drop, pgfleet.jobs_history_prepare, pgfleet.job_status_now,
              pgfleet.jobs_history_add_day;
DELETE FROM pgfleet.schema_migrations WHERE version = $1
"""
#: The history migration's number (read, so a renumbering needs no edit here).
HISTORY_VERSION = next(m.version for m in migrations() if m.name == "history_partitions")


async def migration(pool: asyncpg.Pool, rows: int, repeats: int) -> dict[str, list[float]]:
    """Migration 0010 applied (and undone between runs) on a jobs table of ``rows``
    finished jobs."""
    await pool.execute(RESET)
    await pool.execute("INSERT INTO pgfleet.jobs" + FINISHED, rows)
    await pool.execute("VACUUM (ANALYZE) pgfleet.jobs")
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        async with pool.acquire() as conn:
            for statement in UNDO_0010.split(";")[:-1]:
                await conn.execute(statement)
            await conn.execute(UNDO_0010.split(";")[-1], HISTORY_VERSION)
        start = time.perf_counter()
        assert await pgfleet_migrate(pool) == [HISTORY_VERSION]
        runs.setdefault("migration 0010 s", []).append(time.perf_counter() - start)
    await pool.execute(RESET)
    return runs


async def _fill_queued(pool: asyncpg.Pool, total: int) -> None:
    queue = Queue(pool, notify=NotifyMode.OFF)
    for start in range(0, total, 1000):
        size = min(1000, total - start)
        await queue.enqueue_many([EnqueueRequest("noop", None) for _ in range(size)])


async def _drain(pool: asyncpg.Pool, concurrency: int) -> float:
    config = WorkerConfig(
        concurrency=concurrency,
        finished_job_retention=None,
        history_move_after=None,
        poll_interval=0.5,
        heartbeat_interval=5,
        dead_worker_timeout=30,
    )
    worker = Worker(pool, _registry(), config)
    start = time.perf_counter()
    stats = await worker.run(burst=True)
    return stats.succeeded / (time.perf_counter() - start)


async def claim(
    empty: asyncpg.Pool, full: asyncpg.Pool, history: int, total: int, repeats: int
) -> dict[str, list[float]]:
    await full.execute(RESET)
    await full.execute("SELECT pgfleet.jobs_history_prepare(current_date - 11, 7)")
    start = time.perf_counter()
    await full.execute(HISTORY_FILL, history)
    await full.execute("VACUUM (ANALYZE) pgfleet.jobs_history")
    print(f"filled history with {history:,} rows in {time.perf_counter() - start:.0f} s")
    runs: dict[str, list[float]] = {}
    for _ in range(repeats):
        for label, pool in (("empty history", empty), ("history", full)):
            await pool.execute("TRUNCATE pgfleet.jobs, pgfleet.job_dependencies")
            await pool.execute("DELETE FROM pgfleet.workers; DELETE FROM pgfleet.leader")
            await _fill_queued(pool, total)
            await pool.execute("VACUUM (ANALYZE) pgfleet.jobs")
            runs.setdefault(f"drain c16, {label} jobs/s", []).append(await _drain(pool, 16))
    return runs


async def main(args: argparse.Namespace) -> dict[str, Any]:
    admin = await asyncpg.connect(args.dsn)
    try:
        a = await _database(admin, args.dsn, f"pgfleet_history_a{os.getpid()}")
        b = await _database(admin, args.dsn, f"pgfleet_history_b{os.getpid()}")
    finally:
        await admin.close()
    out: dict[str, Any] = {}
    pa = await asyncpg.create_pool(a, min_size=2, max_size=8)
    pb = await asyncpg.create_pool(b, min_size=2, max_size=8)
    try:
        if "migration" in args.parts:
            out.update(await migration(pa, args.prune_rows, args.repeats))
        if "prune" in args.parts:
            out.update(await prune(pa, args.prune_rows, args.repeats))
        if "claim" in args.parts:
            out.update(await claim(pa, pb, args.history_rows, args.drain_jobs, args.repeats))
    finally:
        await pa.close()
        await pb.close()
        admin = await asyncpg.connect(args.dsn)
        try:
            for name in (f"pgfleet_history_a{os.getpid()}", f"pgfleet_history_b{os.getpid()}"):
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
    return out


def report(runs: dict[str, Any]) -> None:
    medians = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in runs.items():
        print(f"{k:38} median {medians[k]:>16,.3f}   runs {[round(x, 3) for x in v]}")
    if "drop s" in medians:
        print(f"delete/drop time ratio: {medians['delete s'] / medians['drop s']:,.0f}x")
        wal = medians["delete WAL bytes"] / medians["drop WAL bytes"]
        print(f"delete/drop WAL ratio: {wal:,.0f}x")
    key_h, key_e = "drain c16, history jobs/s", "drain c16, empty history jobs/s"
    if key_h in medians:
        print(f"claim rate with history / empty: {medians[key_h] / medians[key_e]:.3f}")
        pairs = [h / e for h, e in zip(runs[key_h], runs[key_e], strict=True)]
        print(
            f"  per interleaved pair: {[round(r, 3) for r in pairs]}, median "
            f"{statistics.median(pairs):.3f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--parts", default="prune,claim")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prune-rows", type=int, default=1_000_000)
    parser.add_argument("--history-rows", type=int, default=10_000_000)
    parser.add_argument("--drain-jobs", type=int, default=20_000)
    parser.add_argument("--json", default=None)
    arguments = parser.parse_args()
    result = asyncio.run(main(arguments))
    report(result)
    if arguments.json:
        with open(arguments.json, "w") as f:
            json.dump(result, f, indent=2)
