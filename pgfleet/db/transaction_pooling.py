"""Running behind a connection pooler in transaction mode (PgBouncer and the like).

In transaction mode every transaction may run on a different server connection, so
pgfleet keeps nothing on the session there: no named prepared statements (asyncpg's
statement cache is off), no SET outside a transaction, no LISTEN on the pooled
connections. LISTEN needs a connection of its own, direct or through a session-mode
pool; without one, workers find jobs by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from pgfleet.db.connect import create_pool
from pgfleet.db.deadlines import close_pool
from pgfleet.errors import MigrationError

log = logging.getLogger("pgfleet")

_BACKEND_PID = "SELECT pg_backend_pid()"


class LazyPool:
    """A pool of one connection to ``dsn``, opened on first use: the listener's own
    connection when LISTEN goes around a transaction-mode pooler."""

    def __init__(self, dsn: str, **kwargs: Any) -> None:
        self.dsn = dsn
        self._kwargs = kwargs
        self._pool: Any = None
        self._opening: asyncio.Lock | None = None

    async def _get(self) -> Any:
        if self._pool is None:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._pool is None:
                    self._pool = await create_pool(self.dsn, min_size=0, max_size=1, **self._kwargs)
        return self._pool

    async def acquire(self, *, timeout: float | None = None) -> Any:
        return await (await self._get()).acquire(timeout=timeout)

    async def release(self, conn: Any, *, timeout: float | None = None) -> None:
        if self._pool is not None:
            await self._pool.release(conn, timeout=timeout)

    def get_max_size(self) -> int:
        return 1

    async def close(self, timeout: float = 5.0) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await close_pool(pool, timeout)


async def behind_pooler(conn: Any) -> bool:
    """Whether ``conn`` reaches the server through a pooler: the backend key the
    connection was given at start-up is not the server process it talks to (a
    pooler hands clients keys of its own)."""
    pid = await conn.fetchval(_BACKEND_PID)
    return bool(conn.get_server_pid() != pid)


async def transaction_pooled(
    first: Any, second: Any, *, timeout: float = 5.0, rounds: int = 3
) -> bool:
    """Whether two client connections to the same place go through a pooler in
    transaction (or statement) mode.

    The first asks which server process it is on and goes idle; the second opens
    a transaction and asks the same. In session mode the first one's server stays
    bound to it, so the second can never be given it; in transaction mode it is
    free again and the pooler hands it out next (PgBouncer reuses the most recently
    released server first). Seeing the same server twice is proof; a busy pool can
    hide it, so the probe runs a few rounds. A pooler refusing BEGIN (statement
    mode) counts as transaction pooling."""
    import asyncpg

    # A named prepared statement that vanished, or met one of another client's, is
    # proof by itself that statements change server connections.
    moved = (asyncpg.InvalidSQLStatementNameError, asyncpg.DuplicatePreparedStatementError)
    try:
        if not await behind_pooler(first):
            return False
        for _ in range(rounds):
            async with asyncio.timeout(timeout):
                mine = await first.fetchval(_BACKEND_PID)
            try:
                async with asyncio.timeout(timeout), second.transaction():
                    other = await second.fetchval(_BACKEND_PID)
            except TimeoutError:
                # The only server is bound to the first client: session mode, pool of one.
                return False
            if other == mine:
                return True
        return False
    except moved:
        return True
    except asyncpg.PostgresError as exc:
        text = str(exc)
        if "statement mode" in text or "transaction blocks" in text:
            return True
        raise


async def dsn_transaction_pooled(dsn: str, first: Any, *, timeout: float = 5.0) -> bool:
    """:func:`transaction_pooled` for ``first``, a connection to ``dsn``: a second
    connection is opened only when ``first`` goes through a pooler."""
    import asyncpg

    if not await behind_pooler(first):
        return False
    second = await asyncpg.connect(dsn, timeout=timeout, statement_cache_size=0)
    try:
        return await transaction_pooled(first, second, timeout=timeout)
    finally:
        with contextlib.suppress(Exception):
            await second.close(timeout=timeout)


def refuse_migrations(where: str) -> MigrationError:
    return MigrationError(
        f"pgfleet migrations need a direct or session-mode connection, and {where} goes "
        "through a pooler in transaction mode: the migration takes an advisory lock and "
        "runs DDL that must not be cut off by the pooler's query timeouts or wait behind "
        "the workers' queue for a server connection. Run `pgfleet migrate` (or "
        "pgfleet.migrate) with the database's own address or a session-mode pool."
    )


def connection_budget(
    *, pool_size: int, listener: str, metrics: bool, processes: int = 1
) -> tuple[int, str]:
    """The most connections one ``pgfleet worker`` invocation holds, and how."""
    own_listener = 1 if listener == "own" else 0
    per_process = pool_size + own_listener
    parts = [f"pool {pool_size} (claim loop, heartbeat, maintenance, handlers"]
    parts[0] += ", metrics)" if metrics else ")"
    if listener == "own":
        parts.append("listener 1 (--listen-dsn)")
    elif listener == "pool":
        parts.append("listener 0 (one of the pool's)")
    else:
        parts.append("listener 0 (polling)")
    text = f"{per_process} per process: " + ", ".join(parts)
    if processes > 1:
        text += f"; {processes} processes: {per_process * processes}"
    return per_process * processes, text
