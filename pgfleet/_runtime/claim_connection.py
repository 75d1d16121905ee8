"""The claim loop's connection: taken from the application's pool, kept across
rounds, with the claim session's planner settings; dropped when it fails, given
back (session reset) when the loop ends. ``ClaimStore`` is every statement the
loop runs on it, so that a scripted fake can stand in for the database."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from pgfleet.db.deadlines import Held
from pgfleet.db.store import Store
from pgfleet.db.types import Record


class ClaimStore(Protocol):
    """The statements the claim loop runs (``Store``'s, on the held connection)."""

    async def job_complete_and_claim(
        self,
        *,
        ids: Sequence[uuid.UUID],
        tokens: Sequence[uuid.UUID | None],
        actions: Sequence[str],
        delays: Sequence[float],
        errors: Sequence[str | None],
        ran: Sequence[float | None],
        results: Sequence[str | None],
        worker_id: uuid.UUID,
        job_names: Sequence[str],
        queue_names: Sequence[str] | None,
        limit: int,
        start: int,
        started: Sequence[uuid.UUID],
        flow: bool = True,
    ) -> list[Record]: ...

    async def job_release_unknown(
        self, *, worker_id: uuid.UUID, known_ids: Sequence[uuid.UUID]
    ) -> int: ...

    async def claim_session_begin(self) -> None: ...

    async def claim_session_end(self) -> None: ...

    async def claim_transaction_begin(self) -> None: ...

    async def claim_transaction_commit(self) -> None: ...

    async def claim_transaction_rollback(self) -> None: ...


class ClaimConnection:
    """The one connection the claim loop holds (``held``, None between
    connections). Behind a transaction-mode pooler (``pooled``) every round runs in
    a transaction of its own that carries the planner settings (SET LOCAL); a direct
    connection has them on its session."""

    def __init__(
        self,
        pool: Any,  # the application's pool: held connections come from it directly
        *,
        pooled: bool,
        timeout: float,
        store: Callable[[Any], ClaimStore] = Store,
    ) -> None:
        self._pool = pool
        self._pooled = pooled
        self._timeout = timeout
        self._store = store
        self.held: Held | None = None

    @property
    def usable(self) -> bool:
        """Held and not closed."""
        return self.held is not None and not self.held.closed()

    def store(self) -> ClaimStore:
        assert self.held is not None
        return self._store(self.held.conn)

    async def open(self) -> None:
        """Take a connection from the pool and begin the claim session on it. Held
        as soon as it is taken: a failed session setup drops it like any round."""
        self.held = Held(await self._pool.acquire(timeout=self._timeout))
        if not self._pooled:
            await self.store().claim_session_begin()

    def drop(self) -> None:
        """Terminate the connection (its state unknown); its slot goes back."""
        if self.held is not None:
            self.held.drop()
            self.held = None

    def drop_if_closed(self) -> None:
        """Closed under us: make sure its slot goes back."""
        if self.held is not None and self.held.closed():
            self.drop()

    async def transact(
        self, statement: Callable[[ClaimStore], Awaitable[list[Record]]]
    ) -> list[Record]:
        """Run one round's ``statement``: in a transaction of its own behind a
        pooler, else as it is (the session has the settings)."""
        store = self.store()
        if not self._pooled:
            return await statement(store)
        await store.claim_transaction_begin()
        try:
            rows = await statement(store)
            await store.claim_transaction_commit()
        except Exception:
            assert self.held is not None
            conn = self.held.conn
            if not conn.is_closed() and conn.is_in_transaction():
                with contextlib.suppress(Exception):
                    await store.claim_transaction_rollback()
            raise
        return rows

    async def close(self, *, cut: bool) -> None:
        """The loop ends: end the session and give the connection back, or drop it
        when it was ``cut`` mid-round (flush timeout, cancellation: state unknown),
        is closed, or does not reset in time."""
        held, self.held = self.held, None
        if held is None:
            return
        if cut:
            held.drop()
        if held.closed():
            held.drop()
            return
        bound = min(self._timeout, 5.0)
        try:
            async with asyncio.timeout(bound):
                if not self._pooled:
                    await self._store(held.conn).claim_session_end()
        except BaseException:
            # Closed, not released: its session was not reset (and a live
            # connection kept out of the pool is one pool.close() waits for).
            held.drop()
        else:
            with contextlib.suppress(Exception):
                await held.release(self._pool, bound)
