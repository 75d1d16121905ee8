"""The fleet's own numbers, sampled from Postgres while Locust runs.

Everything is measured on the database clock. Postgres CPU is read from
``/proc/<pid>/stat`` (utime + stime) of the server's processes, which works when
the server runs on this machine (the native fleet, the embedded server);
``pg_stat_statements`` is not used because it needs a server restart to preload.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from tools.devkit import until

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# Runnable backlog (partial index jobs_runnable), its oldest job, and running jobs.
QUEUE_SAMPLE = """
SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8 AS t,
       count(*) FILTER (WHERE run_at <= now()) AS runnable,
       COALESCE(EXTRACT(EPOCH FROM now() - min(run_at) FILTER (WHERE run_at <= now())), 0)::float8
           AS oldest_age,
       (SELECT count(*) FROM pgfleet.jobs WHERE status = 'running') AS running
FROM pgfleet.jobs WHERE status = 'queued'
"""

# The claim table (pgfleet.jobs) and the history its finished jobs move to.
TABLE_SAMPLE = """
SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8 AS t,
       pg_total_relation_size('pgfleet.jobs') AS total_bytes,
       pg_relation_size('pgfleet.jobs') AS heap_bytes,
       pg_indexes_size('pgfleet.jobs') AS index_bytes,
       s.n_live_tup AS live_tuples, s.n_dead_tup AS dead_tuples,
       s.vacuum_count + s.autovacuum_count AS vacuums,
       s.autovacuum_count AS autovacuums,
       s.n_tup_ins AS inserted, s.n_tup_del AS deleted,
       COALESCE(h.bytes, 0) AS history_bytes, COALESCE(h.inserted, 0) AS history_inserted
FROM pg_stat_user_tables s
LEFT JOIN LATERAL (
    SELECT sum(pg_total_relation_size(i.inhrelid))::bigint AS bytes,
           sum(COALESCE(hs.n_tup_ins, 0))::bigint AS inserted
    FROM pg_inherits i LEFT JOIN pg_stat_user_tables hs ON hs.relid = i.inhrelid
    WHERE i.inhparent = to_regclass('pgfleet.jobs_history')
) h ON true
WHERE s.relid = 'pgfleet.jobs'::regclass
"""

# The server's checkpoints (how many, milliseconds spent writing and syncing them) and
# the WAL it wrote: cluster-wide counters, which the soak plots against claim latency.
# Postgres 17 moved the checkpoint counters to pg_stat_checkpointer.
SERVER_SAMPLE = """
SELECT b.checkpoints_timed + b.checkpoints_req AS checkpoints,
       b.checkpoint_write_time + b.checkpoint_sync_time AS checkpoint_ms,
       (SELECT wal_bytes FROM pg_stat_wal)::float8 AS wal_bytes
FROM pg_stat_bgwriter b
"""
SERVER_SAMPLE_17 = """
SELECT c.num_timed + c.num_requested AS checkpoints,
       c.write_time + c.sync_time AS checkpoint_ms,
       (SELECT wal_bytes FROM pg_stat_wal)::float8 AS wal_bytes
FROM pg_stat_checkpointer c
"""

# Claim latency (due to started) percentiles and jobs finished, per window of $2
# seconds from $3, of the jobs created since $1, over the jobs and their history.
WINDOWS = """
WITH j AS (
    SELECT EXTRACT(EPOCH FROM started_at)::float8 AS started,
           EXTRACT(EPOCH FROM finished_at)::float8 AS finished,
           EXTRACT(EPOCH FROM started_at - run_at)::float8 AS delay
    FROM pgfleet.jobs_all WHERE created_at >= to_timestamp($1) AND started_at IS NOT NULL
), latency AS (
    SELECT floor((started - $3) / $2)::int AS w, count(*) AS started_n,
           percentile_cont(ARRAY[0.5, 0.9, 0.99]) WITHIN GROUP (ORDER BY delay) AS p
    FROM j GROUP BY 1
), drained AS (
    SELECT floor((finished - $3) / $2)::int AS w, count(*) AS finished_n
    FROM j WHERE finished IS NOT NULL GROUP BY 1
)
SELECT w, COALESCE(started_n, 0) AS started, COALESCE(finished_n, 0) AS finished, p
FROM latency FULL JOIN drained USING (w) ORDER BY w
"""

# Jobs finished and jobs created between $1 and $2 (epoch seconds), history included:
# the end-to-end capacity measurement's.
FLOW_BETWEEN = """
SELECT count(*) FILTER (WHERE finished_at >= to_timestamp($1)
                          AND finished_at < to_timestamp($2)) AS finished,
       count(*) FILTER (WHERE created_at >= to_timestamp($1)
                          AND created_at < to_timestamp($2)) AS created
