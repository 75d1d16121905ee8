"""The ``pgfleet`` command line.

Subcommands that need the service extras import them only when they run, so
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

from pgfleet.errors import PgfleetError


def _dsn(args: argparse.Namespace) -> str:
    dsn = args.dsn or os.environ.get("PGFLEET_DATABASE_URL")
    if not dsn:
        raise SystemExit(
            "pgfleet: no database given: pass --dsn or set PGFLEET_DATABASE_URL "
            "(for example postgresql://user@host:5432/dbname)"
        )
    return str(dsn)


def check_dsn(dsn: str | None, command: str) -> None:
    """Refuse a malformed connection string before anything starts."""
    if not dsn:
        return
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(dsn)
        parts.port  # noqa: B018 - raises on a non-numeric port
    except ValueError as exc:
        raise SystemExit(f"pgfleet {command}: invalid database URL: {exc}") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise SystemExit(
            f"pgfleet {command}: invalid database URL {dsn.split('@')[-1]!r}: it must start "
            "with postgresql:// (for example postgresql://user@host:5432/dbname)"
        )


def _add_dsn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        help="PostgreSQL connection string (default: $PGFLEET_DATABASE_URL)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pgfleet", description="Durable PostgreSQL-backed background jobs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    migrate = sub.add_parser("migrate", help="create or upgrade the pgfleet schema")
    _add_dsn(migrate)
    migrate.add_argument(
        "--print-sql",
        action="store_true",
        help="print the ordered migration SQL instead of applying it (for your own tool)",
    )
    worker = sub.add_parser("worker", help="run worker processes for an application")
    from pgfleet.service import worker_cmd

    worker_cmd.add_arguments(worker)
    api = sub.add_parser("api", help="serve the HTTP jobs API")
    from pgfleet.service import api_cmd

    api_cmd.add_arguments(api)
    jobs = sub.add_parser("jobs", help="list, inspect, cancel and retry jobs (for operators)")
    from pgfleet.service import jobs_cmd

    jobs_cmd.add_arguments(jobs)
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
    import asyncpg

    from pgfleet.db.migrate import migrate
    from pgfleet.db.pooler import dsn_transaction_pooled, refuse_migrations

    conn = await _connect(asyncpg, dsn, statement_cache_size=0)
    try:
        if await dsn_transaction_pooled(dsn, conn):
            raise refuse_migrations("--dsn")
        return await migrate(conn)
    finally:
        await conn.close()


async def _connect(asyncpg: Any, dsn: str, **kwargs: Any) -> Any:
    try:
        return await asyncpg.connect(dsn, timeout=10, **kwargs)
    except (TimeoutError, OSError, asyncpg.PostgresError, ValueError) as exc:
        raise SystemExit(f"pgfleet: cannot connect to the database: {exc}") from None


def main(argv: Sequence[str] | None = None) -> None:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["bench"]:
        _bench(given[1:])
    args = build_parser().parse_args(given)
    try:
        if args.command == "migrate":
            if args.print_sql:
                from pgfleet.db.migrate import migration_script

                sys.stdout.write(migration_script())
                return
            applied = asyncio.run(_migrate(_dsn(args)))
            print(f"applied migrations {applied}" if applied else "pgfleet schema is up to date")
        elif args.command == "worker":
            from pgfleet.service import worker_cmd

            check_dsn(args.dsn, "worker")
            raise SystemExit(worker_cmd.main(args))
        elif args.command == "api":
            from pgfleet.service import api_cmd

            check_dsn(args.dsn, "api")
            raise SystemExit(api_cmd.main(args))
        elif args.command == "jobs":
            from pgfleet.service import jobs_cmd

            raise SystemExit(jobs_cmd.main(args))
    except PgfleetError as exc:
        raise SystemExit(f"pgfleet: {exc}") from None
