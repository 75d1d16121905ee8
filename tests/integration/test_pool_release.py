"""pgfleet.create_pool's release: a clean connection goes back at once, anything
else (an open transaction, listeners, a cancelled query) still takes asyncpg's path."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from pgfleet import create_pool
from pgfleet.db.connect import Pool


@pytest.fixture
async def one(database: str) -> AsyncIterator[Pool]:
    p = await create_pool(database, min_size=1, max_size=1)
    try:
        yield p
    finally:
        await p.close()


async def test_clean_connection_is_back_when_the_call_returns(one: Pool) -> None:
    pid = await one.fetchval("SELECT pg_backend_pid()")
    assert one.get_idle_size() == 1
    for _ in range(3):
        await one.execute("SELECT 1")
        assert one.get_idle_size() == 1
    assert await one.fetchval("SELECT pg_backend_pid()") == pid


async def test_open_transaction_is_still_rolled_back(one: Pool) -> None:
    await one.execute("CREATE TABLE t (i int)")
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    seen: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        conn = await one.acquire()
        await conn.execute("BEGIN; INSERT INTO t VALUES (1)")
        await one.release(conn)
    finally:
        loop.set_exception_handler(previous)
    assert any("active transaction" in c["message"] for c in seen)  # asyncpg's path
    async with one.acquire() as again:
        assert not again.is_in_transaction()
        assert await again.fetchval("SELECT count(*) FROM t") == 0


async def test_a_connection_with_listeners_takes_asyncpgs_path(one: Pool) -> None:
    def listener(*_: object) -> None:
        pass

    conn = await one.acquire()
    await conn.add_listener("somewhere", listener)
    # asyncpg's path warns and drops the listener (the server-side LISTEN stays:
    # create_pool skips the reset query, as before).
    with pytest.warns(asyncpg.InterfaceWarning, match="notification listener"):
        await one.release(conn)
    assert await one.fetchval("SELECT 1") == 1


async def test_a_cancelled_query_leaves_a_working_pool(one: Pool) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await one.execute("SELECT pg_sleep(30)", timeout=0.05)
    assert await one.fetchval("SELECT 1") == 1
    assert one.get_idle_size() == 1


def test_this_asyncpg_has_the_internals_the_quick_release_relies_on() -> None:
    # Without them every release silently takes asyncpg's slower path:
    # `make test-asyncpg-range` runs this against both ends of the supported range.
    from pgfleet.db import connect

    assert connect._FAST_RELEASE
