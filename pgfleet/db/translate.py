"""Where driver errors become pgfleet errors, and rows become pgfleet values."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from operator import itemgetter
from types import TracebackType
from typing import TYPE_CHECKING, Any
from uuid import UUID

import asyncpg

from pgfleet.errors import (
    DatabaseRefused,
    DatabaseUnavailable,
    DuplicateJobKey,
    SchemaNotReady,
    ValidationError,
)
from pgfleet.jobs import AttemptError, Job, JobStatus, WorkerInfo, make_job

if TYPE_CHECKING:
    from asyncpg import Record

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.ConnectionFailureError,
    asyncpg.exceptions.TooManyConnectionsError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.InterfaceError,
)

_MISSING_SCHEMA: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.UndefinedTableError,
    asyncpg.exceptions.InvalidSchemaNameError,
    asyncpg.exceptions.UndefinedObjectError,
    asyncpg.exceptions.UndefinedFunctionError,
)


#: The server answered, but refused the login: no such database or role, or a wrong
#: password. Not an outage: retrying cannot help until the configuration changes.
_LOGIN_REFUSED: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InvalidCatalogNameError,
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
    asyncpg.exceptions.InvalidPasswordError,
)


def login_refused(exc: BaseException, where: str = "") -> DatabaseRefused | None:
    """The library's error for a refused login (``where``: the server, named in the
    message), or None when ``exc`` is something else."""
    if isinstance(exc, DatabaseRefused):
        return exc
    if not isinstance(exc, _LOGIN_REFUSED):
        return None
    at = f" at {where}" if where else ""
    return DatabaseRefused(f"cannot connect to the database{at}: {exc}")


def is_connection_error(exc: BaseException) -> bool:
    """True for errors that mean the database was not reachable (worth retrying)."""
    return isinstance(exc, (*_UNAVAILABLE, DatabaseUnavailable)) and not isinstance(
        exc, asyncpg.exceptions.InterfaceWarning
    )


class translate_errors:  # named like the function it replaced: used as `with translate_errors(...)`
    """Re-raise driver errors as the library's: callers never see asyncpg's classes.

    Used only by the data layer (:mod:`pgfleet.db.store`), around each of its
    statements. A class rather than a generator-based context manager: it is
    entered on every enqueue, and one instance per operation is made once."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None:
            _translate(exc, self.what)


def _translate(exc: BaseException, what: str) -> None:
    """Raise the library's error for ``exc``; return (so that ``exc`` propagates)
    when it has none."""
    if isinstance(exc, asyncpg.exceptions.UniqueViolationError):
        if exc.constraint_name == "jobs_key_active":
            raise duplicate_key(what, getattr(exc, "detail", "")) from None
        return
    if isinstance(exc, asyncpg.exceptions.CheckViolationError):
        raise check_failed(what, exc.message, exc.constraint_name) from None
    if isinstance(exc, _LOGIN_REFUSED):
        raise DatabaseRefused(f"{what}: cannot connect to the database: {exc}") from None
    if isinstance(exc, _MISSING_SCHEMA):
        raise schema_not_ready(what, exc) from None
    if isinstance(exc, _UNAVAILABLE):
        if isinstance(exc, asyncpg.exceptions.InterfaceError) and "another operation" in str(exc):
            return  # a usage error on a shared connection, not an outage
        raise DatabaseUnavailable(f"{what}: database unavailable: {exc}") from exc


# The library's errors for what Postgres refused, worded once for every driver's
# translation table (asyncpg's above, psycopg's in pgfleet.db.psycopg_driver).


def duplicate_key(what: str, detail: str | None) -> DuplicateJobKey:
    key = _detail_value(detail or "")
    return DuplicateJobKey(f"{what}: job_key {key!r} is held by another queued or running job", key)


def check_failed(what: str, message: object, constraint: object) -> ValidationError:
    return ValidationError(f"{what}: {message} ({constraint})")


