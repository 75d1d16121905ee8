"""Revoked credential names, as every ``pgfleet api`` replica agrees on them.

``pgfleet credentials revoke NAME`` commits the name to ``pgfleet.revoked_credentials``
and notifies the channel ``pgfleet_credentials`` in the same transaction. Each
replica keeps the list in memory and listens on that channel: a notification
marks the list stale at once and reloads it. While the list is stale (listener
down, reconnecting, a reload in flight, or never loaded: behind a
transaction-mode PgBouncer LISTEN cannot work), every check asks the database
instead, so a revoked name is never accepted for want of a notification.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from pgfleet.db.access import CREDENTIALS_CHANNEL
from pgfleet.db.deadlines import AppPool, BoundedPool, Held
from pgfleet.db.store import Store

log = logging.getLogger("pgfleet")

RECONNECT_BASE = 0.5
RECONNECT_CAP = 30.0
KEEPALIVE = 15.0


class Revocations:
    def __init__(self, pool: AppPool, *, timeout: float = 5.0, listen: bool = True) -> None:
        self._pool = pool
        self._store = Store(BoundedPool(pool, timeout))
        self._timeout = timeout
        self._listen = listen
        self._names: frozenset[str] = frozenset()
        #: True while the list in memory is known to be current.
        self.current = False
        self._generation = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._changed = asyncio.Event()
        self.reloads = 0

    async def revoked(self, name: str) -> bool:
        """Whether ``name`` is revoked, from memory while the list is current, else
        from the database (which raises DatabaseUnavailable when it does not answer)."""
        if self.current:
            return name in self._names
        return await self._store.revocation_check(name=name)

    def start(self) -> None:
        if self._listen:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="pgfleet-revocations"
            )

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None

    def _on_notification(self, *_args: Any) -> None:
        # Stale from this instant: checks ask the database until the reload lands.
        self.current = False
        self._generation += 1
        self._changed.set()

    async def _run(self) -> None:
        delay = RECONNECT_BASE
        while not self._stopping.is_set():
            try:
                await self._listen_once()
                delay = RECONNECT_BASE
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning(
                    "revocation listener lost (%s); checking revocations in the database "
                    "per request meanwhile, reconnecting in %.1fs",
                    str(exc) or type(exc).__name__,
                    delay,
                )
            self.current = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, RECONNECT_CAP)

    async def _listen_once(self) -> None:
        async with asyncio.timeout(self._timeout):
            pool: Any = self._pool
            held = Held(await pool.acquire())
        conn = held.conn
        lost = asyncio.Event()
        conn.add_termination_listener(lambda _c: lost.set())
        try:
            async with asyncio.timeout(self._timeout):
                await conn.add_listener(CREDENTIALS_CHANNEL, self._on_notification)
            self._changed.set()  # load once listening: nothing can slip between
            while not lost.is_set():
                if self._changed.is_set():
                    self._changed.clear()
                    await self._reload(conn)
                    continue
                waiters = {
                    asyncio.ensure_future(self._changed.wait()),
                    asyncio.ensure_future(lost.wait()),
                }
                done, pending = await asyncio.wait(
                    waiters, timeout=KEEPALIVE, return_when=asyncio.FIRST_COMPLETED
                )
                for waiter in pending:
                    waiter.cancel()
                if not done and not lost.is_set():
                    async with asyncio.timeout(self._timeout):
                        await Store(conn).ping()
            raise ConnectionError("connection closed")
        finally:
            self.current = False
            held.drop()

    async def _reload(self, conn: Any) -> None:
        generation = self._generation
        async with asyncio.timeout(self._timeout):
            names = frozenset(r.name for r in await Store(conn).revocation_list())
        self._names = names
        self.reloads += 1
        # Current only if no notification came while the list was read.
        self.current = generation == self._generation
        if not self.current:
            self._changed.set()
