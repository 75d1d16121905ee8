"""The LISTEN connection: wakes claim loops on notifications and reconnects forever.

Notifications only affect latency. While the listener is down the claim loop keeps
polling; after every reconnect it wakes the claim loop to catch up on anything
announced during the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from pgfleet.db import CHANNEL, Q

log = logging.getLogger("pgfleet")

RECONNECT_BASE = 0.25
RECONNECT_CAP = 30.0
KEEPALIVE_INTERVAL = 15.0
KEEPALIVE_TIMEOUT = 10.0


class Listener:
    def __init__(self, pool: Any, wake: Callable[[str], None]) -> None:
        self._pool = pool
        self._wake = wake
        self.connected = asyncio.Event()
        self.connections = 0
        #: Called with the connection count after every successful (re)connection.
        self.on_connect: list[Callable[[int], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self.backend_pid: int | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="pgfleet-listener")

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task

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
                    exc,
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
        conn = await self._pool.acquire()
        lost = asyncio.Event()
        broken = False
        try:
            conn.add_termination_listener(lambda _c: lost.set())
            self.backend_pid = conn.get_server_pid()
            await conn.add_listener(CHANNEL, self._on_notification)
            self.connections += 1
            self.connected.set()
            for callback in self.on_connect:
                callback(self.connections)
            if self.connections > 1:
                log.info("notification listener reconnected")
                self._wake("reconnect")
            broken = not await self._hold(conn, lost)
            if broken:
                raise ConnectionError("listener connection closed")
        except BaseException:
            broken = True
            raise
        finally:
            await self._release(conn, broken or lost.is_set())

    async def _hold(self, conn: Any, lost: asyncio.Event) -> bool:
        """Keep the connection until stop (True) or until it is lost (False)."""
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
            if lost.is_set() or conn.is_closed():
                return False
            if not done:
                # A silent network drop closes nothing: ask the server.
                await asyncio.wait_for(conn.fetchval(Q.ping.sql), KEEPALIVE_TIMEOUT)
        return True

    async def _release(self, conn: Any, broken: bool) -> None:
        if broken or conn.is_closed():
            conn.terminate()
            with contextlib.suppress(Exception):
                await self._pool.release(conn)
            return
        with contextlib.suppress(Exception):
            await conn.remove_listener(CHANNEL, self._on_notification)
        await self._pool.release(conn)
