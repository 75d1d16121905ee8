"""``pgfleet limits`` and ``pgfleet pause`` / ``resume``: flow control from a shell.

``limits list`` prints every job name with a limit or a pause and how many of its
due jobs wait on it; ``limits set NAME`` and ``limits clear NAME`` change a name's
limits (an operator's value: code defaults never overwrite it); ``pause`` and
``resume`` take a job name or ``--queue NAME``. Exit codes as ``pgfleet jobs``: 0
done, 1 the database could not be used, 2 bad input. Needs only asyncpg.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from pgfleet.errors import PgfleetError, ValidationError
from pgfleet.queue import Queue, create_pool
from pgfleet.service.flags import add_dsn, add_pgbouncer
from pgfleet.service.jobs_cmd import (
    CONNECT_TIMEOUT,
    EXIT_DATABASE,
    EXIT_OK,
    EXIT_USAGE,
    print_json,
    print_table,
)
from pgfleet.service.process import NO_DATABASE, dsn_problem
from pgfleet.service.views import limit_view, paused_view


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    add_dsn(common)
    add_pgbouncer(common)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return common


def add_limits_arguments(parser: argparse.ArgumentParser) -> None:
    common = _common()
    sub = parser.add_subparsers(dest="limits_command", required=True, metavar="ACTION")
    sub.add_parser(
        "list",
        parents=[common],
        help="job names with a limit or a pause, and their due jobs waiting on it",
    )
    setting = sub.add_parser(
        "set", parents=[common], help="set a job name's limits for the whole fleet"
    )
    setting.add_argument("name", help="the job name")
    setting.add_argument(
        "--concurrency", type=int, help="at most this many running at once (held ones included)"
    )
    setting.add_argument(
        "--rate", type=int, help="at most this many attempts started in any window of --per"
    )
    setting.add_argument(
        "--per", type=float, default=1.0, help="the rate's window in seconds (default 1)"
    )
    setting.add_argument(
        "--per-key", action="store_true", help="each limit applies to each limit key on its own"
    )
    clear = sub.add_parser("clear", parents=[common], help="remove a job name's limits")
    clear.add_argument("name", help="the job name")


def add_pause_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    add_dsn(parser)
    add_pgbouncer(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("name", nargs="?", help=f"the job name to {verb}")
    parser.add_argument("--queue", help=f"{verb} this named queue instead")


def main(args: argparse.Namespace) -> int:
    """Run one action; print errors to stderr; return the exit code."""
    action = getattr(args, "limits_command", None) or args.command
    label = f"pgfleet limits {action}" if args.command == "limits" else f"pgfleet {action}"
    if not args.dsn:
        print(f"{label}: {NO_DATABASE}", file=sys.stderr)
        return EXIT_USAGE
    problem = dsn_problem(args.dsn)
    if problem:
        print(f"{label}: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return asyncio.run(_run(args))
    except ValidationError as exc:
        print(f"{label}: {exc}; nothing was changed", file=sys.stderr)
        return EXIT_USAGE
    except PgfleetError as exc:
        print(f"{label}: {exc}", file=sys.stderr)
        return EXIT_DATABASE
    except OSError as exc:
        print(f"{label}: cannot connect to the database: {exc}", file=sys.stderr)
        return EXIT_DATABASE


async def _run(args: argparse.Namespace) -> int:
    if args.command in ("pause", "resume") and (args.name is None) == (args.queue is None):
        raise _usage("give a job name or --queue NAME, not both and not neither")
    try:
        pool = await create_pool(
            args.dsn,
            min_size=1,
            max_size=1,
            timeout=CONNECT_TIMEOUT,
            pgbouncer=bool(getattr(args, "pgbouncer", False)),
        )
    except PgfleetError:
        raise
    except Exception as exc:  # refused, bad password, no such database
        raise OSError(str(exc) or type(exc).__name__) from None
    queue = Queue(pool)
    try:
        await _act(queue, args)
    finally:
        await queue.flush_notifications()
        await pool.close()
    return EXIT_OK


def _usage(message: str) -> ValidationError:
    return ValidationError(message)


async def _act(queue: Queue, args: argparse.Namespace) -> None:
    if args.command == "pause":
        since = await queue.pause(args.name, queue_name=args.queue)
        _say(args, {"paused": args.name or args.queue, "since": since.isoformat()})
    elif args.command == "resume":
        resumed = await queue.resume(args.name, queue_name=args.queue)
        _say(args, {"resumed": args.name or args.queue, "was_paused": resumed})
    elif args.limits_command == "set":
        limit = await queue.set_limits(
            args.name,
            concurrency=args.concurrency,
            rate=args.rate,
            per=args.per,
            per_key=args.per_key,
        )
        _say(args, limit_view(limit))
    elif args.limits_command == "clear":
        _say(args, {"cleared": args.name, "had_limits": await queue.clear_limits(args.name)})
    else:
        await _list(queue, args)


async def _list(queue: Queue, args: argparse.Namespace) -> None:
    waiting: dict[str, dict[str, int]] = {}
    for name, reason, n in await queue.waiting_on_limits():
        waiting.setdefault(name, {})[reason] = n
    views = [limit_view(lim, waiting.get(lim.name, {})) for lim in await queue.limits()]
    queues = [paused_view(p) for p in await queue.paused() if p.kind == "queue"]
    if args.json:
        print_json({"limits": views, "paused_queues": queues})
        return
    if not views and not queues:
        print("no limits and no pauses")
        return
    rows = [
        [
            v["name"],
            "" if v["concurrency"] is None else str(v["concurrency"]),
            "" if v["rate"] is None else f"{v['rate']}/{v['per']:g}s",
            "yes" if v["per_key"] else "",
            v["source"],
            "PAUSED" if v["paused"] else "",
            ", ".join(f"{n} {reason}" for reason, n in sorted(v["waiting"].items())),
        ]
        for v in views
    ]
    rows += [[f"queue {q['name']}", "", "", "", "operator", "PAUSED", ""] for q in queues]
    print_table(["NAME", "CONCURRENCY", "RATE", "PER KEY", "SOURCE", "STATE", "WAITING"], rows)


def _say(args: argparse.Namespace, view: dict[str, Any]) -> None:
    if args.json:
        print_json(view)
        return
    for key, value in view.items():
        print(f"{key}: {value}")
