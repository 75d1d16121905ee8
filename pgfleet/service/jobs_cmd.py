"""``pgfleet jobs``: look at and manage jobs from a shell.

``list``, ``get``, ``cancel``, ``retry``, ``counts``, ``workers``, ``deps`` (a job's
parents and children) and ``batch`` (a batch's progress) print a table
(or JSON with ``--json``). Exit codes: 0 done, 1 the database could not be used,
2 bad input, 3 no such job, 4 refused because of the job's state. Needs only
asyncpg: it works without the service extras.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pgfleet.errors import (
    DuplicateJobKey,
    InvalidJobState,
    JobNotFound,
    PgfleetError,
    ValidationError,
)
from pgfleet.jobs import JobStatus
from pgfleet.queue import Queue, create_pool
from pgfleet.service.flags import add_dsn, add_pgbouncer
from pgfleet.service.process import NO_DATABASE, dsn_problem
from pgfleet.service.views import batch_view, job_view, relative_view, worker_view

EXIT_OK = 0
EXIT_DATABASE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4

CONNECT_TIMEOUT = 10.0
_ERROR_WIDTH = 60


class _Failure(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common = argparse.ArgumentParser(add_help=False)
    add_dsn(common)
    add_pgbouncer(common)
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub = parser.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    listing = sub.add_parser("list", parents=[common], help="the most recent jobs, newest first")
    listing.add_argument("--status", choices=[s.value for s in JobStatus], help="only this status")
    listing.add_argument("--name", help="only jobs of this name")
    listing.add_argument(
        "--limit", type=_limit, default=50, help="how many jobs, 1 to 10000 (default 50)"
    )
    get = sub.add_parser("get", parents=[common], help="one job's status record")
    get.add_argument("id", help="the job id")
    get.add_argument(
        "--payload", action="store_true", help="also print the payload (it may be sensitive)"
    )
    get.add_argument(
        "--wait",
        type=_wait_seconds,
        metavar="SECONDS",
        help="wait up to SECONDS for the job to finish, then print it",
    )
    cancel = sub.add_parser(
        "cancel",
        parents=[common],
        help="cancel a queued job, or ask the worker running a running one to stop it",
    )
    cancel.add_argument("id", help="the job id")
    cancel.add_argument("--by", default="cli", help="who cancels, kept with the job (default: cli)")
    retry = sub.add_parser(
        "retry", parents=[common], help="run a failed or cancelled job again, now"
    )
    retry.add_argument("id", help="the job id")
    deps = sub.add_parser(
        "deps", parents=[common], help="a job's parents (what it waits on) and children"
    )
    deps.add_argument("id", help="the job id")
    batch = sub.add_parser(
        "batch", parents=[common], help="a batch's progress: its members by outcome"
    )
    batch.add_argument("id", help="the batch id (its callback job's id)")
    sub.add_parser("counts", parents=[common], help="job totals by status (scans the table)")
    sub.add_parser("workers", parents=[common], help="registered worker processes")


def _wait_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"must be seconds from 0 to 86400, got {text!r}")
    return seconds


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if not 1 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"must be from 1 to 10000, got {value}")
    return value


def main(args: argparse.Namespace) -> int:
    """Run one action; print errors to stderr; return the exit code."""
    action = args.jobs_command
    try:
        if not args.dsn:
            raise _Failure(EXIT_USAGE, NO_DATABASE)
        problem = dsn_problem(args.dsn)
        if problem:
            raise _Failure(EXIT_USAGE, problem)
        return asyncio.run(_run(args))
    except _Failure as exc:
        print(f"pgfleet jobs {action}: {exc}", file=sys.stderr)
        return exc.code


async def _run(args: argparse.Namespace) -> int:
    try:
        pool = await create_pool(
            args.dsn,
            min_size=1,
            # A wait listens on a connection of its own besides the one reading.
            max_size=2 if getattr(args, "wait", None) else 1,
            timeout=CONNECT_TIMEOUT,
            pgbouncer=bool(getattr(args, "pgbouncer", False)),
        )
    except Exception as exc:  # refused, unknown host, bad password, no such database
        raise _Failure(
            EXIT_DATABASE, f"cannot connect to the database: {exc or type(exc).__name__}"
        ) from None
    queue = Queue(pool)
    try:
        await _ACTIONS[args.jobs_command](queue, args)
    except JobNotFound as exc:
        raise _Failure(EXIT_NOT_FOUND, str(exc)) from None
    except (InvalidJobState, DuplicateJobKey) as exc:
        raise _Failure(EXIT_REFUSED, f"{exc}; nothing was changed") from None
    except ValidationError as exc:
        raise _Failure(EXIT_USAGE, str(exc)) from None
    except PgfleetError as exc:  # DatabaseUnavailable, SchemaNotReady, ...
        raise _Failure(EXIT_DATABASE, str(exc)) from None
    finally:
        await queue.flush_notifications()
        await pool.close()
    return EXIT_OK


# ---------------------------------------------------------------- actions


async def _list(queue: Any, args: argparse.Namespace) -> None:
    jobs = await queue.recent(args.limit, status=args.status, name=args.name)
    views = [job_view(j) for j in jobs]
    if args.json:
        print_json(views)
        return
    if not views:
        print("no jobs")
        return
    rows = [
        [
            v["id"],
            v["name"],
            v["status"],
            f"{v['attempt']}/{v['max_attempts']}",
            str(v.get("snoozes", "")),
            _short_time(v["run_at"]),
            _short_time(v["created_at"]),
            _one_line(v.get("error", "")),
        ]
        for v in views
    ]
    print_table(["ID", "NAME", "STATUS", "ATTEMPT", "SNOOZES", "RUN AT", "CREATED", "ERROR"], rows)


async def _get(queue: Any, args: argparse.Namespace) -> None:
    job = await queue.get(args.id)
    if job is None:
        raise JobNotFound(args.id)
    if args.wait and not job.status.finished:
        with contextlib.suppress(TimeoutError):
            job = await queue.wait(job.id, timeout=args.wait)
    view = job_view(job)
    if args.payload:
        view["payload"] = job.payload
    _print_record(view, args.json)


async def _cancel(queue: Any, args: argparse.Namespace) -> None:
    _print_record(job_view(await queue.cancel(args.id, by=args.by)), args.json)


async def _retry(queue: Any, args: argparse.Namespace) -> None:
    _print_record(job_view(await queue.retry(args.id)), args.json)


async def _deps(queue: Any, args: argparse.Namespace) -> None:
    job = await queue.get(args.id)
    if job is None:
        raise JobNotFound(args.id)
    parents = [relative_view(r) for r in await queue.parents(job.id, limit=1000)]
    children = [relative_view(r) for r in await queue.children(job.id, limit=1000)]
    if args.json:
        print_json({"parents": parents, "children": children})
        return
    rows = [
        [kind, v["id"], v["name"] or "(pruned)", v["status"], "yes" if v["run_anyway"] else ""]
        for kind, views in (("parent", parents), ("child", children))
        for v in views
    ]
    if not rows:
        print("no parents and no children")
        return
    print_table(["", "ID", "NAME", "STATUS", "RUNS ANYWAY"], rows)


async def _batch(queue: Any, args: argparse.Namespace) -> None:
    _print_record(batch_view(await queue.batch_progress(args.id)), args.json)


async def _counts(queue: Any, args: argparse.Namespace) -> None:
    counts = {status.value: n for status, n in (await queue.counts()).items()}
    if args.json:
        print_json(counts)
        return
    rows = [[status, str(n)] for status, n in counts.items()]
    rows.append(["total", str(sum(counts.values()))])
    print_table(["STATUS", "JOBS"], rows)


async def _workers(queue: Any, args: argparse.Namespace) -> None:
    views = [worker_view(w) for w in await queue.workers()]
    if args.json:
        print_json(views)
        return
    if not views:
        print("no workers registered")
        return
    rows = [
        [
            v["id"],
            v["hostname"],
            str(v["pid"]),
            "yes" if v["alive"] else "NO",
            "yes" if v["is_leader"] else "",
            f"{v['running_jobs']}/{v['concurrency']}",
            _short_time(v["heartbeat_at"]),
            v["version"],
        ]
        for v in views
    ]
    print_table(["ID", "HOST", "PID", "ALIVE", "LEADER", "RUNNING", "HEARTBEAT", "VERSION"], rows)


_ACTIONS: dict[str, Callable[[Any, argparse.Namespace], Awaitable[None]]] = {
    "list": _list,
    "get": _get,
    "cancel": _cancel,
    "retry": _retry,
    "counts": _counts,
    "workers": _workers,
    "deps": _deps,
    "batch": _batch,
}


# ---------------------------------------------------------------- output


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _print_record(view: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(view)
        return
    width = max(len(k) for k in view)
    for key, value in view.items():
        if key == "errors":
            for entry in value:
                worker = entry.get("worker_id") or "-"
                line = _one_line(entry["error"])
                print(
                    f"{key:<{width}}  #{entry['attempt']} {_short_time(entry['at'])} "
                    f"worker {worker}: {line}"
                )
            continue
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        print(f"{key:<{width}}  {text}")


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    for line in (header, *rows):
        print("  ".join(f"{c:<{w}}" for c, w in zip(line, widths, strict=True)).rstrip())


def _short_time(text: str | None) -> str:
    if not text:
        return ""
    return datetime.fromisoformat(text).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _one_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= _ERROR_WIDTH else line[: _ERROR_WIDTH - 1] + "…"
