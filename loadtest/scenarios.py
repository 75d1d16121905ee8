"""The four scenarios, each a named and parameterised run of measurement points.

A point is one headless Locust run (CSVs under ``<scenario>/<point>_*.csv``) plus
what the harness sampled from Postgres around it; ``points.json`` of each
scenario lists them for :mod:`loadtest.report`.

- ``contention``: producers committing single-job and small-batch transactions
  with a notification per commit, coalesced, or none; nothing drains them.
- ``drain``: a fixed backlog (loaded by Locust in big batches) drained by 1, 2,
  4 ... worker processes at several concurrencies.
- ``steady``: target enqueue rates through the jobs API with workers running.
- ``soak``: one long run at a set share of the fleet's measured capacity, with
  finished jobs moving to history: claim latency must not drift, and the claim
  table's size, backlog and dead tuples must stay bounded while history grows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from loadtest import sampling
from loadtest.harness import Processes, run_locust

DRAIN_TIMEOUT = 600.0
TRUNCATE = "TRUNCATE pgfleet.jobs, pgfleet.job_dependencies, pgfleet.jobs_history"


@dataclass(frozen=True)
class Contention:
    producers: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    modes: tuple[str, ...] = ("transaction", "coalesced", "off")
    batches: tuple[int, ...] = (1, 10)
    seconds: float = 8
    #: Producer counts of the same sweep through the HTTP API (batch 1); () skips it.
    http_producers: tuple[int, ...] = (4, 16, 64)


@dataclass(frozen=True)
class Drain:
    # Large enough that the fastest drain lasts seconds, not one worker's start-up.
    backlog: int = 50_000
    processes: tuple[int, ...] = (1, 2, 4)
    concurrencies: tuple[int, ...] = (4, 16, 64)
    load_batch: int = 1000
    pool_size: int = 6


@dataclass(frozen=True)
class Steady:
    rates: tuple[float, ...] = (100, 300, 1000, 2000, 3000, 4000)
    seconds: float = 30
    users: int = 16
    batch: int = 10
    worker_processes: int = 2
    concurrency: int = 16
    pool_size: int = 6
    sample_interval: float = 0.5


CAPACITY_MODES = ("end-to-end", "drain")
GENERATORS = ("db", "http")
#: The API's largest batch (``pgfleet api --max-batch``'s default), and the soak's.
MAX_BATCH = 1000


@dataclass(frozen=True)
class Soak:
    #: jobs/s; 0: ``share`` of the fleet's capacity, measured first.
    rate: float = 0
    share: float = 0.7
    #: ``end-to-end``: the jobs/s the workers finish while the soak's own generators
    #: offer the drain capacity for ``capacity_seconds`` (what the machine sustains
    #: with the generator's CPU on it); ``drain``: ``capacity_backlog`` jobs due
    #: together, drained with no generator running (an upper bound).
    capacity_mode: str = "end-to-end"
    capacity_seconds: float = 20
    #: The start of the end-to-end measurement left out (generators starting).
    capacity_warmup: float = 6
    capacity_backlog: int = 20_000
    #: The highest rate the soak asks for, whatever the capacity; 0: no cap.
    max_rate: float = 0
    seconds: float = 600
    #: ``db``: batched enqueues straight into Postgres (pgfleet's psycopg producer,
    #: coalesced notifications); ``http``: batches through the jobs API.
    generator: str = "db"
    #: Locust processes generating the load (``locust --processes``).
    generator_processes: int = 2
    #: Producers over all generator processes, each paced on its own schedule.
    users: int = 8
    #: Jobs per request; 0: sized to the rate, each user sending every ``batch_period``.
    batch: int = 0
    batch_period: float = 0.1
    #: The soak fails its verdict when it enqueued less than this share of its target.
    min_rate_share: float = 0.95
    worker_processes: int = 2
    concurrency: int = 16
    pool_size: int = 6
    #: Days of history are dropped past this; longer than the soak keeps its jobs.
    retention_seconds: float = 86400
    #: Finished jobs move from the claim table to history after this.
    history_move_after: float = 10
    #: The leader's chores (move, prune) run this often.
    prune_interval: float = 10
    sample_interval: float = 2.0
    #: Claim latency percentiles and drain rate are computed per window of this.
    window: float = 60
    #: The claim p99 of the first ten minutes after this (the generators and the
    #: workers' connections start in it) is judged against the last ten minutes'.
    judge_warmup: float = 60


def soak_batch(p: Soak, rate: float) -> int:
    """Jobs per request: ``p.batch``, or sized so each of ``p.users`` sends one
    request every ``p.batch_period`` at ``rate`` (1 to :data:`MAX_BATCH`)."""
    if p.batch > 0:
        return p.batch
    return max(1, min(MAX_BATCH, math.ceil(rate * p.batch_period / max(1, p.users))))


PROFILES: dict[str, dict[str, Any]] = {
    "full": {
        "contention": Contention(),
        "drain": Drain(),
        "steady": Steady(),
        "soak": Soak(),
    },
    # Seconds per scenario: what CI runs (tests/loadtest/test_smoke.py).
    "smoke": {
        "contention": Contention(
            producers=(2, 8), modes=("transaction", "coalesced", "off"), batches=(1, 5),
            seconds=2, http_producers=(4,),
        ),
        "drain": Drain(backlog=400, processes=(1, 2), concurrencies=(4,), load_batch=100),
        "steady": Steady(rates=(100, 300), seconds=3, users=4, batch=5, worker_processes=1),
        "soak": Soak(seconds=30, users=2, generator_processes=1, worker_processes=1,
                     capacity_seconds=6, capacity_warmup=2, capacity_backlog=1000,
                     max_rate=200, history_move_after=2, prune_interval=2,
                     sample_interval=1.0, window=5, judge_warmup=3),
    },
}  # fmt: skip

SCENARIOS = ("contention", "drain", "steady", "soak")


def override(params: Any, assignments: list[str]) -> Any:
    """Apply ``field=value`` strings (lists comma-separated) to a parameter dataclass."""
    changes: dict[str, Any] = {}
    fields = {f.name: f for f in dataclasses.fields(params)}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        if not sep or key not in fields:
            raise SystemExit(f"unknown parameter {key!r}; one of: {', '.join(fields)}")
        current = getattr(params, key)
        if isinstance(current, tuple):
            kind = type(current[0]) if current else str
            changes[key] = tuple(kind(v) for v in raw.split(",") if v)
        else:
            changes[key] = type(current)(raw)
    return dataclasses.replace(params, **changes)


@dataclass
class Context:
    dsn: str | None  # None: no database access (an external fleet without a DSN)
    out: Path
    procs: Processes
    native: bool
    host: str | None = None  # the jobs API of an external fleet
    cpu: bool = False

    def dir(self, scenario: str) -> Path:
        path = self.out / scenario
        path.mkdir(parents=True, exist_ok=True)
        return path


def _write_points(ctx: Context, scenario: str, params: Any, points: list[dict[str, Any]]) -> None:
    doc = {"scenario": scenario, "params": dataclasses.asdict(params), "points": points}
    (ctx.dir(scenario) / "points.json").write_text(json.dumps(doc, indent=1, default=str))


async def _connect(ctx: Context) -> asyncpg.Connection:
    assert ctx.dsn is not None
    return await asyncpg.connect(ctx.dsn)


# ------------------------------------------------------------------ contention


class _Listener:
    """A LISTEN session, as a worker's: notifications are delivered, and counted."""

    def __init__(self) -> None:
        self.received = 0
        self.conn: asyncpg.Connection | None = None

    async def start(self, dsn: str) -> None:
        self.conn = await asyncpg.connect(dsn)
        await self.conn.add_listener("pgfleet_jobs", self._on)

    def _on(self, *_args: Any) -> None:
        self.received += 1

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