FROM pgfleet.jobs_all WHERE created_at >= to_timestamp($1) - interval '1 hour'
"""

# A backlog due together at $2 (epoch seconds): the capacity measurement's.
CAPACITY_FILL = """
INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, run_at)
SELECT gen_random_uuid(), 'noop', 'null'::jsonb, 1, to_timestamp($2)
FROM generate_series(1, $1)
"""

# The processes whose CPU a run costs: client backends of this database (other
# databases on a shared server are someone else's) and the server's background
# processes (WAL writer, checkpointer, ...), minus the sampler's own backend.
CPU_PIDS = """
SELECT pid, backend_type = 'client backend' AND datname = current_database() AS ours
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND (datname = current_database() OR datname IS NULL)
"""

STATUS_COUNTS = """
SELECT status::text AS status, count(*) AS n FROM pgfleet.jobs_all
WHERE created_at >= to_timestamp($1) GROUP BY status
"""

PICKUP = """
SELECT count(*) AS n,
       percentile_cont(ARRAY[0.5, 0.9, 0.95, 0.99]) WITHIN GROUP (ORDER BY d) AS p,
       max(d) AS max
FROM (SELECT EXTRACT(EPOCH FROM started_at - run_at)::float8 AS d FROM pgfleet.jobs_all
      WHERE created_at >= to_timestamp($1) AND started_at IS NOT NULL) AS delays
"""

CREATED_SPAN = """
SELECT count(*) AS n, EXTRACT(EPOCH FROM max(created_at) - min(created_at))::float8 AS span
FROM pgfleet.jobs WHERE created_at >= to_timestamp($1)
"""

DRAIN_SPAN = """
SELECT count(*) AS n,
       EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 AS span
