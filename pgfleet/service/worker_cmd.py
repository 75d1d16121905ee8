"""``pgfleet worker``: run worker processes for an application's registry.

Every option can also come from a ``PGFLEET_*`` environment variable (the flag
wins). SIGTERM or SIGINT drains gracefully; a second one stops at once, requeueing
what was still running.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from pgfleet.db.bounded import DEFAULT_DATABASE_TIMEOUT, BoundedPool, close_pool
from pgfleet.errors import InvalidOptions, PgfleetError

log = logging.getLogger("pgfleet")


def env_default(name: str, fallback: Any = None) -> Any:
    return os.environ.get(f"PGFLEET_{name}", fallback)


def add_dsn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        default=env_default("DATABASE_URL"),
        help="PostgreSQL connection string [PGFLEET_DATABASE_URL]",
    )


def _flag(name: str) -> bool:
    return str(env_default(name, "")).strip().lower() not in ("", "0", "false", "no")


def add_pgbouncer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        default=_flag("PGBOUNCER"),
        help="--dsn goes through a pooler in transaction mode (PgBouncer): no named "
        "prepared statements, no session state, LISTEN only on --listen-dsn "
        "[PGFLEET_PGBOUNCER]",
    )


def add_common(parser: argparse.ArgumentParser) -> None:
    add_dsn(parser)
    add_pgbouncer(parser)
    parser.add_argument(
        "--log-level",
        default=env_default("LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
        help="log level [PGFLEET_LOG_LEVEL] (default info)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument(
        "--app",
        default=env_default("APP"),
        help="the Registry to serve, as module:attribute [PGFLEET_APP]",
    )
    parser.add_argument(
        "--crons",
        default=env_default("CRONS"),
        help="a list of CronJob, as module:attribute [PGFLEET_CRONS]",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=env_default("CONCURRENCY", 16),
        help="handlers running at once per process [PGFLEET_CONCURRENCY] (default 16)",
    )
    parser.add_argument(
        "--job-names",
        default=env_default("JOB_NAMES"),
        help="comma-separated job names to serve (default: all) [PGFLEET_JOB_NAMES]",
    )
    parser.add_argument(
        "--kinds",
        default=env_default("KINDS"),
        help="deprecated spelling of --job-names [PGFLEET_KINDS]",
    )
    parser.add_argument(
        "--queues",
        default=env_default("QUEUES"),
        help="comma-separated named queues to serve (default: all) [PGFLEET_QUEUES]",
    )
    for flag, env, default, text in (
        ("--poll-interval", "POLL_INTERVAL", 2.0, "idle poll interval, seconds"),
        ("--heartbeat-interval", "HEARTBEAT_INTERVAL", 5.0, "heartbeat interval, seconds"),
        (
            "--dead-worker-timeout",
            "DEAD_WORKER_TIMEOUT",
            30.0,
            "seconds without heartbeat before a worker is dead",
        ),
        (
            "--shutdown-grace-period",
            "SHUTDOWN_GRACE_PERIOD",
            30.0,
            "seconds handlers get to finish at shutdown",
        ),
        ("--default-timeout", "DEFAULT_TIMEOUT", 600.0, "handler timeout, seconds (0: none)"),
        ("--retention-days", "RETENTION_DAYS", 30.0, "days finished jobs are kept (0: forever)"),
        ("--backoff-base", "BACKOFF_BASE", 1.0, "first retry delay, seconds"),
        ("--backoff-cap", "BACKOFF_CAP", 3600.0, "longest retry delay, seconds"),
        ("--cron-poll-interval", "CRON_POLL_INTERVAL", 5.0, "cron check interval, seconds"),
        ("--prune-interval", "PRUNE_INTERVAL", 60.0, "how often the leader prunes, seconds"),
        (
            "--database-timeout",
            "DATABASE_TIMEOUT",
            DEFAULT_DATABASE_TIMEOUT,
            "longest wait for any database call of the runtime before its connection is "
            "dropped and replaced, seconds",
        ),
        (
            "--completion-flush-timeout",
            "COMPLETION_FLUSH_TIMEOUT",
            10.0,
            "at shutdown, how long to keep trying to write outcomes, seconds",
        ),
    ):
        parser.add_argument(
            flag, type=float, default=env_default(env, default), help=f"{text} [PGFLEET_{env}]"
        )
    parser.add_argument(
        "--vacuum",
        choices=["auto", "always", "never"],
        default=env_default("VACUUM", "auto"),
        help="leader vacuums the jobs table when dead tuples pile up: auto (only when "
        "autovacuum is off), always, never [PGFLEET_VACUUM]",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=env_default("POOL_SIZE", 0),
        help="database connections per process [PGFLEET_POOL_SIZE] "
        "(default: concurrency + 4, at most 40)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=env_default("PROCESSES", 1),
        help="worker processes to run and supervise [PGFLEET_PROCESSES] (default 1); "
        "process i serves metrics on --metrics-port + i",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=env_default("METRICS_PORT", 9464),
        help="port of /metrics, /healthz, /readyz (0: off) [PGFLEET_METRICS_PORT] (default 9464)",
    )
    parser.add_argument(
        "--metrics-host",
        default=env_default("METRICS_HOST", "127.0.0.1"),
        help="address to serve metrics on [PGFLEET_METRICS_HOST] (default 127.0.0.1)",
    )
    parser.add_argument(
        "--no-listen",
        action="store_true",
        default=env_default("NO_LISTEN", "") not in ("", "0", "false"),
        help="do not LISTEN for wakeups; poll only [PGFLEET_NO_LISTEN]",
    )
    parser.add_argument(
        "--listen-dsn",
        default=env_default("LISTEN_DATABASE_URL"),
        help="a direct or session-mode connection string for LISTEN, held besides the "
        "pool (with --pgbouncer; without it workers only poll) [PGFLEET_LISTEN_DATABASE_URL]",
    )


def _names(value: str | None) -> list[str] | None:
    if not value:
        return None
    return [n.strip() for n in value.split(",") if n.strip()]


def build_config(args: argparse.Namespace) -> Any:
    from pgfleet.worker import WorkerConfig

    def number(name: str) -> float:
        value = getattr(args, name)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise InvalidOptions(
                f"--{name.replace('_', '-')} must be a number, got {value!r}"
            ) from None

    try:
        concurrency = int(args.concurrency)
    except (TypeError, ValueError):
        raise InvalidOptions(
            f"--concurrency must be an integer, got {args.concurrency!r}"
        ) from None
    retention = number("retention_days")
    timeout = number("default_timeout")
    return WorkerConfig(
        concurrency=concurrency,
        poll_interval=number("poll_interval"),
        job_names=_names(args.job_names if args.job_names is not None else args.kinds),
        queue_names=_names(args.queues),
        shutdown_grace_period=number("shutdown_grace_period"),
        heartbeat_interval=number("heartbeat_interval"),
        dead_worker_timeout=number("dead_worker_timeout"),
        finished_job_retention=retention * 86400 if retention > 0 else None,
        default_timeout=timeout if timeout > 0 else None,
        backoff_base=number("backoff_base"),
        backoff_cap=number("backoff_cap"),
        cron_poll_interval=number("cron_poll_interval"),
        prune_interval=number("prune_interval"),
        database_timeout=number("database_timeout"),
        completion_flush_timeout=number("completion_flush_timeout"),
        listen=not args.no_listen,
        pgbouncer=bool(args.pgbouncer),
        listen_dsn=args.listen_dsn or None,
        vacuum=args.vacuum,
    )


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s [pid %(process)d] %(message)s",
        stream=sys.stderr,
    )


def install_uvloop() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


class Stopper:
    """First SIGTERM/SIGINT: drain. Another one, a second or more later: stop now.

    (Signals within a second of the first count as the same request: a process
    group signalled as a whole must not skip the drain.)"""

    REPEAT_WINDOW = 1.0

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signals = 0
        self.first_at = 0.0
        self.main: asyncio.Task[Any] | None = None

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        self.main = asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if _early_signals:  # arrived while the process was still importing
            self._on_signal(_early_signals[0])

    def _on_signal(self, sig: signal.Signals) -> None:
        now = time.monotonic()
        if self.signals and now - self.first_at < self.REPEAT_WINDOW:
            return
        self.signals += 1
        if self.signals == 1:
            self.first_at = now
            log.info("received %s: draining", sig.name)
            self.event.set()
        else:
            log.warning("received %s again: stopping now, requeueing running jobs", sig.name)
            if self.main is not None:
                self.main.cancel()


_early_signals: list[signal.Signals] = []


def catch_early_signals() -> None:
    """From process start until the event loop takes over, remember SIGTERM/SIGINT
    instead of dying from them, so a stop during start-up is still a clean drain."""

    def remember(signum: int, _frame: Any) -> None:
        if _early_signals:  # asked twice while still starting: give up now
            raise SystemExit(128 + signum)
        _early_signals.append(signal.Signals(signum))

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, remember)


async def serve(args: argparse.Namespace) -> int:
    """Run one worker process until signalled. Returns the exit code."""
    import pgfleet
    from pgfleet.service.apps import load_crons, load_registry
    from pgfleet.worker import Worker

    config = build_config(args)
    registry = load_registry(args.app)
    crons = load_crons(args.crons)
    pool_size = pool_size_of(args, config)
    stopper = Stopper()
    stopper.install()
    # min_size=0: a database that is down at start is retried by the worker, not fatal.
    log_budget(args, config, pool_size)
    pool = await pgfleet.create_pool(
        args.dsn,
        min_size=0,
        max_size=pool_size,
        pgbouncer=config.pgbouncer,
        release_timeout=config.seconds("database_timeout"),
    )
    server = None
    try:
        worker = Worker(pool, registry, config, crons=crons)
        if args.metrics_port:
            server = _metrics(args, worker, pool, registry, config)
            await server.start()
        try:
            await worker.run(shutdown=stopper.event.wait())
        except asyncio.CancelledError:
            if stopper.signals < 2:
                raise
    finally:
        if server is not None:
            await server.stop()
        await close_pool(pool)
    return 0


def log_budget(args: argparse.Namespace, config: Any, pool_size: int, processes: int = 1) -> None:
    """Say how many connections this process (or the supervisor's children) hold at
    most: the fleet's sum is what the database or the pooler must allow."""
    from pgfleet.db.pooler import connection_budget

    if not config.listen or (config.pgbouncer and config.listen_dsn is None):
        listener = "none"
    elif config.listen_dsn is not None:
        listener = "own"
    else:
        listener = "pool"
    total, text = connection_budget(
        pool_size=pool_size, listener=listener, metrics=bool(args.metrics_port), processes=processes
    )
    via = " through a transaction-mode pooler" if config.pgbouncer else ""
    log.info("connection budget: at most %d connections%s: %s", total, via, text)


def pool_size_of(args: argparse.Namespace, config: Any) -> int:
    return max(int(args.pool_size) or min(config.concurrency + 4, 40), 3)


def _metrics(args: argparse.Namespace, worker: Any, pool: Any, registry: Any, config: Any) -> Any:
    from prometheus_client import CollectorRegistry

    from pgfleet.service.http import metrics_server
    from pgfleet.service.metrics import ProcessMetrics, QueueStats, WorkerMetrics

    prom = CollectorRegistry()
    metrics = ProcessMetrics(prom)
    events = WorkerMetrics(metrics, lambda: worker.active_jobs, config.concurrency)
    events.prime(worker.served_names)
    worker.add_events(events)
    stats = QueueStats(BoundedPool(pool, config.seconds("database_timeout")), registry.names())
    stats.holder = worker.id  # so the console can name the worker holding the lease
    prom.register(stats)
    worker.on_enqueued = metrics.count_enqueued
    return metrics_server(
        args.metrics_host, int(args.metrics_port), prom, stats, pool, health=worker.health
    )


def main(args: argparse.Namespace) -> int:
    catch_early_signals()
    configure_logging(args.log_level)
    if not args.dsn:
        raise SystemExit("pgfleet worker: no database: pass --dsn or set PGFLEET_DATABASE_URL")
    if not args.app:
        raise SystemExit(
            "pgfleet worker: no application: pass --app module:registry or set PGFLEET_APP"
        )
    _check_numbers(args)
    from pgfleet.service.apps import AppError, load_crons, load_registry
    from pgfleet.service.http import PortInUse

    try:
        build_config(args)
        load_registry(args.app)  # fail fast, before the event loop, on a bad --app
        load_crons(args.crons)
    except (PgfleetError, AppError) as exc:
        raise SystemExit(f"pgfleet worker: {exc}") from None
    if args.processes > 1:
        from pgfleet.service.supervisor import supervise

        return supervise(args)
    loop_name = install_uvloop()
    log.info("pgfleet worker starting on %s", loop_name)
    try:
        code = asyncio.run(serve(args))
    except (PgfleetError, AppError, PortInUse) as exc:
        raise SystemExit(f"pgfleet worker: {exc}") from None
    _exit_despite_stuck_threads(code)
    return code


def _check_numbers(args: argparse.Namespace) -> None:
    for name, low in (("processes", 1), ("metrics_port", 0), ("pool_size", 0)):
        value = getattr(args, name)
        try:
            number = int(value)
        except (TypeError, ValueError):
            flag = name.replace("_", "-")
            raise SystemExit(
                f"pgfleet worker: --{flag} must be an integer, got {value!r}"
            ) from None
        if number < low or (name == "metrics_port" and number > 65535):
            raise SystemExit(f"pgfleet worker: --{name.replace('_', '-')} out of range: {number}")
        setattr(args, name, number)


def _exit_despite_stuck_threads(code: int) -> None:
    stuck = [t for t in threading.enumerate() if t.name.startswith("pgfleet-job") and t.is_alive()]
    if stuck:
        log.warning(
            "%d sync handlers are still running in threads; exiting without them "
            "(their jobs were requeued)",
            len(stuck),
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