async def contention(ctx: Context, p: Contention) -> list[dict[str, Any]]:
    if ctx.dsn is None:
        raise SystemExit("contention needs the database (PGFLEET_DATABASE_URL)")
    points: list[dict[str, Any]] = []
    listener = _Listener()
    await listener.start(ctx.dsn)
    conn = await _connect(ctx)
    try:
        for batch in p.batches:
            for producers in p.producers:
                for mode in p.modes:
                    points.append(
                        await _contention_point(
                            ctx, conn, listener, "db", mode, batch, producers, p
                        )
                    )
                    _write_points(ctx, "contention", p, points)
        if p.http_producers:
            points += await _contention_http(ctx, conn, listener, p)
            _write_points(ctx, "contention", p, points)
    finally:
        await listener.close()
        await conn.close()
    return points


async def _contention_http(
    ctx: Context, conn: asyncpg.Connection, listener: _Listener, p: Contention
) -> list[dict[str, Any]]:
    points = []
    if not ctx.native:
        # The external fleet's API has whatever notify mode it was started with.
        for producers in p.http_producers:
            points.append(
                await _contention_point(
                    ctx, conn, listener, "http", "external", 1, producers, p, ctx.host
                )
            )
        return points
    assert ctx.dsn is not None
    for mode in p.modes:
        api, url = await ctx.procs.api(ctx.dsn, mode, pool_size=max(p.http_producers))
        try:
            for producers in p.http_producers:
                points.append(
                    await _contention_point(ctx, conn, listener, "http", mode, 1, producers, p, url)
                )
        finally:
            await api.stop()
    return points


