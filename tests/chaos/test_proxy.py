"""The chaos proxy does what each fault says, checked with a plain asyncpg client:
otherwise a scenario could pass because its fault never happened."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from tests.chaos.cluster import PrivateCluster
from tests.chaos.proxy import ChaosProxy

pytestmark = pytest.mark.slow


def test_proxy_faults(chaos_cluster: PrivateCluster) -> None:
    asyncio.run(_faults(chaos_cluster))


async def _faults(cluster: PrivateCluster) -> None:
    proxy = ChaosProxy(cluster.port)
    await proxy.start()
    dsn = cluster.dsn("postgres", port=proxy.port)
    try:
        conn = await asyncpg.connect(dsn)
        assert await conn.fetchval("SELECT 1") == 1

        # reset: the open connection dies with ECONNRESET, new ones are reset too
        assert proxy.reset_all() == 1
        with pytest.raises((ConnectionError, asyncpg.ConnectionDoesNotExistError)):
            await conn.fetchval("SELECT 1", timeout=5)
        conn.terminate()
        proxy.mode = "reset"
        with pytest.raises(ConnectionError):
            await asyncpg.connect(dsn, timeout=5)
        await proxy.heal()

        # partition: a query is held, then answered once healed
        conn = await asyncpg.connect(dsn)
        proxy.partition()
        query = asyncio.create_task(conn.fetchval("SELECT 2"))
        done, _ = await asyncio.wait({query}, timeout=1.5)
        assert not done, "a query went through a partition"
        await proxy.heal()
        assert await asyncio.wait_for(query, 10) == 2

        # hang: no answer, no close; healing lets new connections through only
        proxy.hang()
        with pytest.raises(TimeoutError):
            await conn.fetchval("SELECT 3", timeout=1.5)
        with pytest.raises(TimeoutError):
            await asyncpg.connect(dsn, timeout=1.5)
        await proxy.heal()
        fresh = await asyncpg.connect(dsn, timeout=10)
        assert await fresh.fetchval("SELECT 4") == 4
        assert proxy.open_links()[1] >= 1  # the hung one is still open...
        conn.terminate()
        deadline = time.monotonic() + 10
        while proxy.open_links()[1] and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert proxy.open_links() == (1, 0)  # ...until its client closes it
        await fresh.close()

        # refuse: connection refused, then accepted again on the same port
        port = proxy.port
        await proxy.refuse()
        with pytest.raises(ConnectionRefusedError):
            await asyncpg.connect(dsn, timeout=5)
        await proxy.heal()
        assert proxy.port == port
        conn = await asyncpg.connect(dsn, timeout=10)
        assert await conn.fetchval("SELECT 5") == 5
        await conn.close()
    finally:
        await proxy.close()
