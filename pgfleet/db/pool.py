"""The asyncpg pool ``pgfleet.create_pool`` returns: asyncpg's, with a release that
cannot wait for ever.

asyncpg hands a connection back by first waiting for any cancellation in progress on
it, with no time limit unless the connection was acquired with a ``timeout``. A query
that timed out on a connection that no longer answers (``pool.execute(...,
timeout=10)`` on a hung server) sends a cancel request that is never acknowledged, so
the release, and with it the caller, waits for ever and the pool slot is lost. Here a
release without a timeout of its own is bounded by ``release_timeout``: past it the
connection is terminated and the slot returned, and the caller gets ``TimeoutError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import asyncpg.pool

from pgfleet.db.bounded import DEFAULT_DATABASE_TIMEOUT, tune_socket


class Pool(asyncpg.pool.Pool):
    __slots__ = ("release_timeout",)

    release_timeout: float

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:
        if timeout is None:
            holder = getattr(connection, "_holder", None)
            if getattr(holder, "_timeout", None) is None:
                timeout = self.release_timeout
        await super().release(connection, timeout=timeout)


def create(
    dsn: str | None, release_timeout: float = DEFAULT_DATABASE_TIMEOUT, **kwargs: Any
) -> Pool:
    """Like ``asyncpg.create_pool`` (same arguments and defaults), as a :class:`Pool`."""
    options: dict[str, Any] = {
        "min_size": 10,
        "max_size": 10,
        "max_queries": 50000,
        "max_inactive_connection_lifetime": 300.0,
        "loop": None,
        "connection_class": asyncpg.Connection,
        "record_class": asyncpg.Record,
    }
    options.update(kwargs)
    pool = Pool(dsn, **options)
    pool.release_timeout = release_timeout
    return pool


async def _no_session_reset(connection: object) -> None:
    """Pool ``reset`` hook: asyncpg has already rolled back any open transaction."""


async def create_pool(dsn: str | None = None, *, pgbouncer: bool = False, **kwargs: Any) -> Pool:
    """An asyncpg pool tuned for pgfleet; takes asyncpg.create_pool's arguments.

    Connections go back to the pool without asyncpg's default session reset (one
    extra round trip per release: ``UNLISTEN *; RESET ALL; …``), which pgfleet never
    needs because it leaves no session state behind. An open transaction is still
    rolled back. Use it for pools that serve pgfleet; keep a default pool for code
    that changes session settings.

    Each connection gets TCP keepalive and a TCP user timeout, connecting gives up
    after ``timeout`` (default 10 s), and handing a connection back never waits more
    than ``release_timeout`` seconds (default 15) for a cancelled query to be
    acknowledged: a query that timed out on a server that no longer answers drops
    its connection instead of holding the caller and the pool slot for ever.

    ``pgbouncer=True`` is for a DSN that goes through a pooler in transaction mode
    which cannot keep named prepared statements (PgBouncer before 1.21, or without
    ``max_prepared_statements``): asyncpg's statement cache is turned off, so every
    statement is prepared unnamed in the round trip that runs it.
    """
    if pgbouncer:
        kwargs.setdefault("statement_cache_size", 0)
    kwargs.setdefault("reset", _no_session_reset)
    # A server that accepts TCP but never answers must not hold up a connect for
    # asyncpg's default of a minute.
    kwargs.setdefault("timeout", CONNECT_TIMEOUT)
    kwargs["init"] = _with_tuned_socket(kwargs.get("init"))
    release_timeout = kwargs.pop("release_timeout", DEFAULT_DATABASE_TIMEOUT)
    return await create(dsn, release_timeout, **kwargs)


#: Default connect timeout of ``create_pool``, in seconds.
CONNECT_TIMEOUT = 10.0


def _with_tuned_socket(init: Any) -> Callable[[Any], Awaitable[None]]:
    """The pool's ``init`` hook: TCP keepalive and user timeout on each new
    connection, so a peer that vanished is noticed, then the caller's own hook."""

    async def tuned(connection: Any) -> None:
        tune_socket(connection)
        if init is not None:
            await init(connection)

    return tuned
