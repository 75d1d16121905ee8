"""The consumer side: a Worker claims jobs, runs their handlers and records outcomes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pgfleet import context
from pgfleet._runtime.cron_runner import CronService
from pgfleet._runtime.listener import Listener
from pgfleet._runtime.services import Heartbeat, Identity, Maintenance
from pgfleet._runtime.tracing import job_span
from pgfleet.backoff import retry_delay
from pgfleet.db import Q
from pgfleet.db.boundary import is_connection_error
from pgfleet.db.bounded import DEFAULT_DATABASE_TIMEOUT, Held, bounded
from pgfleet.db.migrate import check_schema
from pgfleet.db.pooler import LazyPool
from pgfleet.errors import InvalidOptions, PermanentError, SchemaNotReady
from pgfleet.events import WorkerEvents
from pgfleet.jobs import Job, JobStatus, validate_name
from pgfleet.payloads import describe_error, storable_text
from pgfleet.registry import Handler, Registry

log = logging.getLogger("pgfleet")

_MAX_ERROR_LENGTH = 4000
#: At shutdown, the longest wait for the database to take this worker off its list.
DEREGISTER_TIMEOUT = 3.0
#: The claim loop and the listener each hold one; heartbeat and maintenance share one.
_MIN_POOL_SIZE = 3


def _seconds(
    value: float | timedelta | None, what: str, *, allow_none: bool = False
) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise InvalidOptions(f"{what} is required")
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidOptions(f"{what} must be a number of seconds or a timedelta, got {value!r}")
    if value <= 0:
        raise InvalidOptions(f"{what} must be positive, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker runs. Durations are seconds (int/float) or ``timedelta``."""

    #: Handlers running at once in this worker.
    concurrency: int = 16
    #: How often an idle claim loop polls, whatever notifications do.
    poll_interval: float | timedelta = 2.0
    #: Job names this worker serves (default: every name in the registry).
    job_names: Collection[str] | None = None
    #: Named queues this worker serves (default: all jobs, named or not).
    queue_names: Collection[str] | None = None
    #: Time running handlers get to finish at shutdown before they are cancelled
    #: and their jobs requeued.
    shutdown_grace_period: float | timedelta = 30.0
    heartbeat_interval: float | timedelta = 5.0
    #: A worker whose heartbeat is older than this is dead: its jobs are recovered.
    dead_worker_timeout: float | timedelta = 30.0
    #: Finished jobs older than this are pruned in the background; None keeps all.
    finished_job_retention: float | timedelta | None = timedelta(days=30)
    prune_interval: float | timedelta = 60.0
    prune_batch_size: int = 1000
    #: Retry delay after attempt n: min(cap, base * 2**(n-1)) plus up to jitter * delay.
    backoff_base: float | timedelta = 1.0
    backoff_cap: float | timedelta = 3600.0
    backoff_jitter: float = 0.2
    #: Handler timeout unless the handler sets its own; None means no timeout.
    default_timeout: float | timedelta | None = 600.0
    #: LISTEN for wakeups (polling runs either way).
    listen: bool = True
    #: Take part in the election of the worker that runs fleet-wide maintenance.
    lead: bool = True
    #: Let the leader VACUUM (ANALYZE) the jobs table when dead tuples pile up:
    #: "auto" only when autovacuum is off for it, "always", or "never".
    vacuum: str = "auto"
    vacuum_interval: float | timedelta = 60.0
    #: Dead tuples below this (or below a fifth of the live ones) are left alone.
    vacuum_min_dead_tuples: int = 10_000
    #: Cron schedules are checked at least this often (and just after each
    #: occurrence); interval schedules shorter than this are capped to it.
    cron_poll_interval: float | timedelta = 5.0
    #: At shutdown, how long to keep trying to write outcomes to an unreachable
    #: database (jobs whose outcome was not written are recovered by the fleet).
    completion_flush_timeout: float | timedelta = 10.0
    #: Longest any database call of the runtime may take (claim round, heartbeat,
    #: listener, rescue, prune, cron, metrics), waiting for a connection included.
    #: A connection that does not answer in time is dropped and replaced.
    database_timeout: float | timedelta = DEFAULT_DATABASE_TIMEOUT
    #: The pool reaches the database through a pooler in transaction mode
    #: (PgBouncer ``pool_mode = transaction``): no session state is kept between
    #: transactions, and LISTEN runs only on ``listen_dsn`` (polling without it).
    #: Pair it with ``create_pool(..., pgbouncer=True)``.
    pgbouncer: bool = False
    #: Connection string of a direct or session-mode connection for LISTEN. The
    #: listener then holds one connection of its own instead of one of the pool's.
    listen_dsn: str | None = None

    def __post_init__(self) -> None:
        c = self.concurrency
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 10_000:
            raise InvalidOptions(f"concurrency must be an integer from 1 to 10000, got {c!r}")
        for name in (
            "poll_interval",
            "shutdown_grace_period",
            "heartbeat_interval",
            "dead_worker_timeout",
            "prune_interval",
            "backoff_base",
            "backoff_cap",
            "cron_poll_interval",
            "completion_flush_timeout",
            "vacuum_interval",
            "database_timeout",
        ):
            object.__setattr__(self, name, _seconds(getattr(self, name), name))
        if self.listen_dsn is not None and (
            not isinstance(self.listen_dsn, str) or not self.listen_dsn.strip()
        ):
            raise InvalidOptions(
                f"listen_dsn must be a non-empty connection string, got {self.listen_dsn!r}"
            )
        for name in ("finished_job_retention", "default_timeout"):
            object.__setattr__(self, name, _seconds(getattr(self, name), name, allow_none=True))
        if self.dead_worker_timeout < 2 * self.heartbeat_interval:  # type: ignore[operator]
            raise InvalidOptions(
                f"dead_worker_timeout ({self.dead_worker_timeout}s) must be at least twice "
                f"heartbeat_interval ({self.heartbeat_interval}s), or live workers look dead"
            )
        if self.backoff_cap < self.backoff_base:  # type: ignore[operator]
            raise InvalidOptions("backoff_cap must be at least backoff_base")
        j = self.backoff_jitter
        if isinstance(j, bool) or not isinstance(j, int | float) or not 0 <= j <= 1:
            raise InvalidOptions(f"backoff_jitter must be between 0 and 1, got {j!r}")
        if self.vacuum not in ("auto", "always", "never"):
            raise InvalidOptions(f"vacuum must be 'auto', 'always' or 'never', got {self.vacuum!r}")
        v = self.vacuum_min_dead_tuples
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidOptions(
                f"vacuum_min_dead_tuples must be a non-negative integer, got {v!r}"
            )
        b = self.prune_batch_size
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 100_000:
            raise InvalidOptions(f"prune_batch_size must be from 1 to 100000, got {b!r}")
        for name in ("job_names", "queue_names"):
            names = getattr(self, name)
            if names is None:
                continue
            if isinstance(names, str) or not isinstance(names, Collection):
                raise InvalidOptions(f"{name} must be a collection of names, not {names!r}")
            what = "job name" if name == "job_names" else "queue name"
            object.__setattr__(self, name, frozenset(validate_name(n, what) for n in names))

    def seconds(self, name: str) -> float:
        value = getattr(self, name)
        assert isinstance(value, float)
        return value

    def optional_seconds(self, name: str) -> float | None:
        value = getattr(self, name)
        assert value is None or isinstance(value, float)
        return value


