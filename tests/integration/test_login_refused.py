"""A database or role that does not exist is a configuration to fix, not an outage:
the library says so with DatabaseRefused (a DatabaseUnavailable), naming the server,
instead of the driver's exception or a retry loop that cannot end."""

from __future__ import annotations

import pytest

import pgfleet
from pgfleet import (
    DatabaseRefused,
    DatabaseUnavailable,
    Job,
    Queue,
    Registry,
    Worker,
    WorkerConfig,
)
from pgfleet.db.connect import server_of
from tests import pgharness


async def test_enqueue_on_a_missing_database_raises_database_refused(
    pg_server: pgharness.Server,
) -> None:
    pool = await pgfleet.create_pool(pg_server.dsn_for("pgfleet_no_such_database"), min_size=0)
    try:
        with pytest.raises(DatabaseRefused, match="does not exist") as caught:
            await Queue(pool).enqueue("x", None)
        assert isinstance(caught.value, DatabaseUnavailable), "callers that retry still catch it"
    finally:
        await pool.close()


async def test_a_worker_stops_at_once_naming_the_server(pg_server: pgharness.Server) -> None:
    dsn = pg_server.dsn_for("pgfleet_no_such_database")
    pool = await pgfleet.create_pool(dsn, min_size=0, max_size=4)
    registry = Registry()

    @registry.job("x")
    async def x(job: Job) -> None: ...

    try:
        with pytest.raises(DatabaseRefused) as caught:
            await Worker(pool, registry, WorkerConfig()).run(burst=True)
        assert f"at {pool.server}:" in str(caught.value)
        assert 'database "pgfleet_no_such_database" does not exist' in str(caught.value)
    finally:
        await pool.close()


def test_the_pool_names_its_server_without_credentials() -> None:
    assert server_of("postgresql://u:secret@db.example:6432/app", {}) == "db.example:6432"
    assert server_of("postgresql:///app?host=/run/postgresql", {}) == "/run/postgresql:5432"
    assert server_of("postgresql://db/app", {"port": 5433}) == "db:5433"
