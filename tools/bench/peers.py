"""pgfleet against pgqueuer, graphile-worker (both pinned) and raw SQL, interleaved on one server.

    python -m tools.bench.peers --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python -m tools.bench.peers --dsn ... --contenders pgfleet,graphile --phases drain

(`make bench-peers` installs the pinned pgqueuer into .venv first; graphile-worker
and its Node.js install themselves from the npm registry into ~/.cache, see
tools/bench/graphile.py.) Every measurement runs once per repeat for each
contender, one after the other, so drift on a shared machine hits them alike; who
goes first alternates between repeats. The report gives medians, ratios, CPU per
job (client and Postgres) and the WAL each run wrote. A scratch database is
created and dropped; a CHECKPOINT before each measurement (``--no-checkpoint``
skips it) keeps the server's timed checkpoints out of the runs and makes every
contender pay the same full-page images, and each queue is analysed after its fill
(``--no-analyze`` skips it), as autovacuum would have done.

Contenders (``--contenders``, any of): ``pgfleet``, ``pgqueuer``, ``raw``,
``graphile-default``, ``graphile-batched`` (``graphile``: both; ``all``: every one).
Phases (``--phases``): ``enqueue-single``, ``enqueue-batch``, ``drain-c1``,
``drain-c16``, ``drain-c64``, ``drain-limit``, ``latency-plain``, ``latency-stale``
(``enqueue``, ``drain``, ``latency``: their group, ``drain-limit`` in none;
``all``). Settings, per row:
- single enqueue: pgfleet ``Queue.enqueue`` on ``create_pool`` (default wakeups);
  pgqueuer ``Queries.enqueue`` on one connection and on a pool (the faster counts);
  graphile-worker ``WorkerUtils.addJob`` (its ``add_job`` function, the row returned);
  raw SQL: one-row INSERT per commit (``../shared/bench/sol.py``'s single insert).
- batches of 500: ``enqueue_many`` / pgqueuer list enqueue / graphile ``addJobs`` /
  raw unnest insert.
- drain (no-op jobs queued before the worker starts, in process): pgfleet ``Worker``
  at concurrency 1, 16, 64; pgqueuer ``QueueManager.run(mode=drain)`` with
  ``concurrency_limit=1`` (c1), its library defaults and ``batch_size=8,
  max_concurrent_tasks=16`` (c16: the faster counts), ``batch_size=32,
  max_concurrent_tasks=64`` (c64), on ``--pgqueuer-drain-total`` jobs (20,000:
  its dequeue slows down as the queue deepens; 3,000 at c1); graphile-worker ``runOnce`` with
  ``concurrentJobs`` 1, 16, 64 in its default mode and in its batched mode
  (``localQueue.size`` 500, ``completeJobBatchDelay``/``failJobBatchDelay`` 0), a pool
  of max(10, concurrency + 2) connections capped at ``--graphile-max-pool`` (its
  default mode, about a thousand jobs a second here, drains
  ``--graphile-default-drain-total`` jobs, 20,000, as pgqueuer's c1 drains 3,000); raw SQL:
  claim-1000-then-complete on 2 connections (sol.py's drain loop).
- drain of a limited name (``drain-limit``): ``--pgqueuer-drain-total`` no-op jobs
  of one name limited to 4 at once, 16 slots: pgfleet ``set_limits("noop",
  concurrency=4)`` (stored in the database, set after the fill, which flags the
  queued jobs) and a ``Worker`` at concurrency 16; pgqueuer's entrypoint
  ``concurrency_limit=4`` with ``batch_size=8, max_concurrent_tasks=16`` and with its
  library defaults (the faster counts).
- pickup latency at 500 jobs/s (4 paced producers, single-job enqueues, a worker
  process each at concurrency 16): a plain run, and one right after TRUNCATE with
  stale statistics (100,000 queued rows analysed, then truncated).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg

from pgfleet import EnqueueRequest, Queue, Worker, create_pool
from tools.bench import graphile, rawsql
from tools.bench import suite as fb
from tools.devkit import drop_database, guarded

PGQUEUER_VERSION = "1.6.0"
RATE, PRODUCERS = 500, 4
_CHILD_DSN = "PGFLEET_DATABASE_URL"

CONTENDERS = (
    "pgfleet",
    "pgfleet-noretain",
    "pgqueuer",
    "raw",
    "graphile-default",
    "graphile-batched",
)
GRAPHILE = ("graphile-default", "graphile-batched")
PHASES = (
    "enqueue-single",
    "enqueue-batch",
    "drain-c1",
    "drain-c16",
    "drain-c64",
    "drain-limit",
    "latency-plain",
    "latency-stale",
)
LEVELS = (("c1", 1), ("c16", 16), ("c64", 64))
_CONTENDER_GROUPS = {"graphile": GRAPHILE, "all": CONTENDERS}
_PHASE_GROUPS = {
    "enqueue": ("enqueue-single", "enqueue-batch"),
    "drain": ("drain-c1", "drain-c16", "drain-c64"),
    "latency": ("latency-plain", "latency-stale"),
    "all": PHASES,
}

STALE_FILL_PGFLEET = (
    "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts) "
    "SELECT gen_random_uuid(), 'noop', '{}', 25 FROM generate_series(1, $1)"
)
STALE_FILL_PGQUEUER = (
    "INSERT INTO pgqueuer (priority, entrypoint, payload, status) "
    "SELECT 0, 'noop', NULL, 'queued' FROM generate_series(1, $1)"
)
RESET = (
    "TRUNCATE bench_raw.jobs, pgfleet.jobs, pgfleet.job_dependencies; DELETE FROM pgfleet.workers"
)
ANALYZE_PGFLEET = "ANALYZE pgfleet.jobs"
ANALYZE_PGQUEUER = "ANALYZE pgqueuer"
ANALYZE_RAW = "ANALYZE bench_raw.jobs"
RESET_PGQUEUER = "TRUNCATE pgqueuer, pgqueuer_log"


def selection(text: str, known: tuple[str, ...], groups: dict[str, tuple[str, ...]]) -> list[str]:
    """A comma-separated selection, groups expanded, in ``known``'s order."""
    chosen: set[str] = set()
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item in groups:
            chosen.update(groups[item])
        elif item in known:
            chosen.add(item)
        else:
            names = ", ".join((*known, *groups))
            raise ValueError(f"unknown {item!r}: expected some of {names}")
    if not chosen:
        raise ValueError("the selection is empty")
    return [k for k in known if k in chosen]