FROM pgfleet.jobs WHERE status = 'succeeded'
"""


def proc_ticks(pid: int) -> int | None:
    """utime + stime of a process in clock ticks, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _is_postgres_process(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().startswith("postgres")
    except OSError:
        return False


async def server_is_local(conn: asyncpg.Connection) -> bool:
    """Whether our own backend is a process of this machine (so /proc has its CPU)."""
    return _is_postgres_process(await conn.fetchval("SELECT pg_backend_pid()"))


@dataclass
class CpuMeter:
    """Postgres CPU over a window. Each sample records every relevant process;
    a process's CPU is its last reading minus its first (0 for one born inside the
    window), so backends that exit between samples lose only their last interval."""

    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    ours: set[int] = field(default_factory=set)
    started: bool = False

    async def sample(self, conn: asyncpg.Connection) -> None:
        for row in await conn.fetch(CPU_PIDS):
            ticks = proc_ticks(row["pid"])
            if ticks is None:
                continue
            if row["pid"] not in self.first:
                self.first[row["pid"]] = ticks if not self.started else 0
            self.last[row["pid"]] = ticks
            if row["ours"]:
                self.ours.add(row["pid"])
        self.started = True

    def seconds(self) -> dict[str, float]:
        backends = background = 0
        for pid, last in self.last.items():
            used = last - self.first[pid]
            if pid in self.ours:
                backends += used
            else:
                background += used
        return {
            "backends": backends / CLOCK_TICKS,
            "background": background / CLOCK_TICKS,
            "total": (backends + background) / CLOCK_TICKS,
        }


class Sampler:
    """Takes a row every ``interval`` seconds in a background task while a run goes on."""

    def __init__(
        self,
        dsn: str,
        interval: float,
        *,
        queue: bool = True,
        table: bool = False,
        cpu: CpuMeter | None = None,
    ) -> None:
        self._dsn = dsn
        self._interval = interval
        self._queue = queue
        self._table = table
        self._cpu = cpu
        self.rows: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._server_sample = SERVER_SAMPLE

    async def __aenter__(self) -> Sampler:
        self._conn = await asyncpg.connect(self._dsn)
        version = self._conn.get_server_version().major
        self._server_sample = SERVER_SAMPLE_17 if version >= 17 else SERVER_SAMPLE
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        assert self._conn is not None
        self._task.cancel()
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self.take()  # a last row at the end of the window
        finally:
            await self._conn.close()

    async def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            await self.take()
            next_at += self._interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def take(self) -> None:
        assert self._conn is not None
        row: dict[str, Any] = {}
        if self._queue:
            row.update(dict(await one_row(self._conn, QUEUE_SAMPLE)))
        if self._table:
            row.update(dict(await one_row(self._conn, TABLE_SAMPLE)))
            row.update(dict(await one_row(self._conn, self._server_sample)))
        if self._cpu is not None:
            await self._cpu.sample(self._conn)
        if row:
            self.rows.append(row)


async def one_row(conn: asyncpg.Connection, query: str, *args: object) -> asyncpg.Record:
    """The row of a query that always returns one (the samples are aggregates)."""
    row = await conn.fetchrow(query, *args)
    if row is None:
        raise RuntimeError(f"expected one row, got none from: {query.strip().splitlines()[0]}")
    return row


async def db_now(conn: asyncpg.Connection) -> float:
    return float(await conn.fetchval("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8"))


async def status_counts(conn: asyncpg.Connection, since: float) -> dict[str, int]:
    return {r["status"]: int(r["n"]) for r in await conn.fetch(STATUS_COUNTS, since)}


async def pickup_delays(conn: asyncpg.Connection, since: float) -> dict[str, Any]:
    row = await one_row(conn, PICKUP, since)
    p = row["p"] or [None] * 4
    return {
        "jobs": int(row["n"]),
        "p50": p[0],
        "p90": p[1],
        "p95": p[2],
        "p99": p[3],
        "max": row["max"],
    }


async def windows(
    conn: asyncpg.Connection, since: float, window: float, origin: float | None = None
) -> list[dict[str, Any]]:
    """Per window of ``window`` seconds from ``origin`` (default ``since``), of the jobs
    created since ``since``: jobs started and finished, and the claim latency's p50,
    p90 and p99 (seconds from due to started). ``t`` is the window's start, from
    ``origin``."""
    out = []
    for r in await conn.fetch(WINDOWS, since, window, since if origin is None else origin):
        p = r["p"] or [None] * 3
        out.append(
            {
                "t": r["w"] * window,
                "started": int(r["started"]),
                "finished": int(r["finished"]),
                "drain_rate": int(r["finished"]) / window,
                "p50": p[0],
                "p90": p[1],
                "p99": p[2],
            }
        )
    return out


async def wait_drained(conn: asyncpg.Connection, timeout: float) -> None:
    """Until nothing is queued (due now) or running."""

    async def drained() -> bool:
        row = await one_row(conn, QUEUE_SAMPLE)
        return bool(row["runnable"] == 0 and row["running"] == 0)

    await until(drained, timeout, "the backlog to drain", interval=0.1)


async def server_facts(conn: asyncpg.Connection) -> dict[str, Any]:
    """Postgres version and the settings that decide commit and vacuum behaviour."""
    names = [
        "fsync",
        "synchronous_commit",
        "wal_sync_method",
        "commit_delay",
        "shared_buffers",
        "max_connections",
        "autovacuum",
        "checkpoint_timeout",
        "max_wal_size",
        "wal_level",
    ]
    rows = await conn.fetch(
        "SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1::text[])", names
    )
    settings = {}
    for r in rows:
        value = r["setting"]
        if r["name"] == "shared_buffers":
            value = f"{int(r['setting']) * 8 // 1024} MB"
        elif r["unit"] in ("s", "ms", "MB"):
            value = f"{value} {r['unit']}"
        settings[r["name"]] = value
    return {
        "version": await conn.fetchval("SHOW server_version"),
        "settings": {n: settings.get(n) for n in names},
        "local": await server_is_local(conn),
    }


def machine_facts() -> dict[str, Any]:
    import platform

    memory = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 1024 / 1024, 1)
    model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gib": memory,
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