async def _contention_point(
    ctx: Context,
    conn: asyncpg.Connection,
    listener: _Listener,
    user: str,
    mode: str,
    batch: int,
    producers: int,
    p: Contention,
    host: str | None = None,
) -> dict[str, Any]:
    name = f"{user}-{mode}-b{batch}-p{producers}"
    if ctx.native:
        await conn.execute(TRUNCATE)
    t0 = await sampling.db_now(conn)
    cpu = sampling.CpuMeter() if ctx.cpu else None
    if cpu is not None:
        await cpu.sample(conn)
    received = listener.received
    options: dict[str, Any] = {"batch_size": batch, "max_failure_ratio": 0}
    if user == "db":
        options |= {"notify": mode, "dsn": ctx.dsn}
    # The producers' backends exit with Locust: the CPU meter samples them while
    # they run (every 0.25 s), so each loses at most its last quarter second.
    assert ctx.dsn is not None
    async with sampling.Sampler(ctx.dsn, 0.25, queue=False, cpu=cpu):
        run = await run_locust(
            ctx.procs,
            user=user,
            csv_prefix=ctx.dir("contention") / name,
            users=producers,
            seconds=p.seconds,
            host=host,
            options=options,
        )
    span = await sampling.one_row(conn, sampling.CREATED_SPAN, t0)
    return {
        "name": name,
        "csv": f"contention/{name}",
        "user": user,
        "notify": mode,
        "batch": batch,
        "producers": producers,
        "seconds": p.seconds,
        "locust_exit": run.returncode,
        "jobs_committed": int(span["n"]),
        # created_at is each transaction's start: first to last commit, on the server.
        "db_span_seconds": span["span"],
        "notifications_received": listener.received - received,
        "pg_cpu_seconds": cpu.seconds() if cpu is not None else None,
    }


# ------------------------------------------------------------------ drain


async def drain(ctx: Context, p: Drain) -> list[dict[str, Any]]:
    if not ctx.native or ctx.dsn is None:
        raise SystemExit("drain starts worker processes itself: it needs the native fleet")
    points: list[dict[str, Any]] = []
    conn = await _connect(ctx)
    try:
        for processes in p.processes:
            for concurrency in p.concurrencies:
                points.append(await _drain_point(ctx, conn, processes, concurrency, p))
                _write_points(ctx, "drain", p, points)
    finally:
        await conn.close()
    return points


