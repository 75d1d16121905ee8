"""The test harness's last resort: an embedded PostgreSQL from the pgserver wheel, for
machines with no server, no PGFLEET_TEST_DSN and no Docker."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from tests import pgharness
from tools.devkit import postgres as kit


@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_embedded_server_when_nothing_else_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pgserver", reason="the embedded extra is not installed")
    monkeypatch.delenv("PGFLEET_TEST_DSN", raising=False)
    monkeypatch.setattr(kit, "port_answers", lambda host, port: False)
    monkeypatch.setattr(kit, "docker_answers", lambda: False)
    server = await asyncio.to_thread(pgharness.find_server)
    try:
        assert server.source == "embedded pgserver"
        await pgharness.create_template(server)
        name = await pgharness.create_database(server)
        conn = await asyncpg.connect(server.dsn_for(name))
        try:
            versions = await conn.fetchval("SELECT count(*) FROM pgfleet.schema_migrations")
            assert versions >= 2  # the template was migrated and copied
        finally:
            await conn.close()
        await pgharness.drop_database(server, name)
        await pgharness.drop_template(server)
    finally:
        await asyncio.to_thread(server.close)
