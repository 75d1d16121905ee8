"""The driver connection under a SQLAlchemy session or connection, inside the
transaction SQLAlchemy holds on it (for :mod:`pgfleet.contrib.sqlalchemy`)."""

from __future__ import annotations

from typing import Any

import asyncpg
import psycopg
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from pgfleet.db.queries import Q
from pgfleet.errors import InvalidOptions

__all__ = ["AsyncBind", "SyncBind", "async_connection", "sync_connection"]

SyncBind = Session | Connection
AsyncBind = AsyncSession | AsyncConnection


def sync_connection(bind: SyncBind) -> psycopg.Connection[Any]:
    """The psycopg connection under ``bind``, its SQLAlchemy transaction begun."""
    if isinstance(bind, Session):
        conn = bind.connection()  # begins the session's transaction
    elif isinstance(bind, Connection):
        conn = bind
        if not conn.in_transaction():
            conn.begin()  # as the next statement would (autobegin)
    else:
        raise InvalidOptions(
            f"expected a sqlalchemy Session or Connection, got {type(bind).__name__}"
        )
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidOptions(
            "pgfleet.contrib.sqlalchemy needs the psycopg 3 dialect on the sync side "
            f"(postgresql+psycopg://...); this engine's driver connection is {type(raw).__name__}"
        )
    return raw


async def async_connection(bind: AsyncBind) -> Any:
    """The psycopg or asyncpg connection under ``bind``, inside the transaction
    SQLAlchemy holds on it."""
    if isinstance(bind, AsyncSession):
        conn = await bind.connection()  # begins the session's transaction
    elif isinstance(bind, AsyncConnection):
        conn = bind
        if not conn.in_transaction():
            await conn.begin()
    else:
        raise InvalidOptions(
            f"expected a sqlalchemy AsyncSession or AsyncConnection, got {type(bind).__name__}"
        )
    fairy = await conn.get_raw_connection()
    raw = fairy.driver_connection
    if isinstance(raw, asyncpg.Connection):
        # SQLAlchemy's asyncpg adapter sends BEGIN with the transaction's first
        # statement: one it sends (only when none has run yet) opens it, so that
        # the job commits or rolls back with it.
        adapter = fairy.dbapi_connection
        if not raw.is_in_transaction() and getattr(adapter, "isolation_level", "") != "autocommit":
            await conn.exec_driver_sql(Q.ping.sql)
        return raw
    if isinstance(raw, psycopg.AsyncConnection):
        return raw
    raise InvalidOptions(
        "pgfleet.contrib.sqlalchemy needs the psycopg 3 or asyncpg dialect on the asyncio "
        f"side; this engine's driver connection is {type(raw).__name__}"
    )
