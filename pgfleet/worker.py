"""The consumer side: a Worker claims jobs, runs their handlers and records outcomes."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pgfleet import context
from pgfleet._runtime import gc_tuning
from pgfleet._runtime.cancelling import CancelWatcher
from pgfleet._runtime.claimer import ClaimLoop
from pgfleet._runtime.execution import JobRunner
from pgfleet._runtime.flow import write_code_limits
from pgfleet._runtime.listener import Listener
from pgfleet._runtime.maintenance import Historian, Pruner, Rescuer, Vacuumer
from pgfleet._runtime.outcomes import Outcome, RunStats
from pgfleet._runtime.services import Heartbeat, Identity, Periodic
from pgfleet.config import WorkerConfig as WorkerConfig
from pgfleet.cron import CronJob  # still importable from here
from pgfleet.cron.runner import CronService
from pgfleet.db import CANCEL_CHANNEL
from pgfleet.db.deadlines import AppPool, bounded
from pgfleet.db.migrate import check_schema
from pgfleet.db.store import Store
from pgfleet.db.transaction_pooling import LazyPool
from pgfleet.db.translate import is_connection_error, login_refused
from pgfleet.errors import InvalidOptions, SchemaNotReady
from pgfleet.events import WorkerEvents
from pgfleet.jobs import Job
from pgfleet.registry import Registry

__all__ = ["RunStats", "Worker", "WorkerConfig"]

log = logging.getLogger("pgfleet")

#: At shutdown, the longest wait for the database to take this worker off its list.
DEREGISTER_TIMEOUT = 3.0
#: Rows the leader's rescue takes per statement.
RESCUE_BATCH_SIZE = 1000
#: The claim loop and the listener each hold one; the heartbeat and the leader's
#: chores (which take turns) share one.
_MIN_POOL_SIZE = 3


class _Fanout(WorkerEvents):
    """Sends every event to several listeners."""

    def __init__(self, targets: list[WorkerEvents]) -> None:
        self.targets = targets

    def job_started(self, job: Job, pickup_delay: float) -> None:
        for t in self.targets:
            t.job_started(job, pickup_delay)

    def jobs_claimed(self, count: int) -> None:
        for t in self.targets:
            t.jobs_claimed(count)

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
        pool: AppPool,
        registry: Registry,
        config: WorkerConfig | None = None,
        *,
        crons: Sequence[CronJob] = (),
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
        self._state: context.WorkerState | None = None
        self.stats = RunStats()
        self._executor = JobRunner(
            registry,
            concurrency=cfg.concurrency,
            default_timeout=cfg.optional_seconds("default_timeout"),
            backoff_base=cfg.seconds("backoff_base"),
            backoff_cap=cfg.seconds("backoff_cap"),
            backoff_jitter=cfg.backoff_jitter,
            events=self._events,
            on_outcome=self._on_outcome,
            prefetch=cfg.prefetch,
            prefetch_window=cfg.seconds("prefetch_window"),
        )
        self._cancels = CancelWatcher(self._executor, grace=cfg.seconds("cancel_grace_period"))
        self._claims = ClaimLoop(
            self.id,
            pool,
            self._db,
            self._executor,
            names=self._names,
            queue_names=self._queue_names,
            poll_interval=self._poll,
            timeout=self._timeout,
            pooled=cfg.pgbouncer,
            events=self._events,
            stats=self.stats,
            remove_succeeded=cfg.remove_succeeded_jobs,
        )
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
            on_cancels=self._cancels_heard,
        )
        # The leader's chores take turns: together they hold one connection.
        turn = asyncio.Lock()
        is_leader = self._heartbeat_leads
        self._rescuer = Rescuer(
            self._db,
            interval=cfg.seconds("heartbeat_interval"),
            is_leader=is_leader,
            turn=turn,
            batch_size=RESCUE_BATCH_SIZE,
            events=self._events,
            wake=self._notify_fleet,
        )
        retention = cfg.optional_seconds("finished_job_retention")
        self._pruner = (
            None
            if retention is None
            else Pruner(
                self._db,
                interval=cfg.seconds("prune_interval"),
                is_leader=is_leader,
                turn=turn,
                retention=retention,
                batch_size=cfg.prune_batch_size,
            )
        )
        self._vacuumer = Vacuumer(
            self._db,
            interval=cfg.seconds("vacuum_interval"),
            is_leader=is_leader,
            turn=turn,
            mode=cfg.vacuum,
            min_dead_tuples=cfg.vacuum_min_dead_tuples,
        )
        move_after = cfg.optional_seconds("history_move_after")
        self._historian = (
            None
            if move_after is None
            else Historian(
                self._db,
                interval=cfg.seconds("prune_interval"),
                is_leader=is_leader,
                turn=turn,
                move_after=move_after,
                retention=retention,
                batch_size=cfg.prune_batch_size,
                # Each batch moved leaves its dead tuples: vacuumed as they pile up.
                between_batches=self._vacuumer.vacuum_if_needed,
            )
        )
        #: The listener's own connection (listen_dsn), closed when the worker stops.
        self._listen_pool: LazyPool | None = None
        self._listener: Listener | None = None
        channels = {CANCEL_CHANNEL: self._cancels.on_notification}
        if cfg.listen and cfg.listen_dsn is not None:
            self._listen_pool = LazyPool(cfg.listen_dsn)
            self._listener = Listener(
                self._listen_pool, self._wake, timeout=self._timeout, channels=channels
            )
        elif cfg.listen and not cfg.pgbouncer:
            self._listener = Listener(pool, self._wake, timeout=self._timeout, channels=channels)

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
        self._rescuer.events = self._events
        self._executor.events = self._events
        self._claims.events = self._events

    @property
    def is_leader(self) -> bool:
        return self._heartbeat.is_leader

    @property
    def active_jobs(self) -> int:
        return len(self._executor.running)

    @property
    def cron_runner(self) -> CronService | None:
        """Enqueues the occurrences of this worker's cron schedules (None: none)."""
        return self._cron_service

    @property
    def rescuer(self) -> Rescuer:
        """Recovers the jobs of dead workers (while this worker leads)."""
        return self._rescuer

    @property
    def pruner(self) -> Pruner | None:
        """Deletes finished jobs past their retention (None: retention is off)."""
        return self._pruner

    @property
    def historian(self) -> Historian | None:
        """Moves finished jobs to history and drops its days past the retention
        (None: history_move_after is off)."""
        return self._historian

    @property
    def vacuumer(self) -> Vacuumer:
        """Vacuums the jobs table when nothing else does (while this worker leads)."""
        return self._vacuumer

    def _chores(self) -> list[Periodic]:
        chores: list[Periodic] = [self._rescuer, self._vacuumer]
        if self._historian is not None:
            chores.append(self._historian)
        if self._pruner is not None:
            chores.append(self._pruner)
        return chores

    def _heartbeat_leads(self) -> bool:
        return self._heartbeat.is_leader

    def _cancels_heard(self, ids: list[uuid.UUID]) -> None:
        self._cancels.request_many(ids)

    @property
    def cancel_watcher(self) -> CancelWatcher:
        """Acts on cancels of the running jobs this worker holds."""
        return self._cancels

    @property
    def heartbeat(self) -> Heartbeat:
        return self._heartbeat

    @property
    def listener(self) -> Listener | None:
        return self._listener

    async def run(self, shutdown: Awaitable[Any] | None = None, *, burst: bool = False) -> RunStats:
        """Run until ``shutdown`` completes (or, with ``burst``, until no runnable
        job is left), then drain gracefully and return what was done."""
        self._claims.burst = burst
        stop = asyncio.ensure_future(shutdown) if shutdown is not None else None
        claim: asyncio.Task[None] | None = None
        tuned = False
        try:
            if not await self._start(stop):
                return self.stats
            if self.config.gc_tuning:
                gc_tuning.acquire()
                tuned = True
            claim = asyncio.get_running_loop().create_task(self._claims.run(), name="pgfleet-claim")
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
            # The claim loop stops claiming once _drain sets it stopping; it is
            # awaited there (or cancelled at the flush timeout), never left behind.
            await self._drain(claim, 0.0)
            raise
        finally:
            if stop is not None and not stop.done():
                stop.cancel()
            try:
                await self._stop_services()
            finally:
                if tuned:
                    gc_tuning.release()
        self.stats.rescued = self._rescuer.rescued
        return self.stats

    # ------------------------------------------------------------ lifecycle

    async def _start(self, stop: asyncio.Future[Any] | None) -> bool:
        """Register and start the services; False if told to stop before that
        could happen (the database stayed unreachable)."""
        context.install_log_record_factory()
        if not await self._register(stop):
            return False
        loop = asyncio.get_running_loop()
        assert self._heartbeat.started_at is not None
        self._state = context.WorkerState(
            started_at=self._heartbeat.started_at,
            shutting_down=threading.Event(),
            shutdown_future=loop.create_future(),
        )
        self._executor.state = self._state
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
        for chore in self._chores():
            chore.start()
        if self._cron_service is not None:
            self._cron_service.start()
        self._started.set()
        return True

    async def _register(self, stop: asyncio.Future[Any] | None) -> bool:
        """Check the schema, register (the first heartbeat) and prepare cron,
        retrying with a backoff while the database cannot be reached; False if told
        to stop first."""
        delay = 0.5
        while True:
            try:
                async with self._db.acquire("schema check") as conn:
                    await check_schema(conn)
                await self._heartbeat.run_once()
                if self._cron_service is not None:
                    await self._cron_service.prepare()
                await write_code_limits(self._db, self._registry)
                return True
            except SchemaNotReady:
                raise
            except Exception as exc:
                server = getattr(self._pool, "server", None)
                # No such database or role, a wrong password: a configuration to fix,
                # not an outage to wait out.
                refused = login_refused(exc, server or "")
                if refused is not None:
                    raise refused from None
                if not is_connection_error(exc):
                    raise
                at = f"{server}: " if server else ""
                log.warning(
                    "database unavailable at worker start (%s%s); retrying in %.1fs",
                    at,
                    exc,
                    delay,
                )
                if stop is not None:
                    done, _ = await asyncio.wait([stop], timeout=delay)
                    if done:
                        log.info("worker %s stopped before it could start", self.id)
                        return False
                else:
                    await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _drain(self, claim: asyncio.Task[None] | None, grace: float) -> None:
        """Stop claiming, give running handlers ``grace`` seconds, cancel the rest
        (their jobs are requeued), and write every outcome."""
        self._claims.stopping = True
        self._claims.release_held()
        if self._state is not None and not self._state.shutting_down.is_set():
            self._state.shutting_down.set()
            self._state.shutdown_future.set_result(None)
        self._claims.wake("completion")
        running = len(self._executor.running)
        if running:
            log.info("worker %s draining: %d jobs running", self.id, running)
            await self._executor.drain(grace)
        if claim is None or claim.done():
            claim = asyncio.get_running_loop().create_task(self._claims.run(), name="pgfleet-flush")
        self._claims.wake("completion")
        try:
            await asyncio.wait_for(claim, self.config.seconds("completion_flush_timeout"))
        except TimeoutError:
            log.error(
                "could not write %d job outcomes before stopping; those jobs will be "
                "recovered from this worker after its heartbeat expires",
                len(self._claims.outcomes),
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
        stops = [chore.stop() for chore in self._chores()]
        stops.append(self._heartbeat.stop())
        if self._cron_service is not None:
            stops.append(self._cron_service.stop())
        if self._listener is not None:
            stops.append(self._listener.stop())
        await asyncio.gather(*stops)
        if self._listen_pool is not None:
            with contextlib.suppress(Exception):
                await self._listen_pool.close(min(self._timeout, 5.0))
        self._executor.close()
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
            for chore in self._chores():
                chore.kick()

    def _on_outcome(self, outcome: Outcome) -> None:
        self._claims.add_outcome(outcome)

    def _wake(self, source: str) -> None:
        self._claims.wake(source)

    async def _notify_fleet(self) -> None:
        with contextlib.suppress(Exception):
            await Store(self._db).notify_wakeup()

    def health(self) -> str | None:
        """None while the claim loop reaches the database, else why it does not."""
        return self._claims.health()


def _listen_skipped(config: WorkerConfig) -> bool:
    """LISTEN was asked for but cannot run: a transaction-mode pooler and no listen_dsn."""
    return config.listen and config.pgbouncer and config.listen_dsn is None
