"""The shapes of what pgfleet runs SQL on, as structural types.

An application hands pgfleet an asyncpg pool (ours from ``create_pool``, its own, or
a ``BoundedPool`` around either) or one of its connections; these protocols name
the part of asyncpg's API the data layer uses, so that each of those type-checks
without a common base class (asyncpg has none).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from asyncpg import Record
from asyncpg.transaction import Transaction

__all__ = ["Connection", "Executor", "Pool", "Record"]


class Executor(Protocol):
    """Anything that runs a statement: a pool or a connection."""

    async def execute(self, query: str, *args: object) -> str: ...

    async def fetch(self, query: str, *args: object) -> list[Record]: ...

    async def fetchrow(self, query: str, *args: object) -> Record | None: ...

    async def fetchval(self, query: str, *args: object) -> Any: ...


class Connection(Executor, Protocol):
    """One connection: statements on it can share a transaction."""

    def transaction(self) -> Transaction: ...

    def is_in_transaction(self) -> bool: ...

    def is_closed(self) -> bool: ...


class Pool(Executor, Protocol):
    """A pool: each statement on a connection of its own, or one held for several."""

    def acquire(self) -> AbstractAsyncContextManager[Connection]: ...
