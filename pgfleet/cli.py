"""The ``pgfleet`` command line.

Building the parser needs the standard library and pgfleet only: subcommands that
need the service extras (aiohttp, prometheus_client) import them when they run, so
``pgfleet migrate`` works with the library alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg

from pgfleet._version import __version__
from pgfleet.db.migrate import migrate, migration_script
from pgfleet.db.transaction_pooling import dsn_transaction_pooled, refuse_migrations
from pgfleet.errors import PgfleetError
from pgfleet.service import api_cmd, credentials_cmd, jobs_cmd, limits_cmd, worker_cmd
from pgfleet.service.flags import add_dsn
from pgfleet.service.process import EXIT_USAGE, UsageError, check_dsn


def _dsn(args: argparse.Namespace) -> str:
    if not args.dsn:
        raise UsageError(
            "pgfleet migrate: no database given: pass --dsn or set PGFLEET_DATABASE_URL "
            "(for example postgresql://user@host:5432/dbname)"
        )
    check_dsn(args.dsn, "migrate")
    return str(args.dsn)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgfleet", description="Durable PostgreSQL-backed background jobs."
    )
    parser.add_argument("--version", action="version", version=f"pgfleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    migrate_cmd = sub.add_parser("migrate", help="create or upgrade the pgfleet schema")
    add_dsn(migrate_cmd)
    migrate_cmd.add_argument(
        "--print-sql",
        action="store_true",
        help="print the ordered migration SQL instead of applying it (for your own tool)",
    )
    worker = sub.add_parser("worker", help="run worker processes for an application")
    worker_cmd.add_arguments(worker)
    api = sub.add_parser("api", help="serve the HTTP jobs API")
    api_cmd.add_arguments(api)
    jobs = sub.add_parser("jobs", help="list, inspect, cancel and retry jobs (for operators)")
    jobs_cmd.add_arguments(jobs)
    limits = sub.add_parser(
        "limits", help="flow control: concurrency and rate limits per job name (for operators)"
    )
    limits_cmd.add_limits_arguments(limits)
    pause = sub.add_parser("pause", help="stop new starts of a job name or a named queue")
    limits_cmd.add_pause_arguments(pause, "pause")
    resume = sub.add_parser("resume", help="let a paused job name or named queue start again")
    limits_cmd.add_pause_arguments(resume, "resume")
    creds = sub.add_parser(
        "credentials", help="make, revoke and list the jobs API's credentials (for operators)"
    )
    credentials_cmd.add_arguments(creds)
    # Handled before parsing (see _bench): the suites' own parser reads the options.
    sub.add_parser(
        "bench",
        help="measure throughput and latency against raw SQL (runs a checkout's tools/bench)",
        add_help=False,
    )
    return parser


def _bench(args: list[str]) -> None:
    """``pgfleet bench``: the benchmark suites and their raw-SQL reference live in a
    pgfleet checkout (tools/bench/), not in the installed package. Run them with
    this interpreter, in this process, from the checkout this package was
    installed from (editable) or the current directory."""
    for root in (Path(__file__).resolve().parents[1], Path.cwd()):
        if (root / "tools" / "bench" / "suite.py").is_file():
            break
    else:
        raise SystemExit(
            "pgfleet bench: the benchmark suites are in the pgfleet repository "
            "(tools/bench/), not in the installed package: run `make bench` or "
            "`pgfleet bench` in a checkout"
        )
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "tools.bench", *args]
    os.execve(sys.executable, argv, {**os.environ, "PYTHONPATH": path})


async def _migrate(dsn: str) -> list[int]:
    conn = await _connect(dsn, statement_cache_size=0)
    try:
        if await dsn_transaction_pooled(dsn, conn):
            raise refuse_migrations("--dsn")
        return await migrate(conn)
    finally:
        await conn.close()


async def _connect(dsn: str, **kwargs: Any) -> Any:
    try:
        return await asyncpg.connect(dsn, timeout=10, **kwargs)
    except (TimeoutError, OSError, asyncpg.PostgresError, ValueError) as exc:
        raise SystemExit(f"pgfleet migrate: cannot connect to the database: {exc}") from None


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["bench"]:
        _bench(given[1:])
    args = build_parser().parse_args(given)
    try:
        if args.command == "migrate":
            if args.print_sql:
                sys.stdout.write(migration_script())
                return
            check_dsn(args.dsn, "migrate")
            applied = asyncio.run(_migrate(_dsn(args)))
            print(f"applied migrations {applied}" if applied else "pgfleet schema is up to date")
        elif args.command == "worker":
            check_dsn(args.dsn, "worker")
            raise SystemExit(worker_cmd.main(args))
        elif args.command == "api":
            check_dsn(args.dsn, "api")
            raise SystemExit(api_cmd.main(args))
        elif args.command == "jobs":
            raise SystemExit(jobs_cmd.main(args))
        elif args.command in ("limits", "pause", "resume"):
            raise SystemExit(limits_cmd.main(args))
        elif args.command == "credentials":
            raise SystemExit(credentials_cmd.main(args))
    except UsageError as exc:
        # One line and status 2, like argparse's own usage errors and `pgfleet jobs`.
        sys.stderr.write(f"{exc}\n")
        raise SystemExit(EXIT_USAGE) from None
    except PgfleetError as exc:
        raise SystemExit(f"pgfleet: {exc}") from None
