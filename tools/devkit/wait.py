"""Waiting on something another process does: poll with a deadline.

Only for crossing a process boundary, where there is no event to wait on; never
for ordering inside one process (use an event, a future or a queue there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def until(
    check: Callable[[], Awaitable[T | None]],
    timeout: float = 60.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
) -> T:
    """Await ``check()`` every ``interval`` seconds until it returns something
    truthy, and return that; TimeoutError naming ``what`` after ``timeout``.
    An exception from ``check`` ends the wait (use it to fail fast, say when the
    process being waited on exited)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(interval)


def until_sync(
    check: Callable[[], Any],
    timeout: float = 60.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
) -> Any:
    """:func:`until` for code without an event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
