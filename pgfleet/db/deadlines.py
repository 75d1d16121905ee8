"""Database calls with a deadline: a connection that stops answering is dropped.

A hung server, a dead peer behind a NAT or a proxy that lost its backend closes
nothing: without a client-side bound every call on such a connection waits for ever.
``BoundedPool`` wraps the application's asyncpg pool for pgfleet's own calls (the
runtime, its services, metrics, readiness, the HTTP API): each call, including the
wait for a free connection, must finish within ``timeout`` seconds. When one does not,
its connection is terminated (never handed back to the pool, where its next user
would hang on it too), the pool's other connections are marked for replacement (they
may sit on the same dead path), and :class:`DatabaseTimeout` is raised: a
:class:`DatabaseUnavailable`, so callers retry it like any outage.

asyncpg hands a pooled connection back to its pool by itself when the connection
closes (``Connection._cleanup``): a proxy held across awaits can be detached under
its holder. ``Held`` tracks that, so a long-lived holder (the claim loop, the
listener) never calls into a connection that is no longer its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, TypeAlias

from pgfleet.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from asyncpg import Pool, Record
    from asyncpg.pool import PoolConnectionProxy

log = logging.getLogger("pgfleet")

#: The pool an application hands pgfleet: asyncpg's (``create_pool``'s is one), or
#: one wrapped in a BoundedPool.
AppPool: TypeAlias = "Pool[Record] | BoundedPool"

#: Default bound of one database call made by pgfleet itself, in seconds.
DEFAULT_DATABASE_TIMEOUT = 15.0

#: TCP keepalive and user timeout set on every connection of ``create_pool``: a
#: peer that vanished is noticed by the kernel within about KEEPALIVE_IDLE +
#: KEEPALIVE_INTERVAL * KEEPALIVE_COUNT seconds even on an idle connection, and
#: unacknowledged writes give up after TCP_USER_TIMEOUT_MS.
KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
TCP_USER_TIMEOUT_MS = 30_000


#: Seconds past a release's own bound before ``Held.release`` gives up on it.
RELEASE_BACKSTOP = 2.0


class DatabaseTimeout(DatabaseUnavailable, TimeoutError):
    """A database call did not finish within its bound; its connection was dropped."""


def drop(conn: Any) -> None:
    """Terminate a connection without a word to the server (it may never answer).

    asyncpg returns the pool slot itself once the connection is gone; a proxy that
    was already detached (its connection closed under it) is left alone."""
    if conn is None:
        return
    with contextlib.suppress(Exception):
        conn.terminate()


def tune_socket(conn: Any) -> None:
    """Turn on TCP keepalive and a TCP user timeout on a fresh connection (best
    effort: unix sockets and platforms without the options are left as they are)."""
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), KEEPALIVE_IDLE),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_COUNT),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), TCP_USER_TIMEOUT_MS),
    ]
    for level, option, value in options:
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)


class Held:
    """A pool connection kept across many calls (claim loop, listener).

    ``lost`` turns true the moment asyncpg reports the connection closed (and has
    already returned its slot to the pool); from then on the proxy is dead weight."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.lost = False
        conn.add_termination_listener(self._on_terminated)

    def _on_terminated(self, _conn: Any) -> None:
        self.lost = True

    def closed(self) -> bool:
        """True once the connection is gone. A connection can report itself closed
        before asyncpg has cleaned it up and returned its slot: call ``drop`` then,
        never just forget it (the slot would be lost, and ``pool.close()`` would
        wait for it for ever)."""
        if self.lost:
            return True
        try:
            return bool(self.conn.is_closed())
        except Exception:  # detached from its connection: released by asyncpg
            return True

    def drop(self) -> None:
        """Terminate the connection: asyncpg then returns its slot to the pool. On a
        proxy asyncpg already detached this does nothing."""
        self.lost = True
        drop(self.conn)

    async def release(self, pool: Any, timeout: float) -> None:
        """Give the connection back, or drop it when it does not reset in time."""
        if self.closed():
            self.drop()
            return
        with contextlib.suppress(Exception):
            self.conn.remove_termination_listener(self._on_terminated)
        try:
            # asyncpg bounds its own release (and terminates the connection past
            # it); the outer bound is only a backstop. Cutting asyncpg's shielded
            # release from outside would leave its task to fail unobserved.
            async with asyncio.timeout(timeout + RELEASE_BACKSTOP):
                await pool.release(self.conn, timeout=timeout)
        except BaseException:
            self.drop()
            raise
        self.lost = True  # no longer ours