@dataclass
class RunStats:
    """What one ``Worker.run`` did, by outcome (as written to the database)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    aborted: int = 0
    cancelled: int = 0
    rescued: int = 0
    by_name: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, name: str, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        per = self.by_name.setdefault(name, {})
        per[outcome] = per.get(outcome, 0) + 1


class _Outcome:
    """A finished attempt waiting to be written."""

    __slots__ = ("delay", "duration", "error", "job", "kind", "label", "resent")

    def __init__(
        self,
        job: Job,
        kind: str,
        label: str,
        duration: float,
        delay: float = 0.0,
        error: str | None = None,
    ) -> None:
        self.job = job
        self.kind = kind  # what the database does: succeeded / retry / failed / aborted
        self.label = label  # what the events report: succeeded / retried / failed / aborted
        self.duration = duration
        self.delay = delay
        self.error = error
        self.resent = False


class _Fanout(WorkerEvents):
    """Sends every event to several listeners."""

    def __init__(self, targets: list[WorkerEvents]) -> None:
        self.targets = targets

    def job_started(self, job: Job, pickup_delay: float) -> None:
        for t in self.targets:
            t.job_started(job, pickup_delay)

    def job_finished(self, job: Job, outcome: str, duration: float) -> None:
        for t in self.targets:
            t.job_finished(job, outcome, duration)

    def wakeup(self, source: str) -> None:
        for t in self.targets:
            t.wakeup(source)

    def jobs_rescued(self, count: int) -> None:
        for t in self.targets:
            t.jobs_rescued(count)

    def leader_changed(self, is_leader: bool) -> None:
        for t in self.targets:
            t.leader_changed(is_leader)


class Worker:
    """Runs the handlers of ``registry`` for jobs in the database behind ``pool``.

    The pool must allow at least three connections for the worker (claim loop,
    listener, heartbeat and maintenance; a smaller pool raises InvalidOptions),
    besides what handlers use themselves.
    """

    def __init__(
        self,
        pool: Any,
        registry: Registry,
        config: WorkerConfig | None = None,
        *,
        crons: Sequence[Any] = (),
        events: WorkerEvents | None = None,
    ) -> None:
        self.config = config or WorkerConfig()
        if not isinstance(self.config, WorkerConfig):
            raise InvalidOptions("config must be a WorkerConfig")
        if not isinstance(registry, Registry):
            raise InvalidOptions("registry must be a pgfleet.Registry")
        get_max_size = getattr(pool, "get_max_size", None)
        max_size = get_max_size() if callable(get_max_size) else None
        if max_size is not None and max_size < _MIN_POOL_SIZE:
            raise InvalidOptions(
                f"a worker needs a pool of at least {_MIN_POOL_SIZE} connections (claim "
                f"loop, listener, heartbeat and maintenance), got max_size={max_size}"
            )
        self.id = uuid.uuid4()
        self._pool = pool
        self._timeout = self.config.seconds("database_timeout")
        #: The runtime's own calls: each bounded by database_timeout.
        self._db = bounded(pool, self._timeout)
        self._registry = registry
        self._events = events or WorkerEvents()
        served = self.config.job_names
        if served is not None:
            unknown = sorted(set(served) - registry.names())
            if unknown:
                raise InvalidOptions(f"job_names {unknown} have no handler in the registry")
        self._names = sorted(served if served is not None else registry.names())
        self._queue_names = (
            None if self.config.queue_names is None else sorted(self.config.queue_names)
        )
        self._crons = list(crons)
        self._cron_service: CronService | None = None
        if self._crons:
            self._cron_service = CronService(self._db, registry, self._crons, self.config)
        cfg = self.config
        self._concurrency = cfg.concurrency
        self._poll = cfg.seconds("poll_interval")
        self._default_timeout = cfg.optional_seconds("default_timeout")
        self._running: dict[uuid.UUID, asyncio.Task[_Outcome]] = {}
        self._outcomes: list[_Outcome] = []
        self._wake_event = asyncio.Event()
        self._wake_source = "start"
        self._stopping = False
        self._burst = False
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._state: context.WorkerState | None = None
        self.stats = RunStats()
        self._started = asyncio.Event()
        identity = Identity.new(self.id, cfg.concurrency, self._names, self._queue_names)
        self._heartbeat = Heartbeat(
            self._db,
            identity,
            interval=cfg.seconds("heartbeat_interval"),
            lease=cfg.seconds("dead_worker_timeout"),
            lead=cfg.lead,
            events=self._events,
            on_leader=self._on_leader,
        )
        self._maintenance = Maintenance(
            self._db,
            interval=cfg.seconds("heartbeat_interval"),
            is_leader=lambda: self._heartbeat.is_leader,
            retention=cfg.optional_seconds("finished_job_retention"),
            prune_interval=cfg.seconds("prune_interval"),
            prune_batch_size=cfg.prune_batch_size,
            rescue_batch_size=1000,
            vacuum=cfg.vacuum,
            vacuum_interval=cfg.seconds("vacuum_interval"),
            vacuum_min_dead=cfg.vacuum_min_dead_tuples,
            events=self._events,
            wake=self._notify_fleet,
            clock=time.monotonic,
        )
        #: The listener's own connection (listen_dsn), closed when the worker stops.
        self._listen_pool: LazyPool | None = None
        self._listener: Listener | None = None
        self._pooled = cfg.pgbouncer
        if cfg.listen and cfg.listen_dsn is not None:
            self._listen_pool = LazyPool(cfg.listen_dsn)
            self._listener = Listener(self._listen_pool, self._wake, timeout=self._timeout)
        elif cfg.listen and not cfg.pgbouncer:
            self._listener = Listener(pool, self._wake, timeout=self._timeout)
        #: Claim-loop health, for readiness: consecutive failed rounds, when the
        #: current round began (None between rounds), when the failures began.
        self._failures = 0
        self._unreachable = 0
        self._round_started: float | None = None
        self._failing_since: float | None = None

    # ------------------------------------------------------------ public

    async def wait_started(self) -> None:
        """Return once the worker is registered and its services run."""
        await self._started.wait()

    @property
    def on_enqueued(self) -> Callable[[str, int], None] | None:
        """Called with (name, count) for each job this worker's cron schedules
        create (a metrics hook, like ``Queue.on_enqueued``)."""
        return None if self._cron_service is None else self._cron_service.on_enqueued

    @on_enqueued.setter
    def on_enqueued(self, hook: Callable[[str, int], None] | None) -> None:
        if self._cron_service is not None:
            self._cron_service.on_enqueued = hook

    @property
    def served_names(self) -> list[str]:
        """The job names this worker claims."""
        return list(self._names)

    def add_events(self, events: WorkerEvents) -> None:
        """Also send runtime events to ``events`` (call before ``run``)."""
        if isinstance(self._events, _Fanout):
            self._events.targets.append(events)
        else:
            self._events = _Fanout([self._events, events])
        self._heartbeat.events = self._events
        self._maintenance.events = self._events

    @property
    def is_leader(self) -> bool:
        return self._heartbeat.is_leader

    @property
    def active_jobs(self) -> int:
        return len(self._running)

    @property
    def maintenance(self) -> Maintenance:
        return self._maintenance

    @property
    def heartbeat(self) -> Heartbeat:
        return self._heartbeat

    @property
    def listener(self) -> Listener | None:
        return self._listener

    async def run(self, shutdown: Awaitable[Any] | None = None, *, burst: bool = False) -> RunStats:
        """Run until ``shutdown`` completes (or, with ``burst``, until no runnable
        job is left), then drain gracefully and return what was done."""
        self._burst = burst
        stop = asyncio.ensure_future(shutdown) if shutdown is not None else None
        claim: asyncio.Task[None] | None = None
        try:
            if not await self._start(stop):
                return self.stats
            claim = asyncio.get_running_loop().create_task(self._claim_loop(), name="pgfleet-claim")
            waiters: list[asyncio.Future[Any]] = [claim]
            if stop is not None:
                waiters.append(stop)
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            crashed = claim.exception() if claim.done() else None
            if crashed is not None:
                # A bug, not an outage (those are retried inside the loop): still
                # give running handlers their grace and write their outcomes.
                log.error("claim loop of worker %s failed", self.id, exc_info=crashed)
            await self._drain(claim, self.config.seconds("shutdown_grace_period"))
            if crashed is not None:
                raise crashed
        except asyncio.CancelledError:
            # The claim loop stops claiming once _drain sets _stopping; it is
            # awaited there (or cancelled at the flush timeout), never left behind.
            await self._drain(claim, 0.0)
            raise
        finally:
            if stop is not None and not stop.done():
                stop.cancel()
            await self._stop_services()
        self.stats.rescued = self._maintenance.rescued
        return self.stats

    # ------------------------------------------------------------ lifecycle

    async def _start(self, stop: asyncio.Future[Any] | None) -> bool:
        """Register and start the services; False if told to stop before that
        could happen (the database stayed unreachable)."""
        context.install_log_record_factory()
        delay = 0.5
        while True:
            try:
                async with self._db.acquire("schema check") as conn:
                    await check_schema(conn)
                await self._heartbeat.run_once()
                if self._cron_service is not None:
                    await self._cron_service.prepare()
                break
            except SchemaNotReady:
                raise
            except Exception as exc:
                if not is_connection_error(exc):
                    raise
                log.warning(
                    "database unavailable at worker start (%s); retrying in %.1fs", exc, delay
                )
                if stop is not None:
                    done, _ = await asyncio.wait([stop], timeout=delay)
                    if done:
                        log.info("worker %s stopped before it could start", self.id)
                        return False
                else:
                    await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
        loop = asyncio.get_running_loop()
        assert self._heartbeat.started_at is not None
        self._state = context.WorkerState(
            started_at=self._heartbeat.started_at,
            shutting_down=threading.Event(),
            shutdown_future=loop.create_future(),
        )
        for hook in self._registry.startup_hooks:
            result = hook(self._pool)
            if inspect.isawaitable(result):
                await result
        log.info(
            "worker %s started: concurrency %d, serving %s",
            self.id,
            self._concurrency,
            ", ".join(self._names) or "no job names",
        )
        if self._listener is not None:
            self._listener.start()
        elif _listen_skipped(self.config):
            log.info(
                "behind a transaction-mode pooler without listen_dsn: not listening for "
                "wakeups; idle workers poll every %gs",
                self._poll,
            )
        self._heartbeat.start()
        self._maintenance.start()
        if self._cron_service is not None:
            self._cron_service.start()
        self._started.set()
        return True

    async def _drain(self, claim: asyncio.Task[None] | None, grace: float) -> None:
        """Stop claiming, give running handlers ``grace`` seconds, cancel the rest
        (their jobs are requeued), and write every outcome."""
        self._stopping = True
        if self._state is not None and not self._state.shutting_down.is_set():
            self._state.shutting_down.set()
            self._state.shutdown_future.set_result(None)
        self._wake("completion")
        if self._running:
            log.info("worker %s draining: %d jobs running", self.id, len(self._running))
            pending: set[asyncio.Task[_Outcome]] = set(self._running.values())
            if grace > 0:
                _, pending = await asyncio.wait(pending, timeout=grace)
            if pending:
                log.info(
                    "cancelling %d handlers still running after the grace period", len(pending)
                )
                for task in pending:
                    task.cancel()
                _, stuck = await asyncio.wait(pending, timeout=5.0)
                if stuck:
                    log.error(
                        "%d handlers ignored cancellation; their jobs will be recovered", len(stuck)
                    )
                    for task in stuck:
                        self._running = {k: v for k, v in self._running.items() if v is not task}
        if claim is None or claim.done():
            claim = asyncio.get_running_loop().create_task(self._claim_loop(), name="pgfleet-flush")
        self._wake("completion")
        try:
            await asyncio.wait_for(claim, self.config.seconds("completion_flush_timeout"))
        except TimeoutError:
            log.error(
                "could not write %d job outcomes before stopping; those jobs will be "
                "recovered from this worker after its heartbeat expires",
                len(self._outcomes),
            )

    async def _stop_services(self) -> None:
        if self._state is not None:
            for hook in self._registry.shutdown_hooks:
                try:
                    result = hook(self._pool)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("shutdown hook %r failed", hook)
        # Together, each bounded: a database that does not answer delays the stop
        # by seconds, not by a round trip per service.
        stops = [self._maintenance.stop(), self._heartbeat.stop()]
        if self._cron_service is not None:
            stops.append(self._cron_service.stop())
        if self._listener is not None:
            stops.append(self._listener.stop())
        await asyncio.gather(*stops)
        if self._listen_pool is not None:
            with contextlib.suppress(Exception):
                await self._listen_pool.close(min(self._timeout, 5.0))
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._state is not None:
            try:
                async with asyncio.timeout(min(self._timeout, DEREGISTER_TIMEOUT)):
                    await self._heartbeat.deregister()
            except Exception as exc:
                log.warning(
                    "could not deregister worker %s (%s); the fleet recovers its jobs once "
                    "its heartbeat expires",
                    self.id,
                    str(exc) or type(exc).__name__,
                )
            log.info("worker %s stopped", self.id)

    def _on_leader(self, leader: bool) -> None:
        if leader:
            self._maintenance.kick()

    async def _notify_fleet(self) -> None:
        with contextlib.suppress(Exception):
            await self._db.execute(Q.notify_wakeup.sql)

    # ------------------------------------------------------------ claim loop

    def _wake(self, source: str) -> None:
        if not self._wake_event.is_set():
            self._wake_source = source
            self._wake_event.set()

    async def _wait(self, timeout: float | None) -> None:
        if not self._wake_event.is_set():
            if timeout is None:
                await self._wake_event.wait()
            else:
                try:
                    await asyncio.wait_for(self._wake_event.wait(), timeout)
                except TimeoutError:
                    self._wake_source = "poll"
        self._events.wakeup(self._wake_source)

    async def _claim_loop(self) -> None:
        """One round trip per turn: write finished outcomes and claim free slots.

        Every round is bounded by ``database_timeout``: a connection that does not
        answer is dropped and the round retried on a new one. A round that fails for
        any other reason has its outcomes written one by one, so that one outcome the
        database refuses can never hold back the others."""
        held: Held | None = None
        idle = False
        refused = 0
        try:
            while True:
                if self._stopping and not self._running and not self._outcomes:
                    return
                free = 0 if self._stopping else self._concurrency - len(self._running)
                if not self._outcomes:
                    if free == 0:
                        self._wake_event.clear()
                        await self._wait(None)
                        continue
                    if idle:
                        await self._wait(self._poll)
                        idle = False
                        continue
                self._wake_event.clear()
                batch, self._outcomes = self._outcomes, []
                self._round_started = time.monotonic()
                try:
                    if held is not None and held.closed():
                        held.drop()  # closed under us: make sure its slot goes back
                        held = None
                    reached = held is not None
                    async with asyncio.timeout(self._timeout):
                        if held is None:
                            held = Held(await self._pool.acquire(timeout=self._timeout))
                            if not self._pooled:
                                await held.conn.execute(Q.claim_session_begin.sql)
                            reached = True
                            if self._failures:
                                await self._release_unknown(held.conn, batch)
                        rows = await self._claim(
                            held.conn,
                            [o.job.id for o in batch],
                            [o.job.lock_token for o in batch],
                            [o.kind for o in batch],
                            [o.delay for o in batch],
                            [o.error for o in batch],
                            self.id,
                            self._names,
                            self._queue_names,
                            free,
                        )
                except TimeoutError:
                    await self._round_failed(batch, held, None, reached=False)
                    held = None
                    continue
                except Exception as exc:
                    if held is not None and not held.closed() and not is_connection_error(exc):
                        # The database answered, and refused: not an outage.
                        self._round_started = None
                        refused += 1
                        await self._isolate(held.conn, batch, exc, refused)
                        await self._pause(min(30.0, 0.05 * 2 ** min(refused, 10)))
                        continue
                    await self._round_failed(batch, held, exc, reached=reached)
                    held = None
                    continue
                self._round_started = None
                refused = 0
                if self._failures:
                    assert self._failing_since is not None
                    log.warning(
                        "claim loop of worker %s reaches the database again after %.1fs "
                        "(%d failed rounds)",
                        self.id,
                        time.monotonic() - self._failing_since,
                        self._failures,
                    )
                    self._failures = 0
                    self._unreachable = 0
                    self._failing_since = None
                claimed = self._settle(batch, rows)
                idle = claimed < free
                if self._burst and idle and not self._running and not self._outcomes:
                    self._stopping = True
                    return
        finally:
            if held is not None and self._round_started is not None:
                held.drop()  # cut mid-round (flush timeout, cancellation): state unknown
            self._round_started = None
            if held is not None and not held.closed():
                try:
                    async with asyncio.timeout(min(self._timeout, 5.0)):
                        if not self._pooled:
                            await held.conn.execute(Q.claim_session_end.sql)
                except BaseException:
                    # Closed, not released: its session was not reset (and a live
                    # connection kept out of the pool is one pool.close() waits for).
                    held.drop()
                else:
                    with contextlib.suppress(Exception):
                        await held.release(self._pool, min(self._timeout, 5.0))
            elif held is not None:
                held.drop()

    async def _claim(self, conn: Any, *args: Any) -> list[Any]:
        """One claim round's statement. Behind a transaction-mode pooler it runs in a
        transaction of its own that carries the planner settings (SET LOCAL); a
        direct connection has them on its session (claim_session_begin)."""
        if not self._pooled:
            return list(await conn.fetch(Q.job_complete_and_claim.sql, *args))
        await conn.execute(Q.claim_transaction_begin.sql)
        try:
            rows = await conn.fetch(Q.job_complete_and_claim.sql, *args)
            await conn.execute(Q.claim_transaction_commit.sql)
        except Exception:
            if not conn.is_closed() and conn.is_in_transaction():
                with contextlib.suppress(Exception):
                    await conn.execute(Q.claim_transaction_rollback.sql)
            raise
        return list(rows)

    async def _round_failed(
        self, batch: list[_Outcome], held: Held | None, exc: BaseException | None, *, reached: bool
    ) -> None:
        """The round's connection failed or hung: put its outcomes back, drop the
        connection and retry after a backoff. Says so once, not every round.

        A connection that was working and then closed (``reached``: a server
        restart, pg_terminate_backend, a pooler recycling it) is replaced at once; the
        backoff grows only while the database cannot be reached at all."""
        for o in batch:
            o.resent = True
        self._outcomes[:0] = batch
        if held is not None:
            held.drop()
        if exc is None:
            await self._db.hang_detected("claim round")
            reason = f"no answer within {self._timeout:g}s; connection dropped"
        else:
            reason = str(exc) or type(exc).__name__
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        if reached:
            self._unreachable = 0
            delay = 0.05
        else:
            self._unreachable += 1
            delay = min(30.0, 0.05 * 2 ** min(self._unreachable, 10))
        if self._failures == 1:
            log.warning(
                "claim round of worker %s failed (%s); retrying with backoff, the worker "
                "is unready until the database answers",
                self.id,
                reason,
            )
        else:
            log.debug("claim round failed again (%s); retrying in %.2fs", reason, delay)
        self._round_started = None
        await self._pause(delay)

    async def _isolate(
        self, conn: Any, batch: list[_Outcome], exc: BaseException, refused: int
    ) -> None:
        """Write a refused round's outcomes one at a time, claiming nothing. An
        outcome the database refuses is replaced by a permanent failure that says
        why, so its job ends instead of blocking every later round."""
        if batch or refused == 1 or refused % 100 == 0:
            log.error(
                "claim round of worker %s was refused by the database (%s: %s)%s",
                self.id,
                type(exc).__name__,
                exc,
                f"; writing its {len(batch)} outcomes one by one" if batch else "",
            )
        for index, o in enumerate(batch):
            try:
                rows = await self._write_one(conn, o)
            except Exception as exc:
                if is_connection_error(exc) or isinstance(exc, TimeoutError):
                    for rest in batch[index:]:
                        rest.resent = True
                    self._outcomes[:0] = batch[index:]
                    return
                error = storable_text(
                    f"pgfleet could not record this attempt's {o.label} outcome: "
                    f"{type(exc).__name__}: {exc}"
                )
                log.error("job %s (%s): %s", o.job.id, o.job.name, error)
                o.kind, o.label, o.delay, o.error = "failed", "failed", 0.0, error
                try:
                    rows = await self._write_one(conn, o)
                except Exception as again:
                    log.error(
                        "job %s (%s): its outcome cannot be written (%s); it stays running "
                        "until this worker stops and the fleet recovers it",
                        o.job.id,
                        o.job.name,
                        again,
                    )
                    continue
            self._settle([o], rows)

    async def _write_one(self, conn: Any, o: _Outcome) -> list[Any]:
        async with asyncio.timeout(self._timeout):
            return list(
                await conn.fetch(
                    Q.job_complete_and_claim.sql,
                    [o.job.id],
                    [o.job.lock_token],
                    [o.kind],
                    [o.delay],
                    [o.error],
                    self.id,
                    self._names,
                    self._queue_names,
                    0,
                )
            )

    def health(self) -> str | None:
        """None while the claim loop reaches the database, else why it does not."""
        if self._failures:
            return f"claim loop cannot reach the database ({self._failures} failed rounds)"
        started = self._round_started
        if started is not None:
            waited = time.monotonic() - started
            if waited > max(self._timeout / 3, 1.0):
                return f"claim round waiting for the database for {waited:.0f}s"
        return None

    async def _release_unknown(self, conn: Any, batch: list[_Outcome]) -> None:
        known = list(self._running) + [o.job.id for o in batch] + [o.job.id for o in self._outcomes]
        released = await conn.fetchval(Q.job_release_unknown.sql, self.id, known)
        if released:
            log.warning(
                "released %d jobs claimed by a round whose answer was lost with the connection",
                released,
            )

    async def _pause(self, delay: float) -> None:
        await asyncio.sleep(delay)

    def _settle(self, batch: list[_Outcome], rows: list[Any]) -> int:
        applied: set[uuid.UUID] = set()
        claimed = 0
        for row in rows:
            if row["claimed"]:
                self._launch(row)
                claimed += 1
            else:
                applied.add(row["id"])
        for o in batch:
            job = o.job
            # A resent outcome not applied now was most likely applied by the round
            # that first carried it, which committed before its connection dropped.
            if job.id in applied or o.resent:
                self.stats.count(job.name, o.label)
                self._events.job_finished(job, o.label, o.duration)
            else:
                log.warning(
                    "job %s (%s) was taken away while running (recovered, or completed or "
                    "failed by an operator): its %s outcome was discarded",
                    job.id,
                    job.name,
                    o.label,
                )
                self.stats.count(job.name, "cancelled")
                self._events.job_finished(job, "cancelled", o.duration)
        self.stats.claimed += claimed
        return claimed

    def _launch(self, row: Any) -> None:
        payload = row["payload"]
        job = Job(
            id=row["id"],
            name=row["name"],
            payload=None if payload is None else json.loads(payload),
            status=JobStatus.RUNNING,
            attempt=row["attempt"],
            max_attempts=row["max_attempts"],
            priority=row["priority"],
            queue_name=row["queue_name"],
            job_key=row["job_key"],
            run_at=row["run_at"],
            created_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=None,
            last_error=row["last_error"],
            worker_id=self.id,
            lock_token=row["lock_token"],
        )
        if self._stopping:
            # Claimed by a round that was in flight when the drain began: hand it
            # straight back, its attempt not counted, instead of starting it.
            self._outcomes.append(_Outcome(job, "aborted", "aborted", 0.0))
            return
        handler = self._registry.get(job.name)
        assert handler is not None  # the claim only takes names we serve
        pickup = (job.started_at - job.run_at).total_seconds() if job.started_at else 0.0
        task = asyncio.get_running_loop().create_task(self._execute(handler, job, pickup))
        self._running[job.id] = task
        task.add_done_callback(functools.partial(self._job_task_done, job))

    def _job_task_done(self, job: Job, task: asyncio.Task[_Outcome]) -> None:
        """Report a job task's outcome. A task cancelled (at shutdown) before its
        first step never ran _execute at all: its job is handed back, not counted."""
        self._running.pop(job.id, None)
        self._outcomes.append(
            _Outcome(job, "aborted", "aborted", 0.0) if task.cancelled() else task.result()
        )
        self._wake("completion")

    # ------------------------------------------------------------ one job

    async def _execute(self, handler: Handler, job: Job, pickup: float) -> _Outcome:
        """Run one job and return its outcome; _job_task_done reports it."""
        start = time.perf_counter()
        try:
            assert self._state is not None
            context.enter_job(self._state, job)
            log.info(
                "job started: %s %s attempt %d/%d%s",
                job.name,
                job.id,
                job.attempt,
                job.max_attempts,
                f" queue {job.queue_name}" if job.queue_name else "",
            )
            self._events.job_started(job, pickup)
            return await self._attempt(handler, job, start)
        except BaseException as exc:  # never let a job task die without an outcome
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("internal error running job %s", job.id)
            return _Outcome(job, "aborted", "aborted", time.perf_counter() - start)

    async def _attempt(self, handler: Handler, job: Job, start: float) -> _Outcome:
        timeout = handler.timeout if handler.timeout is not None else self._default_timeout
        error: BaseException | None = None
        timed_out = False
        try:
            payload = handler.decode(job.payload) if handler.takes_payload else None
            with job_span(job):
                if handler.is_async:
                    async with asyncio.timeout(timeout) as scope:
                        try:
                            await handler.call(job, payload)
                        finally:
                            timed_out = scope.expired()
                else:
                    timed_out = await self._run_in_thread(handler, job, payload, timeout)
                    if timed_out:
                        error = TimeoutError()
        except asyncio.CancelledError:
            if timed_out:
                error = TimeoutError()
            else:
                log.info("job aborted at shutdown and requeued: %s %s", job.name, job.id)
                return _Outcome(job, "aborted", "aborted", time.perf_counter() - start)
        except TimeoutError as exc:
            error = exc
        except Exception as exc:
            error = exc
        duration = time.perf_counter() - start
        if error is None:
            log.info("job succeeded: %s %s in %.1f ms", job.name, job.id, duration * 1000)
            return _Outcome(job, "succeeded", "succeeded", duration)
        if timed_out:
            message = f"TimeoutError: handler ran longer than its timeout of {timeout}s"
        else:
            message = describe_error(error, _MAX_ERROR_LENGTH)
        if handler.infallible:
            log.warning(
                "infallible job %s %s raised (recorded as succeeded): %s",
                job.name,
                job.id,
                message,
                exc_info=error,
            )
            return _Outcome(job, "succeeded", "succeeded", duration)
        if isinstance(error, PermanentError) or job.attempt >= job.max_attempts:
            log.error(
                "job failed permanently: %s %s attempt %d/%d: %s",
                job.name,
                job.id,
                job.attempt,
                job.max_attempts,
                message,
                exc_info=error,
            )
            return _Outcome(job, "failed", "failed", duration, error=message)
        cfg = self.config
        delay = retry_delay(
            job.attempt,
            base=cfg.seconds("backoff_base"),
            cap=cfg.seconds("backoff_cap"),
            jitter=cfg.backoff_jitter,
        )
        log.warning(
            "job failed and will retry: %s %s attempt %d/%d in %.1fs: %s",
            job.name,
            job.id,
            job.attempt,
            job.max_attempts,
            delay,
            message,
            exc_info=error,
        )
        return _Outcome(job, "retry", "retried", duration, delay=delay, error=message)

    async def _run_in_thread(
        self, handler: Handler, job: Job, payload: Any, timeout: float | None
    ) -> bool:
        """Run a sync handler in the worker's threads; True when its timeout cut it
        (a TimeoutError the handler raised itself is its own error, re-raised)."""
        if self._threads is None:
            self._threads = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._concurrency, thread_name_prefix="pgfleet-job"
            )
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._threads, ctx.run, handler.call, job, payload)
        # The thread cannot be stopped: on timeout or shutdown its result is ignored.
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            if future.done() and not future.cancelled():
                raise  # the handler's own
            return True
        return False


def _listen_skipped(config: WorkerConfig) -> bool:
    """LISTEN was asked for but cannot run: a transaction-mode pooler and no listen_dsn."""
    return config.listen and config.pgbouncer and config.listen_dsn is None
