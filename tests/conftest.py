"""Test harness: a real PostgreSQL, a migrated template, one database per test.

Every async test runs twice, on the default asyncio loop and on uvloop (acceptance
and fleet tests, which drive real processes, only on the default loop). A test fails
on any exception that reaches the event loop's exception handler.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests import pgharness

new_uvloop: Callable[[], asyncio.AbstractEventLoop] | None
try:
    from uvloop import new_event_loop as new_uvloop
except ImportError:  # pragma: no cover - uvloop is a dev dependency
    new_uvloop = None


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Callable[[], Any]]:
    factories: dict[str, Callable[[], Any]] = {"asyncio": asyncio.new_event_loop}
    # Tests that drive real processes (acceptance/, fleet/) run on the default loop only.
    only_default = (
        Path(str(getattr(item, "path", ""))).parent.name in ("acceptance", "fleet", "kubernetes")
        or os.environ.get("PGFLEET_TEST_LOOPS") == "asyncio"
    )
    if new_uvloop is not None and not only_default:
        factories["uvloop"] = new_uvloop
    return factories


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pgharness.Server]:
    server = pgharness.find_server()
    try:
        asyncio.run(pgharness.create_template(server))
        yield server
    finally:
        asyncio.run(pgharness.drop_template(server))
        server.close()


@pytest.fixture
async def database(pg_server: pgharness.Server) -> AsyncIterator[str]:
    """The DSN of a fresh, migrated database that only this test uses."""
    name = await pgharness.create_database(pg_server)
    try:
        yield pg_server.dsn_for(name)
    finally:
        await pgharness.drop_database(pg_server, name)


@pytest.fixture
async def pool(database: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(database, min_size=1, max_size=10)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture(autouse=True)
async def _fail_on_loop_errors() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield
    loop.set_exception_handler(previous)
    if errors:
        pytest.fail(f"unhandled exceptions in the event loop: {errors}")