def _pgqueuer() -> Any:
    try:
        import pgqueuer
    except ImportError:
        raise SystemExit(
            f"pgqueuer is not installed: pip install pgqueuer=={PGQUEUER_VERSION} "
            "(or make bench-peers), or leave it out: --contenders pgfleet,raw,graphile"
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
    wal: dict[str, list[float]] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)

    def add(
        self, key: str, value: float, meter: Any = None, jobs: int = 0, wal: float | None = None
    ) -> None:
        self.values.setdefault(key, []).append(value)
        if jobs:
            self.jobs[key] = jobs
        if meter is not None:
            self.cpu.setdefault(key, []).append(meter.per_job(jobs))
        if wal is not None:
            self.wal.setdefault(key, []).append(wal)
        cpu = f"  cpu/job {self._cpu_text(key)}" if meter is not None else ""
        wal_text = f"  wal {wal / 2**20:,.1f} MiB" if wal is not None else ""
        print(f"    {key:<36} {value:>12,.2f}{cpu}{wal_text}", flush=True)

    def _cpu_text(self, key: str) -> str:
        client, server = self.cpu[key][-1]
        return f"{client:.4f} + {'n/a' if server is None else f'{server:.4f}'} ms"

    def has(self, key: str) -> bool:
        return key in self.values

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

    def wal_median(self, key: str) -> float | None:
        runs = self.wal.get(key)
        return statistics.median(runs) if runs else None


_METER = getattr(fb, "Cpu", None)  # absent from pgfleet versions before the CPU meter


