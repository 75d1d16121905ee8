"""``manage.py pgfleet_worker``: run a pgfleet worker for this project's tasks.

The flags are ``pgfleet worker``'s (generated from ``pgfleet.config.WORKER_OPTIONS``,
each with its ``PGFLEET_*`` variable), plus ``--backend`` and ``--queue-name``. The
database is the backend's Django database: no second connection string. SIGTERM
and SIGINT drain gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from pgfleet.contrib.django.backend import TaskBackend
from pgfleet.contrib.django.compat import task_backends
from pgfleet.contrib.django.worker import asyncpg_dsn, build_registry
from pgfleet.errors import PgfleetError
from pgfleet.service.apps import AppError
from pgfleet.service.flags import add_config_options, add_log_level
from pgfleet.service.process import (
    catch_early_signals,
    configure_logging,
    env_default,
    exit_despite_stuck_threads,
    install_uvloop,
)
from pgfleet.service.worker_cmd import serve


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no annotations
    help = "Run a pgfleet worker for this project's tasks (Django's tasks framework)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            default="default",
            help="the TASKS alias whose tasks to run (default: default)",
        )
        parser.add_argument(
            "--queue-name",
            default=None,
            help="Django queues to serve, comma-separated (default: the backend's QUEUES)",
        )
        add_log_level(parser)
        add_config_options(parser)
        parser.add_argument(
            "--pool-size",
            type=int,
            default=env_default("POOL_SIZE", 0),
            help="database connections [PGFLEET_POOL_SIZE] (default: concurrency + 4, at most 40)",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=env_default("METRICS_PORT", 0),
            help="port of /metrics, /healthz, /readyz (0: off; needs the service extra) "
            "[PGFLEET_METRICS_PORT] (default 0)",
        )
        parser.add_argument(
            "--metrics-host",
            default=env_default("METRICS_HOST", "127.0.0.1"),
            help="address to serve metrics on [PGFLEET_METRICS_HOST] (default 127.0.0.1)",
        )

    def handle(self, *_args: Any, **options: Any) -> None:
        catch_early_signals()
        configure_logging(options["log_level"])
        backend = task_backends[options["backend"]]
        if not isinstance(backend, TaskBackend):
            raise CommandError(
                f"TASKS[{options['backend']!r}] is {type(backend).__name__}, not "
                "pgfleet.contrib.django.TaskBackend"
            )
        queues = (
            [q for q in options["queue_name"].split(",") if q]
            if options["queue_name"]
            else sorted(backend.queues)
        )
        if not queues:
            raise CommandError("no queue to serve: pass --queue-name or set the backend's QUEUES")
        try:
            registry = build_registry(backend, queues)
            args = argparse.Namespace(
                **options, dsn=asyncpg_dsn(backend.database), app=None, crons=None
            )
            if not len(registry):
                raise CommandError(
                    f"no task found for backend {backend.alias!r}: tasks are found in each "
                    "installed app's tasks module and in OPTIONS['MODULES']"
                )
            self.stdout.write(
                f"pgfleet worker: {len(registry)} task name(s) on queue(s) {', '.join(queues)} "
                f"({install_uvloop()})"
            )
            code = asyncio.run(serve(args, registry))
        except (PgfleetError, AppError) as exc:
            raise CommandError(str(exc)) from None
        exit_despite_stuck_threads(code)
