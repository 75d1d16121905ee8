"""The LISTEN connection: wakes claim loops on notifications and reconnects forever.

Notifications only affect latency. While the listener is down the claim loop keeps
polling; after every reconnect it wakes the claim loop to catch up on anything
announced during the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pgfleet.db import CHANNEL
from pgfleet.db.deadlines import DEFAULT_DATABASE_TIMEOUT, Held
from pgfleet.db.store import Store

log = logging.getLogger("pgfleet")

RECONNECT_BASE = 0.25
RECONNECT_CAP = 30.0
KEEPALIVE_INTERVAL = 15.0
KEEPALIVE_TIMEOUT = 10.0


class Listener:
    """``wake(source)`` on each notification of the jobs channel and after every
    reconnect; ``channels`` maps further channels to a callback of each payload
    (the jobs channel's own callback, given there, replaces the wake). Without
    ``jobs_channel`` it listens to ``channels`` only."""

    def __init__(
        self,
        pool: Any,
        wake: Callable[[str], None],
        *,
        timeout: float = DEFAULT_DATABASE_TIMEOUT,
        channels: Mapping[str, Callable[[str], None]] | None = None,
        jobs_channel: bool = True,
    ) -> None:
        self._pool = pool
        self._wake = wake
        self._channels: dict[str, Callable[..., None]] = (
            {CHANNEL: self._on_notification} if jobs_channel else {}
        )
        for channel, callback in (channels or {}).items():
            self._channels[channel] = _payload_of(callback)
        self._timeout = timeout
        self.connected = asyncio.Event()
        self.connections = 0
        #: Called with the connection count after every successful (re)connection.
        self.on_connect: list[Callable[[int], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.backend_pid: int | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pgfleet-listener")

    async def stop(self, wait: float = 3.0) -> None:
        """Stop listening; a connection that does not let go within ``wait``
        seconds (a ping or reconnect in progress) is cut."""
        self._stopping.set()
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=wait)
        if not done:
            task.cancel()
            await asyncio.wait({task})

    def _on_notification(self, *_args: Any) -> None:
        self._wake("notify")

    async def _run(self) -> None:
        delay = RECONNECT_BASE
        while not self._stopping.is_set():
            try:
                await self._listen_once()
                delay = RECONNECT_BASE
            except Exception as exc:
                if self._stopping.is_set():
                    return
                log.warning(
                    "notification listener lost (%s); reconnecting in %.2fs, polling meanwhile",
                    str(exc) or f"{type(exc).__name__}: no answer within {self._timeout:g}s",
                    delay,
                )
            self.connected.clear()
            self.backend_pid = None
            if self._stopping.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            delay = min(delay * 2, RECONNECT_CAP)

    async def _listen_once(self) -> None:
        async with asyncio.timeout(self._timeout):
            held = Held(await self._pool.acquire(timeout=self._timeout))
        conn = held.conn
        lost = asyncio.Event()
        broken = False
        try:
            conn.add_termination_listener(lambda _c: lost.set())
            self.backend_pid = conn.get_server_pid()
            async with asyncio.timeout(self._timeout):
                for channel, callback in self._channels.items():
                    await conn.add_listener(channel, callback)
            self.connections += 1
            self.connected.set()
            for callback in self.on_connect:
                callback(self.connections)
            if self.connections > 1:
                log.info("notification listener reconnected")
                self._wake("reconnect")
            broken = not await self._hold(held, lost)
            if broken:
                raise ConnectionError("listener connection closed")
        except BaseException:
            broken = True
            raise
        finally:
            await self._release(held, broken or lost.is_set())

    async def _hold(self, held: Held, lost: asyncio.Event) -> bool:
        """Keep the connection until stop (True) or until it is lost (False)."""
        conn = held.conn
        while not self._stopping.is_set():
            waiters = [
                asyncio.ensure_future(lost.wait()),
                asyncio.ensure_future(self._stopping.wait()),
            ]
            done, pending = await asyncio.wait(
                waiters, timeout=KEEPALIVE_INTERVAL, return_when=asyncio.FIRST_COMPLETED
            )
            for w in pending:
                w.cancel()
            if lost.is_set() or held.closed():
                return False
            if not done:
                # A silent network drop closes nothing: ask the server.
                try:
                    await asyncio.wait_for(
                        Store(conn).ping(), min(KEEPALIVE_TIMEOUT, self._timeout)
                    )
                except TimeoutError:
                    raise ConnectionError(
                        "listener connection did not answer a ping within "
                        f"{min(KEEPALIVE_TIMEOUT, self._timeout):g}s"
                    ) from None
        return True

    async def _release(self, held: Held, broken: bool) -> None:
        """Hand the connection back, or drop it. A connection that closed under us
        was already returned to the pool by asyncpg: its proxy is not touched."""
        if broken or held.closed():
            held.drop()
            return
        try:
            async with asyncio.timeout(min(self._timeout, 5.0)):
                for channel, callback in self._channels.items():
                    await held.conn.remove_listener(channel, callback)
        except BaseException:
            held.drop()
            return
        with contextlib.suppress(Exception):
            await held.release(self._pool, min(self._timeout, 5.0))


def _payload_of(callback: Callable[[str], None]) -> Callable[..., None]:
    """An asyncpg listener callback (connection, pid, channel, payload) that hands
    ``callback`` the payload; an exception in it is logged, never raised into the
    driver."""

    def on_notification(_conn: Any, _pid: int, channel: str, payload: str) -> None:
        try:
            callback(payload)
        except Exception:
            log.exception("handling a notification on %s failed", channel)

    return on_notification