async def _drain_point(
    ctx: Context, conn: asyncpg.Connection, processes: int, concurrency: int, p: Drain
) -> dict[str, Any]:
    assert ctx.dsn is not None
    name = f"load-w{processes}-c{concurrency}"
    await conn.execute(TRUNCATE)
    await conn.execute("DELETE FROM pgfleet.workers")
    load = await run_locust(
        ctx.procs,
        user="db",
        csv_prefix=ctx.dir("drain") / name,
        users=2,
        seconds=600,
        options={
            "batch_size": p.load_batch,
            "total_jobs": p.backlog,
            "notify": "off",
            "dsn": ctx.dsn,
            "max_failure_ratio": 0,
        },
    )
    queued = await conn.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE status = 'queued'")
    await conn.execute("VACUUM (ANALYZE) pgfleet.jobs")
    cpu = sampling.CpuMeter() if ctx.cpu else None
    if cpu is not None:
        await cpu.sample(conn)
    started = time.monotonic()
    workers = await ctx.procs.workers(
        ctx.dsn, processes, concurrency, "--pool-size", str(p.pool_size)
    )
    try:
        async with sampling.Sampler(ctx.dsn, 0.25, cpu=cpu):
            await sampling.wait_drained(conn, DRAIN_TIMEOUT)
        wall = time.monotonic() - started
    finally:
        await workers.stop()
    span = await sampling.one_row(conn, sampling.DRAIN_SPAN)
    done = int(span["n"])
    return {
        "name": name,
        "csv": f"drain/{name}",
        "processes": processes,
        "concurrency": concurrency,
        "backlog": p.backlog,
        "locust_exit": load.returncode,
        "jobs_queued": queued,
        "jobs_done": done,
        "drain_seconds": span["span"],
        "wall_seconds": wall,
        "pg_cpu_seconds": cpu.seconds() if cpu is not None else None,
    }


# ------------------------------------------------------------------ steady + soak


async def _fleet(
    ctx: Context, processes: int, concurrency: int, pool_size: int, *extra: str, api: bool = True
) -> tuple[list[Any], str]:
    """Workers and a coalescing API (native; no API when ``api`` is false), or the
    external fleet's API."""
    if not ctx.native:
        if not ctx.host:
            raise SystemExit("an external fleet needs LOCUST_HOST (the jobs API)")
        return [], ctx.host
    assert ctx.dsn is not None
    workers = await ctx.procs.workers(
        ctx.dsn, processes, concurrency, "--pool-size", str(pool_size), *extra
    )
    if not api:
        return [workers], ""
    service, url = await ctx.procs.api(ctx.dsn, "coalesced", pool_size=16)
    return [service, workers], url


async def steady(ctx: Context, p: Steady) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = []
    stoppable, url = await _fleet(ctx, p.worker_processes, p.concurrency, p.pool_size)
    conn = await _connect(ctx) if ctx.dsn else None
    try:
        for rate in p.rates:
            points.append(await _steady_point(ctx, conn, url, rate, p))
            _write_points(ctx, "steady", p, points)
    finally:
        for proc in stoppable:
            await proc.stop()
        if conn is not None:
            await conn.close()
    return points