class BoundedPool:
    """The pool as pgfleet's own code uses it: every call bounded by ``timeout``.

    Offers the subset of asyncpg's Pool that pgfleet calls (``fetch``, ``fetchrow``,
    ``fetchval``, ``execute``, ``acquire`` as an async context manager) and passes
    anything else through to the wrapped pool."""

    raw: Pool[Record]

    def __init__(self, pool: AppPool, timeout: float = DEFAULT_DATABASE_TIMEOUT) -> None:
        if isinstance(pool, BoundedPool):
            pool = pool.raw
        self.raw = pool
        self.timeout = timeout
        #: Connections dropped because they stopped answering.
        self.hung = 0
        self._last_hang_log = float("-inf")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    @contextlib.asynccontextmanager
    async def acquire(
        self, what: str = "database call"
    ) -> AsyncIterator[PoolConnectionProxy[Record]]:
        """A connection whose whole use (acquire included) must end in ``timeout``."""
        conn: PoolConnectionProxy[Record] | None = None
        try:
            async with asyncio.timeout(self.timeout):
                # The acquire's own timeout also bounds asyncpg's release of this
                # connection and its close once the pool expired it.
                conn = await self.raw.acquire(timeout=self.timeout)
                held = Held(conn)
                try:
                    yield conn
                except BaseException:
                    if _interrupted():
                        held.drop()
                    else:  # the call's own error is the one to report, not the reset's
                        with contextlib.suppress(Exception):
                            await held.release(self.raw, self.timeout)
                    raise
                await held.release(self.raw, self.timeout)
        except TimeoutError:
            if conn is None:
                raise DatabaseTimeout(
                    f"{what}: no free database connection within {self.timeout:g}s"
                ) from None
            drop(conn)
            await self.hang_detected(what)
            raise DatabaseTimeout(
                f"{what}: the database did not answer within {self.timeout:g}s; "
                "its connection was dropped"
            ) from None

    async def hang_detected(self, what: str) -> None:
        """A connection of this pool stopped answering: replace the others too (an
        idle one may sit on the same dead path), and say so once in a while."""
        self.hung += 1
        with contextlib.suppress(Exception):
            await self.raw.expire_connections()
        now = time.monotonic()
        if now - self._last_hang_log >= 60.0:
            self._last_hang_log = now
            log.warning(
                "%s: a database connection stopped answering for %gs; it was dropped and "
                "the pool's connections are being replaced",
                what,
                self.timeout,
            )

    async def fetch(self, sql: str, *args: object) -> list[Record]:
        async with self.acquire() as conn:
            return list(await conn.fetch(sql, *args))

    async def fetchrow(self, sql: str, *args: object) -> Record | None:
        async with self.acquire() as conn:
            return await conn.fetchrow(sql, *args)

    async def fetchval(self, sql: str, *args: object) -> Any:
        async with self.acquire() as conn:
            return await conn.fetchval(sql, *args)

    async def execute(self, sql: str, *args: object) -> str:
        async with self.acquire() as conn:
            return str(await conn.execute(sql, *args))


def _interrupted() -> bool:
    """True while the current task is being cancelled (a call cut mid-flight leaves
    its connection in an unknown state: drop it rather than reset it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def bounded(pool: AppPool, timeout: float | None = None) -> BoundedPool:
    """``pool`` as a BoundedPool (the same one when it is one already)."""
    if isinstance(pool, BoundedPool) and (timeout is None or timeout == pool.timeout):
        return pool
    return BoundedPool(pool, DEFAULT_DATABASE_TIMEOUT if timeout is None else timeout)


async def close_pool(pool: AppPool, timeout: float = 5.0) -> None:
    """Close a pool gracefully, or terminate it when its connections do not answer."""
    raw = pool.raw if isinstance(pool, BoundedPool) else pool
    try:
        await asyncio.wait_for(raw.close(), timeout)
    except Exception:
        raw.terminate()