@dataclass
class Bench:
    """What every round needs: the database, the selection, the installs."""

    dsn: str
    contenders: list[str]
    phases: list[str]
    checkpoint: bool = True
    analyze_fill: bool = True
    install: graphile.Install | None = None
    max_pool: int = graphile.DEFAULT_MAX_POOL
    runs: Runs = field(default_factory=Runs)

    def on(self, contender: str) -> bool:
        return contender in self.contenders

    def graphile_modes(self) -> list[str]:
        return [c.removeprefix("graphile-") for c in GRAPHILE if c in self.contenders]

    async def analyze(self, pool: Any, statement: str) -> None:
        """Statistics of a queue just filled, as autovacuum would have them after a
        fill this size (it is off on some servers, this project's included): without
        them a contender's first drain may plan for an empty table and its later
        ones not (the stale-latency round analyses every queue)."""
        if self.analyze_fill:
            await pool.execute(statement)

    async def _checkpoint(self, conn: Any) -> None:
        if not self.checkpoint:
            return
        try:
            await conn.execute(rawsql.CHECKPOINT)
        except asyncpg.InsufficientPrivilegeError:
            print("    (no CHECKPOINT privilege: measuring without)", flush=True)
            self.checkpoint = False

    async def measure(self, key: str, jobs: int, fn: Callable[[], Awaitable[float | None]]) -> None:
        """Time fn() (which handles ``jobs`` jobs) and record jobs/s, CPU per job and
        the WAL written meanwhile. fn may return CPU seconds of a child process that
        the meter did not see (a graphile-worker child still running), added to the
        client's."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await self._checkpoint(conn)
            lsn = await conn.fetchval(rawsql.WAL_LSN)
            if _METER is None:
                start = time.perf_counter()
                await fn()
                self.runs.add(key, jobs / (time.perf_counter() - start))
                return
            async with _METER(self.dsn) as meter:
                start = time.perf_counter()
                extra = await fn()
                elapsed = time.perf_counter() - start
            if extra:
                meter.client += extra
            wal = float(await conn.fetchval(rawsql.WAL_SINCE, lsn))
        finally:
            await conn.close()
        self.runs.add(key, jobs / elapsed, meter, jobs, wal)

    async def measure_graphile(self, key: str, jobs: int, *args: str) -> None:
        """One bench.mjs child: started outside the measurement, ``go`` to report inside."""
        assert self.install is not None
        async with graphile.child(self.install, self.dsn, *args, max_pool=self.max_pool) as c:

            async def fn() -> float:
                done, cpu = await c.run()
                if done != jobs:
                    raise RuntimeError(f"graphile-worker {' '.join(args)}: {done} jobs, not {jobs}")
                return cpu

            await self.measure(key, jobs, fn)


# ---------------------------------------------------------------- setup


async def _database(bench_args: argparse.Namespace, contenders: list[str]) -> str:
    dsn = await fb._fresh_database(bench_args.dsn, bench_args.database)
    if "pgqueuer" in contenders:
        conn = await asyncpg.connect(dsn)
        try:
            pgq = _pgqueuer()
            from pgqueuer.db import AsyncpgDriver

            await pgq.Queries(AsyncpgDriver(conn)).install()
        finally:
            await conn.close()
    return dsn


async def _reset(bench: Bench, pool: asyncpg.Pool) -> None:
    await pool.execute(RESET)
    if bench.on("pgqueuer"):
        await pool.execute(RESET_PGQUEUER)
    if bench.install is not None:
        await pool.execute(graphile.TRUNCATE)


def _ordered(items: list[Any], flip: bool) -> Iterable[Any]:
    return reversed(items) if flip else items


# ---------------------------------------------------------------- enqueue


async def enqueue_round(bench: Bench, single: int, batch_total: int, flip: bool = False) -> None:
    pool = await create_pool(bench.dsn, min_size=2, max_size=2)
    conn = await asyncpg.connect(bench.dsn)
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

        steps: list[tuple[str, str, str, int, Callable[[], Awaitable[Any]]]] = []
        one, many = "enqueue-single", "enqueue-batch"
        steps += [
            (one, "raw", "enqueue single raw", single, raw_single),
            (one, "pgfleet", "enqueue single pgfleet pool", single, fleet_single),
            (one, "pgfleet", "enqueue single pgfleet conn", single, lambda: fleet_single(conn)),
        ]
        if bench.on("pgqueuer"):
            pgq = _pgqueuer()
            from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver

            on_conn = pgq.Queries(AsyncpgDriver(conn))
            on_pool = pgq.Queries(AsyncpgPoolDriver(pool))

            async def pgq_single(queries: Any) -> None:
                for _ in range(single):
                    await queries.enqueue("noop", b'{"n": 1}')

            async def pgq_batch() -> None:
                for _ in range(0, batch_total, 500):
                    await on_pool.enqueue(["noop"] * 500, [b'{"n": 1}'] * 500, [0] * 500)

            steps += [
                (
                    one,
                    "pgqueuer",
                    "enqueue single pgqueuer conn",
                    single,
                    lambda: pgq_single(on_conn),
                ),
                (
                    one,
                    "pgqueuer",
                    "enqueue single pgqueuer pool",
                    single,
                    lambda: pgq_single(on_pool),
                ),
                (many, "pgqueuer", "enqueue batch500 pgqueuer", batch_total, pgq_batch),
            ]
        steps += [
            (many, "raw", "enqueue batch500 raw", batch_total, raw_batch),
            (many, "pgfleet", "enqueue batch500 pgfleet", batch_total, fleet_batch),
        ]
        # graphile-worker's enqueue is the same in both its modes: measured once,
        # when either is chosen.
        graphile_steps = [
            (one, "enqueue single graphile", single, ("enqueue-single", str(single))),
            (
                many,
                "enqueue batch500 graphile",
                batch_total,
                ("enqueue-batch", str(batch_total), "500"),
            ),
        ]
        todo: list[tuple[str, Callable[[], Awaitable[Any]]]] = []
        for phase, who, key, jobs, fn in steps:
            if phase in bench.phases and bench.on(who):

                async def run(key: str = key, jobs: int = jobs, fn: Any = fn) -> None:
                    await bench.measure(key, jobs, fn)

                todo.append((key, run))
        if bench.install is not None:
            for phase, key, jobs, args in graphile_steps:
                if phase in bench.phases:

                    async def run_g(key: str = key, jobs: int = jobs, args: Any = args) -> None:
                        await bench.measure_graphile(key, jobs, *args)

                    todo.append((key, run_g))
        for _key, run_step in _ordered(todo, flip):
            await _reset(bench, pool)
            await run_step()
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


#: The concurrency limit of the one name in the drain-limit phase (16 slots).
LIMITED = 4
PGQUEUER_LIMITED = [
    {"concurrency_limit": LIMITED, "batch_size": 8, "max_concurrent_tasks": 16},
    {"concurrency_limit": LIMITED},
]


@dataclass(frozen=True)
class DrainCounts:
    """Jobs queued before each drain: every contender drains ``total`` but the slow
    settings, which a deep queue would keep running for many minutes."""

    total: int
    pgqueuer_c1: int
    pgqueuer: int
    graphile_default: int


async def drain_round(bench: Bench, counts: DrainCounts, flip: bool = False) -> None:
    total = counts.total
    pool = await create_pool(bench.dsn, min_size=4, max_size=8)
    try:
        if bench.on("raw") and any(p.startswith("drain-") for p in bench.phases):
            await _reset(bench, pool)
            await pool.execute(rawsql.RAW_FILL, total)
            await bench.analyze(pool, ANALYZE_RAW)

            async def raw() -> None:
                await fb._raw_drain(pool, 2, 1000)

            await bench.measure("drain raw claim1000+complete x2", total, raw)
        for level, concurrency in LEVELS:
            if f"drain-{level}" not in bench.phases:
                continue
            todo: list[Callable[[], Awaitable[None]]] = []
            if bench.on("pgfleet"):
                # pgfleet drains the full count at every level (at concurrency 1 it
                # runs thousands of jobs a second: a small count would time start-up);
                # pgqueuer's one-slot drain, at a few hundred a second, gets fewer.

                async def fleet(c: int = concurrency, level: str = level) -> None:
                    await _reset(bench, pool)
                    await fb._fill(pool, total)
                    await bench.analyze(pool, ANALYZE_PGFLEET)

                    async def run() -> None:
                        await fb._drain_in_process(pool, c)

                    await bench.measure(f"drain {level} pgfleet", total, run)

                todo.append(fleet)
            if bench.on("pgfleet-noretain"):
                # The same drain by a worker that removes succeeded jobs at completion
                # (remove_succeeded_jobs): no history, as graphile-worker keeps none.

                async def noretain(c: int = concurrency, level: str = level) -> None:
                    await _reset(bench, pool)
                    await fb._fill(pool, total)
                    await bench.analyze(pool, ANALYZE_PGFLEET)
                    config = dataclasses.replace(fb._bench_config(c), remove_succeeded_jobs=True)

                    async def run() -> None:
                        stats = await Worker(pool, fb._noop_registry(), config).run(burst=True)
                        left = await pool.fetchval("SELECT count(*) FROM pgfleet.jobs")
                        if stats.succeeded != total or left:
                            raise RuntimeError(
                                f"pgfleet-noretain ran {stats.succeeded} of {total} jobs and "
                                f"left {left} rows"
                            )

                    await bench.measure(f"drain {level} pgfleet-noretain", total, run)

                todo.append(noretain)
            if bench.on("pgqueuer"):
                # Its dequeue slows down as the queue deepens (about 250 jobs/s at 16
                # slots on 200,000 queued jobs, against thousands on 20,000): it
                # drains --pgqueuer-drain-total, and fewer at one slot.
                n = counts.pgqueuer_c1 if concurrency == 1 else counts.pgqueuer
                for i, settings in enumerate(PGQUEUER_DRAIN[level]):

                    async def peer(
                        s: dict[str, Any] = settings, n: int = n, i: int = i, level: str = level
                    ) -> None:
                        await _reset(bench, pool)
                        await _fill_pgqueuer(bench.dsn, n)
                        await bench.analyze(pool, ANALYZE_PGQUEUER)

                        async def run() -> None:
                            await _drain_pgqueuer(bench.dsn, n, dict(s))

                        await bench.measure(f"drain {level} pgqueuer #{i}", n, run)

                    todo.append(peer)
            for mode in bench.graphile_modes():
                # Its default mode runs about a thousand jobs a second here: it
                # drains fewer (--graphile-default-drain-total), as pgqueuer's c1.
                n = counts.graphile_default if mode == "default" else total

                async def gw(
                    mode: str = mode, c: int = concurrency, level: str = level, n: int = n
                ) -> None:
                    await _reset(bench, pool)
                    await pool.execute(graphile.ENSURE_TASK)
                    await pool.execute(graphile.FILL, n)
                    await bench.analyze(pool, graphile.ANALYZE)
                    await bench.measure_graphile(
                        f"drain {level} graphile-{mode}", n, "drain", str(c), mode
                    )
                    left = await pool.fetchval(graphile.LEFT)
                    if left:
                        raise RuntimeError(f"graphile-worker {mode} left {left} jobs behind")

                todo.append(gw)
            for step in _ordered(todo, flip):
                await step()
        if "drain-limit" in bench.phases:
            await limited_round(bench, pool, counts.pgqueuer, flip)
    finally:
        await pool.close()


async def limited_round(bench: Bench, pool: asyncpg.Pool, n: int, flip: bool) -> None:
    """The same drain of ``n`` no-op jobs of one name limited to ``LIMITED`` at once,
    16 slots: pgfleet's ``concurrency=`` against pgqueuer's ``concurrency_limit``."""
    todo: list[Callable[[], Awaitable[None]]] = []
    if bench.on("pgfleet"):

        async def fleet() -> None:
            await _reset(bench, pool)
            queue = Queue(pool)
            await fb._fill(pool, n)
            # After the fill: setting the limit flags the queued jobs.
            await queue.set_limits("noop", concurrency=LIMITED)
            try:
                await bench.analyze(pool, ANALYZE_PGFLEET)

                async def run() -> None:
                    await fb._drain_in_process(pool, 16)

                await bench.measure(f"drain limit{LIMITED} pgfleet", n, run)
            finally:
                await queue.clear_limits("noop")

        todo.append(fleet)
    if bench.on("pgqueuer"):
        for i, settings in enumerate(PGQUEUER_LIMITED):

            async def peer(s: dict[str, Any] = settings, i: int = i) -> None:
                await _reset(bench, pool)
                await _fill_pgqueuer(bench.dsn, n)
                await bench.analyze(pool, ANALYZE_PGQUEUER)

                async def run() -> None:
                    await _drain_pgqueuer(bench.dsn, n, dict(s))

                await bench.measure(f"drain limit{LIMITED} pgqueuer #{i}", n, run)

            todo.append(peer)
    for step in _ordered(todo, flip):
        await step()


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
    argv: list[str], env: dict[str, str], enqueue: Callable[[], Awaitable[str]], seconds: float
) -> list[float]:
    child = await asyncio.create_subprocess_exec(
        *guarded(argv),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    if (await child.stdout.readline()).strip() != b"ready":
        raise RuntimeError(f"latency worker {argv} failed to start")
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
        raise RuntimeError(f"{missing} jobs did not run ({argv})")
    return sorted((started[j] - t) * 1000 for j, t in expected.items())


LATENCY_PEERS = ("pgfleet", "pgqueuer", *GRAPHILE)


async def latency_round(bench: Bench, seconds: float, stale: bool, flip: bool) -> None:
    pool = await create_pool(bench.dsn, min_size=PRODUCERS + 2, max_size=PRODUCERS + 2)
    tag = "stale" if stale else "plain"
    peers = [p for p in LATENCY_PEERS if bench.on(p)]
    try:
        for peer in _ordered(peers, flip):
            await _reset(bench, pool)
            if stale:
                # Statistics analysed over a deep backlog that is gone by the run.
                if peer == "pgfleet":
                    await pool.execute(STALE_FILL_PGFLEET, 100_000)
                    await pool.execute("ANALYZE pgfleet.jobs")
                elif peer == "pgqueuer":
                    await pool.execute(STALE_FILL_PGQUEUER, 100_000)
                    await pool.execute("ANALYZE pgqueuer")
                else:
                    await pool.execute(graphile.ENSURE_TASK)
                    await pool.execute(graphile.FILL, 100_000)
                    await pool.execute(graphile.ANALYZE)
                await _reset(bench, pool)
            enqueue: Callable[[], Awaitable[str]]
            if peer == "pgfleet":
                queue = Queue(pool)

                async def enqueue(queue: Queue = queue) -> str:
                    return str(await queue.enqueue("noop", None))

                argv = [sys.executable, "-m", "tools.bench", "--child-latency", "16"]
                env = fb.child_env(bench.dsn)
            elif peer == "pgqueuer":
                pgq = _pgqueuer()
                from pgqueuer.db import AsyncpgPoolDriver

                queries = pgq.Queries(AsyncpgPoolDriver(pool))

                async def enqueue(queries: Any = queries) -> str:
                    return str((await queries.enqueue("noop", None))[0])

                argv = [sys.executable, "-m", "tools.bench.peers", "--child-pgqueuer-latency"]
                env = fb.child_env(bench.dsn)
            else:
                assert bench.install is not None

                async def enqueue() -> str:
                    return str(await pool.fetchval(graphile.ADD_JOB))

                mode = peer.removeprefix("graphile-")
                argv = graphile.latency_argv(bench.install, 16, mode)
                env = graphile.latency_env(bench.dsn, bench.max_pool)
            delays = await _latency(argv, env, enqueue, seconds)
            for q in (50, 99):
                bench.runs.add(f"pickup p{q} {tag} {peer}", fb._quantile(delays, q / 100))
    finally:
        await pool.close()


# ---------------------------------------------------------------- report


TABLE_PEERS = (
    "pgfleet",
    "pgfleet-noretain",
    "pgqueuer",
    "graphile-default",
    "graphile-batched",
    "raw",
)


def _row_keys(runs: Runs) -> dict[str, dict[str, float]]:
    """Each row of the table: contender -> median (each at its best setting)."""
    m = runs.median

    def best(*keys: str) -> float | None:
        have = [m(k) for k in keys if runs.has(k)]
        return max(have) if have else None

    rows: dict[str, dict[str, float | None]] = {
        "enqueue single": {
            "pgfleet": best("enqueue single pgfleet conn", "enqueue single pgfleet pool"),
            "pgqueuer": best("enqueue single pgqueuer conn", "enqueue single pgqueuer pool"),
            "graphile-default": best("enqueue single graphile"),
            "graphile-batched": best("enqueue single graphile"),
            "raw": best("enqueue single raw"),
        },
        "enqueue single, pool": {
            "pgfleet": best("enqueue single pgfleet pool"),
            "pgqueuer": best("enqueue single pgqueuer pool"),
        },
        "enqueue single, one connection": {
            "pgfleet": best("enqueue single pgfleet conn"),
            "pgqueuer": best("enqueue single pgqueuer conn"),
        },
        "enqueue batches of 500": {
            "pgfleet": best("enqueue batch500 pgfleet"),
            "pgqueuer": best("enqueue batch500 pgqueuer"),
            "graphile-default": best("enqueue batch500 graphile"),
            "graphile-batched": best("enqueue batch500 graphile"),
            "raw": best("enqueue batch500 raw"),
        },
    }
    for level, _ in LEVELS:
        rows[f"drain {level}"] = {
            "pgfleet": best(f"drain {level} pgfleet"),
            "pgfleet-noretain": best(f"drain {level} pgfleet-noretain"),
            "pgqueuer": best(
                *(f"drain {level} pgqueuer #{i}" for i in range(len(PGQUEUER_DRAIN[level])))
            ),
            "graphile-default": best(f"drain {level} graphile-default"),
            "graphile-batched": best(f"drain {level} graphile-batched"),
            "raw": best("drain raw claim1000+complete x2") if level == "c64" else None,
        }
    rows[f"drain limit{LIMITED} c16"] = {
        "pgfleet": best(f"drain limit{LIMITED} pgfleet"),
        "pgqueuer": best(
            *(f"drain limit{LIMITED} pgqueuer #{i}" for i in range(len(PGQUEUER_LIMITED)))
        ),
    }
    return {
        name: {k: v for k, v in row.items() if v is not None}
        for name, row in rows.items()
        if row.get("pgfleet") is not None and len([v for v in row.values() if v]) > 1
    }


def _drain_key(runs: Runs, level: str, peer: str) -> str | None:
    """The run key behind a drain row's figure (pgqueuer: its fastest setting)."""
    if peer == "pgqueuer":
        keys = [
            f"drain {level} pgqueuer #{i}"
            for i in range(len(PGQUEUER_DRAIN[level]))
            if runs.has(f"drain {level} pgqueuer #{i}")
        ]
        return max(keys, key=runs.median) if keys else None
    key = "drain raw claim1000+complete x2" if peer == "raw" else f"drain {level} {peer}"
    if peer == "raw" and level != "c64":
        return None
    return key if runs.has(key) else None


