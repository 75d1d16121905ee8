"""Finds a PostgreSQL server for the test run and hands out one database per test.

Order: $PGFLEET_TEST_DSN; a server answering on 127.0.0.1:5432; testcontainers when
a Docker engine answers; an embedded server from the ``pgserver`` wheel. A template
database is migrated once per run and every test gets a copy of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class Server:
    admin_dsn: str
    source: str
    template: str = ""
    _counter: Any = field(default_factory=lambda: itertools.count(1))
    _cleanup: list[Any] = field(default_factory=list)

    def dsn_for(self, database: str) -> str:
        return with_database(self.admin_dsn, database)

    def next_name(self) -> str:
        return f"pgfleet_t{os.getpid()}_{next(self._counter)}"

    def close(self) -> None:
        for fn in reversed(self._cleanup):
            with contextlib.suppress(Exception):
                fn()


def with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


def _port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


async def _can_connect(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except Exception:
        return False
    await conn.close()
    return True


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        result = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def find_server() -> Server:
    explicit = os.environ.get("PGFLEET_TEST_DSN")
    if explicit:
        return Server(explicit, "PGFLEET_TEST_DSN")
    if _port_answers("127.0.0.1", 5432):
        for dsn in (
            LOCAL_DSN,
            f"postgresql://{os.environ.get('USER', 'postgres')}@127.0.0.1:5432/postgres",
        ):
            if asyncio.run(_can_connect(dsn)):
                return Server(dsn, "local server on 127.0.0.1:5432")
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        container = PostgresContainer("postgres:15.8-alpine", driver=None)
        container.start()
        server = Server(container.get_connection_url(), "testcontainers postgres:15.8-alpine")
        server._cleanup.append(container.stop)
        return server
    try:
        from pgserver.postgres_server import get_server
    except ImportError:
        raise RuntimeError(
            "no PostgreSQL for the tests: set PGFLEET_TEST_DSN, run a server on "
            "127.0.0.1:5432, start Docker, or `pip install pgserver`"
        ) from None
    data = tempfile.mkdtemp(prefix="pgfleet-pgdata-")
    embedded = get_server(data, cleanup_mode="stop")
    server = Server(embedded.get_uri(), "embedded pgserver")
    server._cleanup.append(lambda: shutil.rmtree(data, ignore_errors=True))
    server._cleanup.append(embedded.cleanup)
    return server


async def create_template(server: Server) -> None:
    """Create and migrate this run's template database."""
    from pgfleet import migrate

    name = f"pgfleet_tpl{os.getpid()}"
    admin = await asyncpg.connect(server.admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await asyncpg.connect(server.dsn_for(name))
    try:
        await migrate(conn)
    finally:
        await conn.close()
    server.template = name


async def create_database(server: Server) -> str:
    name = server.next_name()
    admin = await asyncpg.connect(server.admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{server.template}"')
    finally:
        await admin.close()
    return name


async def drop_database(server: Server, name: str) -> None:
    admin = await asyncpg.connect(server.admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def drop_template(server: Server) -> None:
    if server.template:
        await drop_database(server, server.template)
