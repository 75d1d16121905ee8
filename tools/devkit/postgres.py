"""Finding a PostgreSQL server and making throwaway databases on it.

One order everywhere (tests, load tests, benchmarks, the native fleet), each caller
choosing which steps apply: a URL from the environment; a server answering on
127.0.0.1:5432; a testcontainers server when a Docker engine answers; an embedded
server from the ``pgserver`` wheel (the ``embedded`` extra).

Database names cannot travel as query parameters: every name is checked against
:data:`DB_NAME` and quoted before it reaches a ``CREATE``/``DROP DATABASE``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
#: The names this kit creates and drops: lower-case, at most 63 bytes.
DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
TESTCONTAINERS_IMAGE = "postgres:15.8-alpine"


class NoPostgres(RuntimeError):
    """None of the allowed ways found a server; the message says what to do."""


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database on the same server."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + database, parts.query, parts.fragment))


def redact(dsn: str) -> str:
    """A connection string without its password, for printing."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def quoted(name: str) -> str:
    """A database name for DDL, after checking it against :data:`DB_NAME`."""
    if not DB_NAME.fullmatch(name):
        raise ValueError(
            f"database name {name!r} must be lower-case letters, digits and _ "
            f"(at most 63, not starting with a digit)"
        )
    return f'"{name}"'


@dataclass
class Server:
    """A server this process may create databases on, and how it was found."""

    admin_dsn: str
    source: str
    #: The postmaster's pid when this process started the server (embedded), else None.
    pid: int | None = None
    _cleanup: list[Callable[[], Any]] = field(default_factory=list)

    def dsn_for(self, database: str) -> str:
        return with_database(self.admin_dsn, database)

    def close(self) -> None:
        """Stop what finding the server started (a container, an embedded server)."""
        for fn in reversed(self._cleanup):
            with contextlib.suppress(Exception):
                fn()
        self._cleanup.clear()


def port_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


async def connects(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except Exception:
        return False
    await conn.close()
    return True


def docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        result = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _local_candidates() -> list[str]:
    user = os.environ.get("USER", "postgres")
    return list(dict.fromkeys([LOCAL_DSN, f"postgresql://{user}@127.0.0.1:5432/postgres"]))


def _testcontainers() -> Server:
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-untyped,unused-ignore]

    container = PostgresContainer(TESTCONTAINERS_IMAGE, driver=None)
    container.start()
    server = Server(container.get_connection_url(), f"testcontainers {TESTCONTAINERS_IMAGE}")
    server._cleanup.append(container.stop)
    return server


def _import_pgserver() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR
        import pgserver  # type: ignore[import-untyped,unused-ignore]
    return pgserver


def embedded(pgdata: Path | None = None) -> Server:
    """A pgserver PostgreSQL. In ``pgdata`` (kept: its data outlives the server), or
    in a temporary directory removed by :meth:`Server.close`. Blocks while the
    server boots; ImportError without the ``embedded`` extra."""
    pgserver = _import_pgserver()
    keep = pgdata is not None
    data = pgdata if pgdata is not None else Path(tempfile.mkdtemp(prefix="pgfleet-pgdata-"))
    data.parent.mkdir(parents=True, exist_ok=True)
    handle = pgserver.get_server(data, cleanup_mode="stop")
    server = Server(str(handle.get_uri()), "embedded pgserver", pid=handle.get_pid())
    if not keep:
        server._cleanup.append(lambda: shutil.rmtree(data, ignore_errors=True))
    server._cleanup.append(handle.cleanup)
    return server


async def find_postgres(
    env: Sequence[str] = ("PGFLEET_TEST_DSN",),
    *,
    local: bool = True,
    docker: bool = True,
    embedded_ok: bool = True,
) -> Server:
    """The first server found, in the kit's order: the first of the ``env``
    variables that is set; then (``local``) 127.0.0.1:5432 as postgres or $USER;
    then (``docker``) testcontainers; then (``embedded_ok``) an embedded pgserver.
    Raises :class:`NoPostgres` saying what would have worked."""
    for name in env:
        given = os.environ.get(name)
        if given:
            return Server(given, name)
    if local and await asyncio.to_thread(port_answers, "127.0.0.1", 5432):
        for dsn in _local_candidates():
            if await connects(dsn):
                return Server(dsn, "local server on 127.0.0.1:5432")
    if docker and await asyncio.to_thread(docker_answers):
        return await asyncio.to_thread(_testcontainers)
    ways = [f"set {' or '.join(env)}"] if env else []
    ways += ["run a server on 127.0.0.1:5432"] if local else []
    ways += ["start Docker"] if docker else []
    if embedded_ok:
        try:
            return await asyncio.to_thread(embedded)
        except ImportError:
            ways.append("install the embedded extra (pip install 'pgfleet[embedded]')")
    raise NoPostgres("no PostgreSQL found: " + ", or ".join(ways))


def find_postgres_sync(env: Sequence[str] = ("PGFLEET_TEST_DSN",), **options: bool) -> Server:
    """:func:`find_postgres` outside an event loop (a pytest session fixture)."""
    return asyncio.run(find_postgres(env, **options))


# ---------------------------------------------------------------- throwaway databases


async def create_database(admin_dsn: str, name: str, *, template: str | None = None) -> str:
    """Create ``name`` (a copy of ``template`` when given); return its DSN."""
    ddl = f"CREATE DATABASE {quoted(name)}"
    if template is not None:
        ddl += f" TEMPLATE {quoted(template)}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(ddl)
    finally:
        await admin.close()
    return with_database(admin_dsn, name)


async def drop_database(admin_dsn: str, name: str) -> None:
    """Drop ``name`` if it exists, disconnecting whoever is still on it."""
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {quoted(name)} WITH (FORCE)")
    finally:
        await admin.close()


async def fresh_database(admin_dsn: str, name: str, *, migrate: bool = True) -> str:
    """Drop and create ``name``, apply pgfleet's migrations (unless ``migrate`` is
    False), return its DSN."""
    quoted(name)
    await drop_database(admin_dsn, name)
    dsn = await create_database(admin_dsn, name)
    if migrate:
        import pgfleet

        conn = await asyncpg.connect(dsn)
        try:
            await pgfleet.migrate(conn)
        finally:
            await conn.close()
    return dsn
