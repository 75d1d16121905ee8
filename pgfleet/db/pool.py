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

from typing import Any

import asyncpg
import asyncpg.pool

from pgfleet.db.bounded import DEFAULT_DATABASE_TIMEOUT


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