def report(runs: Runs) -> dict[str, Any]:
    rows = _row_keys(runs)
    out: dict[str, Any] = {"rows": {}, "criteria": {}}
    print("\nmedians, jobs/s (a row without a setting: each at its best; ratio: pgfleet / peer)")
    for name, row in rows.items():
        fleet = row["pgfleet"]
        cells = "  ".join(f"{p} {row[p]:,.0f}" for p in TABLE_PEERS if p in row)
        ratios = "  ".join(
            f"/{p} {fleet / row[p]:.2f}x" for p in TABLE_PEERS[1:] if p in row and p != "raw"
        )
        print(f"  {name:<30} {cells}   {ratios}")
        entry: dict[str, float] = dict(row)
        if "pgqueuer" in row:
            entry["ratio"] = fleet / row["pgqueuer"]
        for peer in GRAPHILE:
            if peer in row:
                entry[f"ratio_{peer.replace('-', '_')}"] = fleet / row[peer]
        out["rows"][name] = entry
    m = runs.median
    for tag in ("plain", "stale"):
        peers = [p for p in LATENCY_PEERS if runs.has(f"pickup p99 {tag} {p}")]
        if "pgfleet" not in peers or len(peers) < 2:
            continue
        entry = {}
        text = []
        for p in peers:
            p50, p99 = m(f"pickup p50 {tag} {p}"), m(f"pickup p99 {tag} {p}")
            entry[f"{p}_p50"], entry[f"{p}_p99"] = p50, p99
            text.append(f"{p} {p50:.1f}/{p99:.1f}")
        fleet99 = entry["pgfleet_p99"]
        if "pgqueuer" in peers:
            entry["ratio_p99"] = fleet99 / entry["pgqueuer_p99"]
        for peer in GRAPHILE:
            if peer in peers:
                entry[f"ratio_p99_{peer.replace('-', '_')}"] = fleet99 / entry[f"{peer}_p99"]
        print(f"  pickup p50/p99 ms {tag:<12} {'  '.join(text)}")
        out["rows"][f"pickup {tag}"] = entry
    print("\nCPU per job, ms (client, postgres), and WAL per run, medians")
    for key in sorted(runs.values):
        client, server = runs.cpu_median(key)
        if client is None:
            continue
        srv = "n/a" if server is None else f"{server:.4f}"
        wal = runs.wal_median(key)
        wal_text = "" if wal is None else f"  {wal / 2**20:8.1f} MiB"
        print(f"  {key:<36} {client:.4f}  {srv}{wal_text}")
        out.setdefault("cpu", {})[key] = {"client_ms": client, "postgres_ms": server}
        if wal is not None:
            jobs = runs.jobs.get(key)
            out.setdefault("wal", {})[key] = {
                "bytes": wal,
                "bytes_per_job": wal / jobs if jobs else None,
            }
    drains = _drain_table(runs)
    if drains:
        out["drains"] = drains
    criteria: dict[str, float] = {}

    def ratio(row: str, peer: str) -> float | None:
        r = rows.get(row, {})
        return r["pgfleet"] / r[peer] if peer in r else None

    def noretain(row: str) -> float | None:
        """pgfleet removing succeeded jobs at completion against graphile batched."""
        r = rows.get(row, {})
        if "pgfleet-noretain" in r and "graphile-batched" in r:
            return r["pgfleet-noretain"] / r["graphile-batched"]
        return None

    raw_single = m("enqueue single raw") if runs.has("enqueue single raw") else None
    raw_drain = (
        m("drain raw claim1000+complete x2")
        if runs.has("drain raw claim1000+complete x2")
        else None
    )
    wanted: dict[str, float | None] = {
        "drain c16 >= 2x pgqueuer's fastest": ratio("drain c16", "pgqueuer"),
        "drain c1 >= 0.8x raw single commit": (
            rows["drain c1"]["pgfleet"] / raw_single if raw_single and "drain c1" in rows else None
        ),
        "drain c64 >= 0.6x raw claim+complete": ratio("drain c64", "raw") if raw_drain else None,
        "enqueue single >= 1.1x pgqueuer": ratio("enqueue single", "pgqueuer"),
        "enqueue single >= 0.9x raw single insert": ratio("enqueue single", "raw"),
        "drain c1 >= 0.8x graphile batched": ratio("drain c1", "graphile-batched"),
        "drain c16 >= 1.0x graphile batched": ratio("drain c16", "graphile-batched"),
        "drain c64 >= 1.0x graphile batched": ratio("drain c64", "graphile-batched"),
        "drain c1 noretain >= 1.0x graphile batched": noretain("drain c1"),
        "drain c16 noretain >= 1.2x graphile batched": noretain("drain c16"),
        "drain c64 noretain >= 1.2x graphile batched": noretain("drain c64"),
    }
    criteria = {k: v for k, v in wanted.items() if v is not None}
    for tag in ("plain", "stale"):
        if "ratio_p99" in out["rows"].get(f"pickup {tag}", {}):
            criteria[f"pickup p99 {tag} <= 0.5x pgqueuer"] = out["rows"][f"pickup {tag}"][
                "ratio_p99"
            ]
    if criteria:
        print("\nthe issues' criteria (ratios)")
        for name, value in criteria.items():
            print(f"  {name:<44} {value:6.2f}")
    out["criteria"] = criteria
    out["raw"] = {
        k: v
        for k, v in (("single insert", raw_single), ("claim+complete x2", raw_drain))
        if v is not None
    }
    return out


