"""Finds a PostgreSQL server for the test run and hands out one database per test.

Finding the server is the development kit's (tools/devkit/postgres.py), in its
order: $PGFLEET_TEST_DSN; a server answering on 127.0.0.1:5432; testcontainers when
a Docker engine answers; an embedded server from the ``pgserver`` wheel. A template
database is migrated once per run and every test gets a copy of it.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from tools.devkit import postgres as kit
from tools.devkit.postgres import LOCAL_DSN, with_database

__all__ = [
    "LOCAL_DSN",
    "Server",
    "create_database",
    "create_template",
    "drop_database",
    "drop_template",
    "find_server",
    "with_database",
]


@dataclass
class Server(kit.Server):
    """The kit's server plus this run's template database and database names."""

    template: str = ""
    _counter: Any = field(default_factory=lambda: itertools.count(1))

    def next_name(self) -> str:
        return f"pgfleet_t{os.getpid()}_{next(self._counter)}"


def find_server() -> Server:
    found = kit.find_postgres_sync(("PGFLEET_TEST_DSN",))
    return Server(found.admin_dsn, found.source, found.pid, found._cleanup)


async def create_template(server: Server) -> None:
    """Create and migrate this run's template database."""
    name = f"pgfleet_tpl{os.getpid()}"
    await kit.fresh_database(server.admin_dsn, name)
    server.template = name


async def create_database(server: Server) -> str:
    name = server.next_name()
    await kit.create_database(server.admin_dsn, name, template=server.template)
    return name


async def drop_database(server: Server, name: str) -> None:
    await kit.drop_database(server.admin_dsn, name)


async def drop_template(server: Server) -> None:
    if server.template:
        await drop_database(server, server.template)