def schema_not_ready(what: str, exc: BaseException) -> SchemaNotReady:
    return SchemaNotReady(
        f"{what}: the pgfleet schema is missing or outdated ({exc}); "
        "run pgfleet.migrate(pool) or `pgfleet migrate`"
    )


def _detail_value(detail: str) -> str:
    # "Key (job_key)=(abc) already exists."
    start, end = detail.find(")=("), detail.rfind(") ")
    return detail[start + 3 : end] if start >= 0 and end > start else "?"


def decode_payload(value: Any) -> Any:
    # An application may have registered its own jsonb codec on the pool.
    return json.loads(value) if isinstance(value, str) else value


def _stored_result(r: Record) -> Any:
    """A job's result: json (0013) when set, else the jsonb column of 0008, which
    holds what workers of an earlier version wrote."""
    value = r.get("result_json")
    return r["result"] if value is None else value


def job_from_record(r: Record) -> Job:
    """A job as a full row of ``pgfleet.jobs`` (``SELECT *``, ``RETURNING *``) holds it."""
    return Job(
        id=r["id"],
        name=r["name"],
        payload=decode_payload(r["payload"]),
        status=JobStatus(r["status"]),
        attempt=r["attempt"],
        max_attempts=r["max_attempts"],
        priority=r["priority"],
        queue_name=r["queue_name"],
        job_key=r["job_key"],
        run_at=r["run_at"],
        created_at=r["created_at"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        last_error=r["last_error"],
        worker_id=r["locked_by"],
        lock_token=r["lock_token"],
        trace_context=_json_text(r["trace_context"]),
        result=decode_payload(_stored_result(r)),
        errors=attempt_errors(r["errors"]),
        errors_omitted=r["errors_omitted"] or 0,
        snoozes=r["snoozes"] or 0,
        cancel_requested_at=r["cancel_requested_at"],
        cancelled_by=r["cancelled_by"],
        limit_key=r["limit_key"],
    )


def attempt_errors(value: Any) -> tuple[AttemptError, ...]:
    """The ``errors`` column (JSON array of objects, oldest first) as values."""
    items = decode_payload(value)
    if not items:
        return ()
    out = []
    for item in items:
        worker = item.get("worker")
        out.append(
            AttemptError(
                at=datetime.fromisoformat(item["at"]),
                attempt=int(item["attempt"]),
                error=str(item["error"]),
                worker_id=None if worker is None else UUID(worker),
            )
        )
    return tuple(out)


def _json_text(value: Any) -> str | None:
    """A jsonb value as JSON text (asyncpg reads text, psycopg a parsed value)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


_EPOCH_MIN = datetime.min.replace(tzinfo=UTC)
_EPOCH_MAX = datetime.max.replace(tzinfo=UTC)
_from_epoch = datetime.fromtimestamp


def _stamp(seconds: float) -> datetime:
    """A time ``job_complete_and_claim`` sent as seconds since the epoch. Exact to
    the microsecond from 1685 to 2255 (a claimed job's times are due, so past); ±
    infinity, which only SQL written by hand can store, reads as the driver reads it
    (the earliest or latest datetime)."""
    try:
        return _from_epoch(seconds, UTC)
    except (OverflowError, ValueError, OSError):
        return _EPOCH_MIN if seconds < 0 else _EPOCH_MAX


class _Stamps(dict[float, datetime]):
    """A round's times, each converted once: a batch's jobs share theirs."""

    __slots__ = ()

    def __missing__(self, seconds: float) -> datetime:
        stamp = self[seconds] = _stamp(seconds)
        return stamp


#: The columns of ``job_complete_and_claim``'s rows, in order (checked by a test
#: against the statement).
ROUND_COLUMNS = (
    "claimed", "held", "id", "name", "payload", "attempt", "max_attempts", "priority",
    "queue_name", "job_key", "run_at", "created_at", "started_at", "last_error", "lock_token",
    "trace_context", "snoozes", "limit_key",
)  # fmt: skip
_CLAIMED = ROUND_COLUMNS.index("claimed")
_ID = ROUND_COLUMNS.index("id")
_PAYLOAD = ROUND_COLUMNS.index("payload")


def claimed_count(rows: Sequence[Record]) -> int:
    """How many jobs a ``job_complete_and_claim`` round claimed."""
    return round_signals(rows)[0]


def flow_pace(rows: Sequence[Record]) -> float | None:
    """The seconds a claim round asks the loop to poll within while rate limits of
    its names hold jobs back (its row without an id), or None."""
    return round_signals(rows)[1]


def flow_active(rows: Sequence[Record]) -> bool:
    """Whether a claim round said flow control is in play for the worker's names
    (its row without an id, held false): the next round must be a full one."""
    return round_signals(rows)[2]


def round_signals(rows: Sequence[Record]) -> tuple[int, float | None, bool]:
    """What the claim loop reads of every round, in one pass over its rows (three
    passes cost a few percent of a no-op drain's client time): how many jobs it
    claimed, the seconds rate limits ask it to poll within (the last pace row's,
    or None) and whether flow control is in play (a row without an id, held
    false: the next round must be a full one)."""
    claimed = 0
    pace: float | None = None
    active = False
    for row in rows:
        if row[0]:
            claimed += 1
        elif row[2] is None:  # a row without an id: flow control speaks
            if row[1]:  # the pace (the last such row wins)
                pace = max(0.01, float(row[10]))
            else:
                active = True
    return claimed, pace, active


def round_result(rows: Sequence[Record], worker_id: UUID) -> tuple[list[Job], list[Job], set[UUID]]:
    """What a ``job_complete_and_claim`` round returned: the jobs claimed to start
    now, those claimed to be held ahead (in claim order: priority, run_at, id), and
    the ids of the outcomes it applied. A claimed job is running, held by
    ``worker_id``.

    The claim loop's hot path, so it does per round what it can: the payloads are
    parsed as one JSON array (Postgres wrote each, so each is one JSON value) and
    each distinct time is converted once."""
    applied: set[UUID] = set()
    claimed = []
    payloads = []
    for row in rows:
        if row[_CLAIMED]:
            claimed.append(row)
            payloads.append(row[_PAYLOAD])
        elif row[_ID] is not None:  # (a pace row has no id: see flow_pace)
            applied.add(row[_ID])
    if not claimed:
        return [], [], applied
    values = json.loads(f"[{','.join(payloads)}]")
    stamps = _Stamps()
    running = JobStatus.RUNNING
    now: list[Job] = []
    ahead: list[tuple[int, float, UUID, Job]] = []
    for row, payload in zip(claimed, values, strict=True):
        # By position (ROUND_COLUMNS): by name costs five times as much per row (measured).
        (_, held, id_, name, _, attempt, max_attempts, priority, queue_name, job_key, run_at,
         created_at, started_at, last_error, token, trace, snoozes, limit_key) = row  # fmt: skip
        job = make_job(
            id_, name, payload, running, attempt, max_attempts, priority, queue_name,
            job_key, stamps[run_at], stamps[created_at], stamps[started_at], None,
            last_error, worker_id, token, trace, None, (), 0, snoozes or 0, None, None,
            limit_key,
        )  # fmt: skip
        if held:
            ahead.append((priority, run_at, id_, job))
        else:
            now.append(job)
    if len(ahead) > 1:  # the update returns them in no particular order
        ahead.sort(key=_CLAIM_ORDER)
    return now, [entry[3] for entry in ahead], applied


_CLAIM_ORDER = itemgetter(0, 1, 2)


def worker_from_record(r: Record) -> WorkerInfo:
    return WorkerInfo(
        id=r["id"],
        hostname=r["hostname"],
        pid=r["pid"],
        concurrency=r["concurrency"],
        job_names=tuple(r["job_names"]),
        queue_names=None if r["queue_names"] is None else tuple(r["queue_names"]),
        version=r["version"],
        started_at=r["started_at"],
        heartbeat_at=r["heartbeat_at"],
        expires_at=r["expires_at"],
        alive=bool(r["alive"]),
        running_jobs=int(r["running_jobs"]),
        is_leader=bool(r["is_leader"]),
    )