def _drain_table(runs: Runs) -> dict[str, dict[str, Any]]:
    """Per drain level and contender: jobs/s, CPU per job (client + Postgres) and the
    run's WAL, medians; printed as a Markdown table (docs/benchmarks takes it)."""
    table: dict[str, dict[str, Any]] = {}
    lines = []
    for level, _ in LEVELS:
        for peer in TABLE_PEERS:
            key = _drain_key(runs, level, peer)
            if key is None:
                continue
            client, server = runs.cpu_median(key)
            wal = runs.wal_median(key)
            cell = {
                "jobs_per_s": runs.median(key),
                "client_ms": client,
                "postgres_ms": server,
                "wal_bytes": wal,
                "key": key,
            }
            table.setdefault(level, {})[peer] = cell
            cpu = (
                f"{client:.3f} + {server:.3f}"
                if client is not None and server is not None
                else "n/a"
            )
            jobs = runs.jobs.get(key)
            cell["jobs"] = jobs
            wal_text = "n/a" if wal is None else f"{wal / 2**20:,.0f}"
            if wal is not None and jobs:
                wal_text += f" ({wal / jobs:,.0f} B/job)"
            name = "raw (c64 row: claim 1000 + complete, 2 conns)" if peer == "raw" else peer
            lines.append(f"| {level} | {name} | {runs.median(key):,.0f} | {cpu} | {wal_text} |")
    if lines:
        print(
            "\n| drain | contender | jobs/s | CPU ms/job (client + Postgres) "
            "| WAL MiB/run (per job) |"
        )
        print("|---|---|---|---|---|")
        print("\n".join(lines))
    return table