async def _steady_point(
    ctx: Context, conn: asyncpg.Connection | None, url: str, rate: float, p: Steady
) -> dict[str, Any]:
    name = f"rate{rate:g}"
    options = {"batch_size": p.batch, "target_rate": rate, "max_failure_ratio": 0}
    point: dict[str, Any] = {
        "name": name,
        "csv": f"steady/{name}",
        "target_rate": rate,
        "batch": p.batch,
        "users": p.users,
        "worker_processes": p.worker_processes,
        "concurrency": p.concurrency,
    }
    if conn is None or ctx.dsn is None:
        run = await _locust_http(ctx, name, "steady", url, p.users, p.seconds, options)
        return point | {"locust_exit": run.returncode}
    if ctx.native:
        await conn.execute(TRUNCATE)
    t0 = await sampling.db_now(conn)
    async with sampling.Sampler(ctx.dsn, p.sample_interval) as sampler:
        run = await _locust_http(ctx, name, "steady", url, p.users, p.seconds, options)
    await sampling.wait_drained(conn, DRAIN_TIMEOUT)
    counts = await sampling.status_counts(conn, t0)
    return point | {
        "locust_exit": run.returncode,
        "t0": t0,
        "jobs_committed": sum(counts.values()),
        "jobs_done": counts.get("succeeded", 0),
        "statuses": counts,
        "pickup": await sampling.pickup_delays(conn, t0),
        "samples": sampler.rows,
    }


async def _locust_http(
    ctx: Context, name: str, scenario: str, url: str, users: int, seconds: float, options: Any
) -> Any:
    return await run_locust(
        ctx.procs,
        user="http",
        csv_prefix=ctx.dir(scenario) / name,
        users=users,
        seconds=seconds,
        host=url,
        options=options,
    )


def _check_soak(ctx: Context, p: Soak) -> str:
    """The generator the soak uses: ``db`` needs the database."""
    if p.capacity_mode not in CAPACITY_MODES:
        raise SystemExit(f"soak.capacity_mode must be one of {CAPACITY_MODES}")
    if p.generator not in GENERATORS:
        raise SystemExit(f"soak.generator must be one of {GENERATORS}")
    if p.generator == "db" and ctx.dsn is None:
        raise SystemExit("soak.generator=db needs the database (PGFLEET_DATABASE_URL)")
    return p.generator


async def _truncate(ctx: Context) -> None:
    conn = await _connect(ctx)
    try:
        await conn.execute(TRUNCATE)
        await conn.execute("VACUUM (ANALYZE) pgfleet.jobs")
    finally:
        await conn.close()


async def _soak_fleet(ctx: Context, p: Soak) -> tuple[list[Any], str]:
    days = p.retention_seconds / 86400
    return await _fleet(
        ctx,
        p.worker_processes,
        p.concurrency,
        p.pool_size,
        "--retention-days",
        f"{days:.9f}",
        "--history-move-after",
        f"{p.history_move_after:g}",
        "--prune-interval",
        f"{p.prune_interval:g}",
        api=p.generator == "http" or not ctx.native,
    )


async def soak(ctx: Context, p: Soak) -> list[dict[str, Any]]:
    generator = _check_soak(ctx, p)
    clean = ctx.native and ctx.dsn is not None
    if clean:
        await _truncate(ctx)  # before the workers start: only this run's jobs
    stoppable, url = await _soak_fleet(ctx, p)
    point: dict[str, Any] = {}
    try:
        measured: dict[str, Any] = {}
        if p.rate <= 0 and ctx.dsn is not None:
            measured = await _capacity(ctx, p)
            if clean and p.capacity_mode == "end-to-end":
                # The measurement leaves a backlog (what the workers did not keep
                # up with): the soak starts from an empty table on a fresh fleet.
                for proc in stoppable:
                    await proc.stop()
                await _truncate(ctx)
                stoppable, url = await _soak_fleet(ctx, p)
        capacity = measured.get("capacity")
        rate = p.share * capacity if capacity else p.rate
        if p.max_rate > 0:
            rate = min(rate or p.max_rate, p.max_rate)
        print(f"loadtest: soak at {rate:,.0f} jobs/s; capacity {measured}", flush=True)
        if rate <= 0:
            raise SystemExit("the soak needs soak.rate, or the database to measure capacity")
        name = "soak"
        batch = soak_batch(p, rate)
        options: dict[str, Any] = {"batch_size": batch, "target_rate": rate}
        point = {"name": name, "csv": f"soak/{name}", "target_rate": rate, "batch": batch}
        point |= {"generator": generator, "capacity_mode": p.capacity_mode} | measured
        point["capacity"] = capacity
        if ctx.dsn is None:
            run = await _locust_generator(ctx, name, url, p, p.seconds, options)
            point["locust_exit"] = run.returncode
        else:
            point |= await _soak_measured(ctx, url, name, options, p)
    finally:
        for proc in stoppable:
            await proc.stop()
    if ctx.dsn is not None:
        await _soak_final(ctx, point, p)
    _write_points(ctx, "soak", p, [point])
    return [point]


