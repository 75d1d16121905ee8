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

import os
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg
import asyncpg.pool

from pgfleet.db.deadlines import DEFAULT_DATABASE_TIMEOUT, tune_socket


class Pool(asyncpg.pool.Pool):
    __slots__ = ("plain_reset", "release_timeout", "server")

    release_timeout: float
    #: ``host:port`` (or the socket directory) the pool connects to, for messages
    #: such as "database unavailable at worker start": never the user or password.
    server: str
    #: The pool's reset hook does nothing (``create_pool``'s default), so a clean
    #: connection can go back without asyncpg's reset round.
    plain_reset: bool

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:
        if self.plain_reset and _FAST_RELEASE and release_now(self, connection):
            return
        if timeout is None:
            holder = getattr(connection, "_holder", None)
            if getattr(holder, "_timeout", None) is None:
                timeout = self.release_timeout
        await super().release(connection, timeout=timeout)


def _has_release_internals() -> bool:
    """Whether this asyncpg has the internals :func:`release_now` relies on;
    without them every release takes asyncpg's own path."""
    holder = asyncpg.pool.PoolConnectionHolder
    return all(
        callable(getattr(holder, name, None)) for name in ("_release", "_setup_inactive_callback")
    ) and callable(getattr(asyncpg.Connection, "_on_release", None))


_FAST_RELEASE = _has_release_internals()


# asyncpg's private internals, for a third less client CPU per pool call (measured:
# docs/design/performance.md); `make test-asyncpg-range` runs its tests on the range.
def release_now(pool: Pool, proxy: Any) -> bool:
    """Hand back a connection that needs nothing done to it, synchronously.

    asyncpg's release runs in a task of its own (``asyncio.shield``) under a
    timeout: a task, a timer and a loop iteration per pool call even when there is
    nothing to wait for. A connection that is open, not cancelling a query, not in
    a transaction, with no listeners, within ``max_queries`` and of the current
    generation needs none of it: what asyncpg's release would do to it (no
    rollback, no reset query, as ``plain_reset`` says) happens here without a
    suspension point, so a cancellation cannot interrupt it either. Anything else
    returns False and takes asyncpg's path.
    """
    try:
        holder = proxy._holder
        con = proxy._con
        if (
            con is None
            or pool.is_closing()
            or holder._pool is not pool
            or holder._in_use is None
            or con.is_closed()
            or con.is_in_transaction()
            or con._top_xact is not None
            or con._listeners
            or con._log_listeners
            or con._protocol._is_cancelling()
            or con._protocol.queries_count >= holder._max_queries
            or holder._generation != pool._generation
        ):
            return False
    except AttributeError:  # not a proxy of this asyncpg's pool: its own path
        return False
    con._on_release()
    holder._timeout = None
    holder._release()
    holder._setup_inactive_callback()
    return True


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
    pool.server = server_of(dsn, options)
    pool.release_timeout = release_timeout
    pool.plain_reset = options.get("reset") is _no_session_reset
    return pool


def server_of(dsn: str | None, options: dict[str, Any]) -> str:
    """Where a connection string and asyncpg's keyword arguments point: ``host:port``
    as libpq would resolve it (keywords, then the URL and its query, then ``PGHOST``
    and ``PGPORT``, then localhost:5432). A best effort for messages: asyncpg decides."""
    host: Any = options.get("host")
    port: Any = options.get("port")
    if dsn:
        try:
            parts = urlsplit(dsn)
            query = parse_qs(parts.query)
            host = host or next(iter(query.get("host", ())), "") or unquote(parts.hostname or "")
            port = port or next(iter(query.get("port", ())), "") or parts.port
        except ValueError:  # a malformed URL: asyncpg will say what is wrong with it
            pass
    host = host or os.environ.get("PGHOST") or "localhost"
    port = port or os.environ.get("PGPORT") or 5432
    if isinstance(host, list | tuple):
        host = ",".join(map(str, host))
    if isinstance(port, list | tuple):
        port = ",".join(map(str, port))
    return f"{host}:{port}"


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