async def main(args: argparse.Namespace) -> dict[str, Any]:
    contenders: list[str] = args.contenders
    if "pgqueuer" in contenders:
        _pgqueuer()
    install = None
    if any(c in contenders for c in GRAPHILE):
        try:
            install = await asyncio.to_thread(graphile.provision)
        except graphile.Unavailable as exc:
            raise SystemExit(
                f"graphile-worker is unavailable: {exc}\n"
                "(leave it out: --contenders pgfleet,pgqueuer,raw)"
            ) from None
    dsn = await _database(args, contenders)
    if install is not None:
        await graphile.setup(install, dsn)
    bench = Bench(
        dsn,
        contenders,
        args.phases,
        checkpoint=args.checkpoint,
        analyze_fill=args.analyze,
        install=install,
        max_pool=args.graphile_max_pool,
    )
    runs = bench.runs
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
                        "full_page_writes",
                        "checkpoint_timeout",
                        "max_wal_size",
                    ],
                )
            }
        finally:
            await admin.close()
        versions = {"pgqueuer": PGQUEUER_VERSION, **graphile.describe()}
        print(f"PostgreSQL {server} {settings}", flush=True)
        print(f"contenders {', '.join(contenders)}; phases {', '.join(args.phases)}", flush=True)
        print(f"versions {versions}; load average {os.getloadavg()}", flush=True)
        loads = [os.getloadavg()]
        counts = DrainCounts(
            args.drain_total,
            args.single_drain_total,
            args.pgqueuer_drain_total,
            args.graphile_default_drain_total,
        )
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}/{args.repeats}", flush=True)
            # Who goes first alternates between repeats (checkpoints, neighbours).
            flip = rep % 2 == 1
            if any(p.startswith("enqueue") for p in args.phases):
                await enqueue_round(bench, args.single, args.batch_total, flip)
            if any(p.startswith("drain") for p in args.phases):
                await drain_round(bench, counts, flip)
            if "latency-plain" in args.phases:
                await latency_round(bench, args.latency_seconds, stale=False, flip=flip)
            if "latency-stale" in args.phases:
                await latency_round(bench, args.latency_seconds, stale=True, flip=flip)
            loads.append(os.getloadavg())
        result = report(runs)
        print(f"load average (1, 5, 15 min) before and after each repeat: {loads}")
        result.update(
            {
                "runs": runs.values,
                "cpu_runs": runs.cpu,
                "wal_runs": runs.wal,
                "run_jobs": runs.jobs,
                "postgres": server,
                "settings": settings,
                "versions": versions,
                "contenders": contenders,
                "phases": args.phases,
                "jobs": {
                    "single": args.single,
                    "batch_total": args.batch_total,
                    "drain_total": args.drain_total,
                    "single_drain_total": args.single_drain_total,
                    "pgqueuer_drain_total": args.pgqueuer_drain_total,
                    "graphile_default_drain_total": args.graphile_default_drain_total,
                },
                "checkpoint_before_each_run": bench.checkpoint,
                "analyze_after_fill": bench.analyze_fill,
                "load_average": loads,
                "machine": {
                    "python": sys.version.split()[0],
                    "event_loop": args.loop,
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


def runs_from_json(saved: dict[str, Any]) -> Runs:
    """The measurements of a saved run (--json), to report them again."""
    runs = Runs(
        values={k: list(v) for k, v in saved["runs"].items()},
        cpu={k: [(c[0], c[1]) for c in v] for k, v in saved.get("cpu_runs", {}).items()},
        wal={k: list(v) for k, v in saved.get("wal_runs", {}).items()},
        jobs=dict(saved.get("run_jobs", {})),
    )
    if not runs.jobs and "jobs" in saved:  # saved before run_jobs: from the counts
        counts = saved["jobs"]
        for key in runs.values:
            if key.startswith("enqueue single"):
                runs.jobs[key] = counts["single"]
            elif key.startswith("enqueue batch"):
                runs.jobs[key] = counts["batch_total"]
            elif key.startswith("drain c1 pgqueuer"):
                runs.jobs[key] = counts["single_drain_total"]
            elif " pgqueuer" in key and key.startswith("drain"):
                runs.jobs[key] = counts.get("pgqueuer_drain_total", counts["drain_total"])
            elif key.endswith("graphile-default") and key.startswith("drain"):
                runs.jobs[key] = counts.get("graphile_default_drain_total", counts["drain_total"])
            elif key.startswith("drain"):
                runs.jobs[key] = counts["drain_total"]
    return runs


def cli(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child-pgqueuer-latency"]:
        asyncio.run(_pgqueuer_latency_child(os.environ[_CHILD_DSN]))
        return
    if argv[:1] == ["--report"] and len(argv) == 2:
        # python -m tools.bench.peers --report bench-results/peers.json: the report
        # of a saved run again (after a change of the report, say).
        with open(argv[1], encoding="utf-8") as fh:
            report(runs_from_json(json.load(fh)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGFLEET_BENCH_DSN"), required=False)
    parser.add_argument("--database", default="pgfleet_peers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--contenders",
        default="all",
        help=f"comma-separated: {', '.join(CONTENDERS)}, graphile (both modes), all",
    )
    parser.add_argument(
        "--phases",
        "--suites",
        dest="phases",
        default="all",
        help=f"comma-separated: {', '.join(PHASES)}, enqueue, drain, latency, all",
    )
    parser.add_argument("--single", type=int, default=2000, help="single enqueues per run")
    parser.add_argument("--batch-total", type=int, default=20_000)
    parser.add_argument(
        "--drain-total", type=int, default=200_000, help="jobs queued before each drain"
    )
    parser.add_argument(
        "--single-drain-total", type=int, default=3000, help="jobs of pgqueuer's c1 drain"
    )
    parser.add_argument(
        "--pgqueuer-drain-total",
        type=int,
        default=20_000,
        help="jobs of pgqueuer's c16 and c64 drains (it slows down on a deep queue)",
    )
    parser.add_argument(
        "--graphile-default-drain-total",
        type=int,
        default=20_000,
        help="jobs of graphile-worker's default-mode drains (about 1,000 jobs/s)",
    )
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    parser.add_argument(
        "--graphile-max-pool",
        type=int,
        default=graphile.DEFAULT_MAX_POOL,
        help="cap on graphile-worker's pool (it advises max(10, concurrency + 2))",
    )
    parser.add_argument(
        "--no-checkpoint",
        dest="checkpoint",
        action="store_false",
        help="no CHECKPOINT before each measurement",
    )
    parser.add_argument(
        "--no-analyze",
        dest="analyze",
        action="store_false",
        help="no ANALYZE of a queue after its fill, before its drain",
    )
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", dest="json_path")
    fb.add_loop_argument(parser)
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("--dsn (or PGFLEET_BENCH_DSN) is required")
    try:
        args.contenders = selection(args.contenders, CONTENDERS, _CONTENDER_GROUPS)
        args.phases = selection(args.phases, PHASES, _PHASE_GROUPS)
    except ValueError as exc:
        parser.error(str(exc))
    args.loop = fb.install_loop(args.loop)
    result = asyncio.run(main(args))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2, default=str)
        print(f"wrote {args.json_path}")


if __name__ == "__main__":
    cli()