async def _soak_final(ctx: Context, point: dict[str, Any], p: Soak) -> None:
    # Stopped backends have flushed their statistics: the counters are final.
    conn = await _connect(ctx)
    try:
        final = dict(await sampling.one_row(conn, sampling.TABLE_SAMPLE))
        remaining = await sampling.status_counts(conn, point["t0"])
        point["windows"] = await sampling.windows(conn, point["t0"], p.window)
        # The first ten minutes after the warm-up and the last ten (a third of a
        # shorter soak), judged.
        point["judged"] = await _judged(conn, point["t0"], p)
        point["judge_span"] = _judge_span(p)
        point["judge_warmup"] = p.judge_warmup
    finally:
        await conn.close()
    before = point["table_before"]
    point["jobs_committed"] = final["inserted"] - before["inserted"]
    # What the generators delivered, against what the soak asked for.
    point["achieved_rate"] = point["jobs_committed"] / p.seconds
    point["min_rate_share"] = p.min_rate_share
    point["jobs_moved"] = moved = await _moved(ctx, point["t0"])
    # Rows deleted from the claim table are moved or pruned; with a retention
    # longer than the run (the default) none of this run's jobs is pruned.
    pruned = final["deleted"] - before["deleted"] - moved
    short = p.retention_seconds < p.seconds + DRAIN_TIMEOUT
    point["jobs_pruned"] = max(0, pruned) if short else 0
    point["jobs_done"] = remaining.get("succeeded", 0) + point["jobs_pruned"]
    point["statuses"] = remaining


def _judge_span(p: Soak) -> float:
    """The length of the two windows the soak's claim p99 is judged on."""
    return min(600.0, (p.seconds - p.judge_warmup) / 3)


async def _judged(conn: asyncpg.Connection, t0: float, p: Soak) -> list[dict[str, Any]]:
    """The claim latency of the first window after the warm-up and of the last
    window of the run (what the generators offered; the drain after it is not
    judged): ``[]`` when the run is too short to hold two."""
    span = _judge_span(p)
    if span <= 0:
        return []
    first = await sampling.windows(conn, t0, span, t0 + p.judge_warmup)
    last = await sampling.windows(conn, t0, span, t0 + p.seconds - span)
    first = [w for w in first if w["t"] == 0]
    last = [w for w in last if w["t"] == 0]
    return first + last if first and last else []


async def _moved(ctx: Context, since: float) -> int:
    """This run's jobs in history."""
    conn = await _connect(ctx)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pgfleet.jobs_history WHERE created_at >= to_timestamp($1)",
                since,
            )
        )
    finally:
        await conn.close()


async def _capacity(ctx: Context, p: Soak) -> dict[str, Any]:
    """The fleet's capacity in jobs/s, by ``p.capacity_mode``, with how it was measured."""
    assert ctx.dsn is not None
    if p.capacity_mode == "drain":
        return {"capacity": await _drain_capacity(ctx.dsn, p.capacity_backlog)}
    return await _end_to_end_capacity(ctx, p)


