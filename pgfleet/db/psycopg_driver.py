"""pgfleet's plans run on psycopg 3, sync and async (the ``psycopg`` extra).

The statements are the named ones of ``queries.sql``, sent with PostgreSQL's own
``$n`` placeholders through psycopg's ``RawCursor`` (psycopg 3.2 or later), whatever
cursor class the caller's connection makes by default (Django's makes client-side
binding cursors). psycopg's errors become pgfleet's through one table,
:class:`translate_psycopg`, worded as asyncpg's are (:mod:`pgfleet.db.translate`).

A plan of several statements that must be atomic runs in ``connection.transaction()``
(a savepoint inside the caller's transaction), except on a connection that is not in
autocommit mode and has not started its transaction yet: there the statements open
the caller's own (implicit) transaction, which the caller commits or rolls back;
``transaction()`` would have committed them at the end of the block.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader

from pgfleet.db.migrate import (
    _APPLIED,
    _BOOTSTRAP,
    _LOCK,
    _RECORD,
    MIGRATION_LOCK_KEY,
    _check_recorded,
    migrations,
)
from pgfleet.db.plans import Batch, Statement, Steps
from pgfleet.db.translate import check_failed, duplicate_key, schema_not_ready
from pgfleet.errors import DatabaseUnavailable

__all__ = [
    "ENQUEUE",
    "ENQUEUE_MANY",
    "arun",
    "arun_batch",
    "migrate_sync",
    "run",
    "run_batch",
    "translate_psycopg",
]

T = TypeVar("T")

log = logging.getLogger("pgfleet")

_MISSING_SCHEMA: tuple[type[BaseException], ...] = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.InvalidSchemaName,
    psycopg.errors.UndefinedObject,
    psycopg.errors.UndefinedFunction,
)

#: SQLSTATE classes and codes that mean the server went away or refused the
#: connection: 08 (connection exception), 57P01-57P03 (shutdown, cannot connect
#: now), 53300 (too many connections). Other OperationalErrors (a statement
#: timeout, a lock not available) are the statement's own failure.
_UNAVAILABLE_STATES = ("08", "57P01", "57P02", "57P03", "53300")


class translate_psycopg:
    """Re-raise psycopg's errors as the library's (the table of this driver)."""

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
    if isinstance(exc, psycopg.errors.UniqueViolation):
        if exc.diag.constraint_name == "jobs_key_active":
            raise duplicate_key(what, exc.diag.message_detail) from None
        return
    if isinstance(exc, psycopg.errors.CheckViolation):
        raise check_failed(what, exc.diag.message_primary, exc.diag.constraint_name) from None
    if isinstance(exc, _MISSING_SCHEMA):
        raise schema_not_ready(what, exc) from None
    if _unavailable(exc):
        raise DatabaseUnavailable(f"{what}: database unavailable: {exc}") from exc


def _unavailable(exc: BaseException) -> bool:
    if isinstance(exc, psycopg.OperationalError):
        state = exc.sqlstate
        return state is None or state.startswith(_UNAVAILABLE_STATES)
    if isinstance(exc, psycopg.InterfaceError):
        return "closed" in str(exc)  # "the connection is closed"
    return isinstance(exc, OSError)


ENQUEUE = translate_psycopg("enqueue")
ENQUEUE_MANY = translate_psycopg("enqueue_many")


def _own_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an atomic plan needs ``transaction()`` on ``conn`` (see the module)."""
    return conn.autocommit or conn.info.transaction_status != TransactionStatus.IDLE


def _json_as_text(cur: psycopg.RawCursor[Any] | psycopg.AsyncRawCursor[Any]) -> None:
    """json and jsonb values arrive as their text, as asyncpg reads them, and the
    translation parses them once: psycopg's own loader would hand a JSON string
    (a handler's result ``"done"``) over as ``done``, which is not JSON. On the
    cursor only: the application's own queries keep the connection's loaders."""
    cur.adapters.register_loader("json", TextLoader)
    cur.adapters.register_loader("jsonb", TextLoader)


