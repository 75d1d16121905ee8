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
import sys
from typing import Any

from pgfleet.config import WorkerConfig
from pgfleet.db.deadlines import AppPool, BoundedPool, close_pool
from pgfleet.db.transaction_pooling import connection_budget
from pgfleet.errors import PgfleetError, ValidationError
from pgfleet.queue import create_pool
from pgfleet.registry import Registry
from pgfleet.service.apps import AppError, load_crons, load_registry
from pgfleet.service.flags import (
    add_config_options,
    add_dsn,
    add_log_level,
    option_argv,
    option_environment,
    worker_config,
)
from pgfleet.service.process import (
    DATABASE_URL,
    NO_DATABASE,
    Stopper,
    UsageError,
    catch_early_signals,
    configure_logging,
    env_default,
    exit_despite_stuck_threads,
    install_uvloop,
)
from pgfleet.service.supervisor import supervise
from pgfleet.worker import Worker

log = logging.getLogger("pgfleet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dsn(parser)
    add_log_level(parser)
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
    add_config_options(parser)
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


def build_config(args: argparse.Namespace) -> WorkerConfig:
    return worker_config(args)


async def serve(args: argparse.Namespace, registry: Registry | None = None) -> int:
    """Run one worker process until signalled. Returns the exit code. ``registry``:
    served instead of ``--app``'s (Django's ``manage.py pgfleet_worker``)."""
    config = build_config(args)
    if registry is None:
        registry = load_registry(args.app)
    crons = load_crons(args.crons)
    pool_size = pool_size_of(args, config)
    stopper = Stopper()
    stopper.install()
    # min_size=0: a database that is down at start is retried by the worker, not fatal.
    log_budget(args, config, pool_size)
    pool = await create_pool(
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


def log_budget(
    args: argparse.Namespace, config: WorkerConfig, pool_size: int, processes: int = 1
) -> None:
    """Say how many connections this process (or the supervisor's children) hold at
    most: the fleet's sum is what the database or the pooler must allow."""
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


def pool_size_of(args: argparse.Namespace, config: WorkerConfig) -> int:
    return max(int(args.pool_size) or min(config.concurrency + 4, 40), 3)


def _metrics(
    args: argparse.Namespace,
    worker: Worker,
    pool: AppPool,
    registry: Registry,
    config: WorkerConfig,
) -> Any:
    # lazy: optional dependencies (prometheus_client and aiohttp, the service extra)
    from prometheus_client import CollectorRegistry

    from pgfleet.service.http import metrics_server  # lazy: optional extra (aiohttp)
    from pgfleet.service.metrics import (  # lazy: optional extra (prometheus_client)
        ProcessMetrics,
        QueueStats,
        WorkerMetrics,
    )

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


# ---------------------------------------------------------------- supervised children


def child_argv(args: argparse.Namespace, index: int) -> list[str]:
    """The command line of supervised child ``index``: every option of this one, with
    one process and its own metrics port. The database URLs are not on it (``ps``
    shows command lines): they travel in ``child_env``."""
    port = int(args.metrics_port)
    argv = [sys.executable, "-m", "pgfleet", "worker", "--processes", "1"]
    argv += ["--metrics-port", str(port + index if port else 0)]
    for flag, value in (
        ("--log-level", args.log_level),
        ("--app", args.app),
        ("--crons", args.crons),
        ("--pool-size", args.pool_size),
        ("--metrics-host", args.metrics_host),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv + option_argv(args)


def child_env(args: argparse.Namespace) -> dict[str, str]:
    return {**os.environ, DATABASE_URL: args.dsn, **option_environment(args)}


# ---------------------------------------------------------------- main


def main(args: argparse.Namespace) -> int:
    catch_early_signals()
    configure_logging(args.log_level)
    if not args.dsn:
        raise UsageError(f"pgfleet worker: {NO_DATABASE}")
    if not args.app:
        raise UsageError(
            "pgfleet worker: no application: pass --app module:registry or set PGFLEET_APP"
        )
    _check_numbers(args)
    # lazy: optional extra (http imports aiohttp); needed only to name its error
    from pgfleet.service.http import PortInUse

    try:
        config = build_config(args)
        load_registry(args.app)  # fail fast, before the event loop, on a bad --app
        load_crons(args.crons)
    except (PgfleetError, AppError) as exc:
        raise UsageError(f"pgfleet worker: {exc}") from None
    if args.processes > 1:

        def before() -> None:
            log_budget(args, config, pool_size_of(args, config), args.processes)

        return supervise(
            args.processes, lambda i: child_argv(args, i), child_env(args), on_start=before
        )
    loop_name = install_uvloop()
    log.info("pgfleet worker starting on %s", loop_name)
    try:
        code = asyncio.run(serve(args))
    except (ValidationError, AppError) as exc:  # found once the loop runs (e.g. job names)
        raise UsageError(f"pgfleet worker: {exc}") from None
    except (PgfleetError, PortInUse) as exc:
        raise SystemExit(f"pgfleet worker: {exc}") from None
    exit_despite_stuck_threads(code)
    return code


def _check_numbers(args: argparse.Namespace) -> None:
    for name, low in (("processes", 1), ("metrics_port", 0), ("pool_size", 0)):
        value = getattr(args, name)
        try:
            number = int(value)
        except (TypeError, ValueError):
            flag = name.replace("_", "-")
            message = f"pgfleet worker: --{flag} must be an integer, got {value!r}"
            raise UsageError(message) from None
        if number < low or (name == "metrics_port" and number > 65535):
            raise UsageError(f"pgfleet worker: --{name.replace('_', '-')} out of range: {number}")
        setattr(args, name, number)