async def _end_to_end_capacity(ctx: Context, p: Soak) -> dict[str, Any]:
    """Jobs/s the running workers finish while the soak's generators offer the fleet's
    drain capacity (measured first, with no generator running): counted over the
    run after its warm-up. Generators offering more than that would only pile up a
    backlog (a flat-out run left a million jobs, on which claims stalled)."""
    assert ctx.dsn is not None
    drain_capacity = await _drain_capacity(ctx.dsn, p.capacity_backlog)
    conn = await _connect(ctx)
    try:
        t0 = await sampling.db_now(conn)
        run = await _locust_generator(
            ctx,
            "capacity",
            "",
            p,
            p.capacity_seconds,
            {"batch_size": soak_batch(p, drain_capacity), "target_rate": drain_capacity},
        )
        start, end = t0 + p.capacity_warmup, t0 + p.capacity_seconds
        flow = await sampling.one_row(conn, sampling.FLOW_BETWEEN, start, end)
        backlog = await conn.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE status = 'queued'")
        if not ctx.native:  # an external fleet's table is not truncated: drained
            await sampling.wait_drained(conn, DRAIN_TIMEOUT)
    finally:
        await conn.close()
    span = max(1e-3, end - start)
    return {
        "capacity": flow["finished"] / span,
        "drain_capacity": drain_capacity,
        "capacity_enqueued_rate": flow["created"] / span,
        "capacity_backlog_left": int(backlog),
        "capacity_locust_exit": run.returncode,
    }


async def _drain_capacity(dsn: str, backlog: int) -> float:
    """The fleet's drain rate (jobs/s): ``backlog`` jobs due together a few seconds
    ahead, timed from when they are due until none is left."""
    conn = await asyncpg.connect(dsn)
    try:
        due = await sampling.db_now(conn) + 3.0 + backlog / 20_000
        await conn.execute(sampling.CAPACITY_FILL, backlog, due)
        await asyncio.sleep(max(0.0, due - await sampling.db_now(conn)))
        await sampling.wait_drained(conn, DRAIN_TIMEOUT)
        return backlog / max(1e-3, await sampling.db_now(conn) - due)
    finally:
        await conn.close()


async def _locust_generator(
    ctx: Context, name: str, url: str, p: Soak, seconds: float, options: dict[str, Any]
) -> Any:
    """The soak's load: ``p.users`` producers over ``p.generator_processes`` Locust
    processes, through the database or the API."""
    options = options | {"max_failure_ratio": 0}
    if p.generator_processes > 1:
        options["processes"] = p.generator_processes
    if p.generator == "http" or ctx.dsn is None:
        return await _locust_http(ctx, name, "soak", url, p.users, seconds, options)
    return await run_locust(
        ctx.procs,
        user="db",
        csv_prefix=ctx.dir("soak") / name,
        users=p.users,
        seconds=seconds,
        options=options | {"notify": "coalesced", "dsn": ctx.dsn},
    )


async def _soak_measured(
    ctx: Context, url: str, name: str, options: dict[str, Any], p: Soak
) -> dict[str, Any]:
    assert ctx.dsn is not None
    conn = await _connect(ctx)
    try:
        t0 = await sampling.db_now(conn)
        before = dict(await sampling.one_row(conn, sampling.TABLE_SAMPLE))
        async with sampling.Sampler(ctx.dsn, p.sample_interval, table=True) as sampler:
            run = await _locust_generator(ctx, name, url, p, p.seconds, options)
        await sampling.wait_drained(conn, DRAIN_TIMEOUT)
        pickup = await sampling.pickup_delays(conn, t0)
    finally:
        await conn.close()
    return {
        "locust_exit": run.returncode,
        "t0": t0,
        "table_before": before,
        "pickup": pickup,
        "samples": sampler.rows,
        "retention_seconds": p.retention_seconds,
    }


# Each runner takes its own parameter class; the profile table pairs them by name.
Runner = Callable[[Context, Any], Awaitable[list[dict[str, Any]]]]
RUNNERS: dict[str, Runner] = {
    "contention": contention,
    "drain": drain,
    "steady": steady,
    "soak": soak,
}