def _answer(cur: Any, shape: str) -> Any:
    if shape == ":many":
        return cur.fetchall()
    if shape == ":one":
        return cur.fetchone()
    if shape == ":val":
        row = cur.fetchone()
        return None if row is None else row[0]
    return None


async def _aanswer(cur: Any, shape: str) -> Any:
    if shape == ":many":
        return await cur.fetchall()
    if shape == ":one":
        return await cur.fetchone()
    if shape == ":val":
        row = await cur.fetchone()
        return None if row is None else row[0]
    return None


# ---------------------------------------------------------------- sync


def run_statement(
    conn: psycopg.Connection[Any], statement: Statement, errors: translate_psycopg
) -> Any:
    """Run one statement; what it returns follows its shape (see plans)."""
    shape = statement.query.shape
    with errors:
        cur: psycopg.RawCursor[Any] = (
            psycopg.RawCursor(conn, row_factory=dict_row)
            if shape == ":one"
            else psycopg.RawCursor(conn)
        )
        _json_as_text(cur)
        with cur:
            cur.execute(statement.query.sql, statement.args)
            return _answer(cur, shape)


def run(conn: psycopg.Connection[Any], steps: Steps[T], errors: translate_psycopg) -> T:
    """Run a plan on ``conn``, in whatever transaction it is in."""
    try:
        statement = next(steps)
        while True:
            statement = steps.send(run_statement(conn, statement, errors))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def run_batch(
    conn: psycopg.Connection[Any], batch: Batch, *, notify: bool, trace: str | None = None
) -> list[Any]:
    """Run an enqueue batch, atomically."""
    steps = batch.steps(notify, trace)
    if not (batch.atomic(notify) and _own_transaction(conn)):
        return run(conn, steps, ENQUEUE_MANY)
    with ENQUEUE_MANY, conn.transaction():
        return run(conn, steps, ENQUEUE_MANY)


def migrate_sync(conn: psycopg.Connection[Any]) -> list[int]:
    """``pgfleet.migrate`` on a psycopg connection: pending migrations in one
    transaction (a savepoint inside the caller's) under the advisory lock."""
    shipped = migrations()
    applied_now: list[int] = []
    what = translate_psycopg("migrate")
    with what, conn.transaction(), psycopg.RawCursor(conn) as cur:
        cur.execute(_LOCK, (MIGRATION_LOCK_KEY,))
        cur.execute(_BOOTSTRAP)
        cur.execute(_APPLIED)
        recorded = {r[0]: {"name": r[1], "checksum": r[2]} for r in cur.fetchall()}
        _check_recorded(recorded, shipped)
        for m in shipped:
            if m.version in recorded:
                continue
            cur.execute(m.sql)
            cur.execute(_RECORD, (m.version, m.name, m.checksum))
            applied_now.append(m.version)
    for version in applied_now:
        log.info("applied migration %04d", version)
    return applied_now


# ---------------------------------------------------------------- async


async def arun_statement(
    conn: psycopg.AsyncConnection[Any], statement: Statement, errors: translate_psycopg
) -> Any:
    shape = statement.query.shape
    with errors:
        cur: psycopg.AsyncRawCursor[Any] = (
            psycopg.AsyncRawCursor(conn, row_factory=dict_row)
            if shape == ":one"
            else psycopg.AsyncRawCursor(conn)
        )
        _json_as_text(cur)
        async with cur:
            await cur.execute(statement.query.sql, statement.args)
            return await _aanswer(cur, shape)


async def arun(conn: psycopg.AsyncConnection[Any], steps: Steps[T], errors: translate_psycopg) -> T:
    try:
        statement = next(steps)
        while True:
            statement = steps.send(await arun_statement(conn, statement, errors))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun_batch(
    conn: psycopg.AsyncConnection[Any], batch: Batch, *, notify: bool, trace: str | None = None
) -> list[Any]:
    steps = batch.steps(notify, trace)
    if not (batch.atomic(notify) and _own_transaction(conn)):
        return await arun(conn, steps, ENQUEUE_MANY)
    with ENQUEUE_MANY:
        async with conn.transaction():
            return await arun(conn, steps, ENQUEUE_MANY)
