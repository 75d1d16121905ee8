"""Where driver errors become pgfleet errors, and rows become pgfleet values."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import asyncpg

from pgfleet.errors import (
    DatabaseUnavailable,
    DuplicateJobKey,
    SchemaNotReady,
    ValidationError,
)
from pgfleet.jobs import Job, JobStatus, WorkerInfo

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


def is_connection_error(exc: BaseException) -> bool:
    """True for errors that mean the database was not reachable (worth retrying)."""
    return isinstance(exc, (*_UNAVAILABLE, DatabaseUnavailable)) and not isinstance(
        exc, asyncpg.exceptions.InterfaceWarning
    )


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Re-raise driver errors as the library's: callers never see asyncpg's classes."""
    try:
        yield
    except asyncpg.exceptions.UniqueViolationError as exc:
        if exc.constraint_name == "jobs_key_active":
            key = _detail_value(exc)
            raise DuplicateJobKey(
                f"{what}: job_key {key!r} is held by another queued or running job", key
            ) from None
        raise
    except asyncpg.exceptions.CheckViolationError as exc:
        raise ValidationError(f"{what}: {exc.message} ({exc.constraint_name})") from None
    except _MISSING_SCHEMA as exc:
        raise SchemaNotReady(
            f"{what}: the pgfleet schema is missing or outdated ({exc}); "
            "run pgfleet.migrate(pool) or `pgfleet migrate`"
        ) from None
    except _UNAVAILABLE as exc:
        if isinstance(exc, asyncpg.exceptions.InterfaceError) and "another operation" in str(exc):
            raise  # a usage error on a shared connection, not an outage
        raise DatabaseUnavailable(f"{what}: database unavailable: {exc}") from exc


def _detail_value(exc: Any) -> str:
    detail = getattr(exc, "detail", "") or ""
    # "Key (job_key)=(abc) already exists."
    start, end = detail.find(")=("), detail.rfind(") ")
    return detail[start + 3 : end] if start >= 0 and end > start else "?"


def decode_payload(value: Any) -> Any:
    # An application may have registered its own jsonb codec on the pool.
    return json.loads(value) if isinstance(value, str) else value


def job_from_record(r: Any) -> Job:
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
    )


def worker_from_record(r: Any) -> WorkerInfo:
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
