"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import asyncpg

from pgfleet.db import CHANNEL


async def put_in_state(
    pool: asyncpg.Pool,
    job_id: uuid.UUID,
    status: str,
    *,
    worker_id: uuid.UUID | None = None,
    attempt: int | None = None,
    finished_ago_s: float = 0.0,
) -> None:
    """Move a job to a status the way a worker would leave it (for management tests)."""
    running = status == "running"
    finished = status in ("succeeded", "failed", "cancelled")
    await pool.execute(
        """
        UPDATE pgfleet.jobs SET status = $2::pgfleet.job_status,
            attempt = COALESCE($5, CASE WHEN $2 = 'queued' THEN attempt ELSE greatest(attempt, 1) END),
            locked_by = CASE WHEN $3 THEN $4::uuid END,
            lock_token = CASE WHEN $3 THEN gen_random_uuid() END,
            started_at = CASE WHEN $2 <> 'queued' THEN now() END,
            finished_at = CASE WHEN $6 THEN now() - make_interval(secs => $7) END,
            last_error = CASE WHEN $2 = 'failed' THEN 'boom' END
        WHERE id = $1
        """,
        job_id,
        status,
        running,
        worker_id or uuid.uuid4(),
        attempt,
        finished,
        finished_ago_s,
    )


async def register_worker(pool: asyncpg.Pool, worker_id: uuid.UUID, *, alive: bool = True) -> None:
    await pool.execute(
        """
        INSERT INTO pgfleet.workers (id, hostname, pid, concurrency, job_names, version, expires_at)
        VALUES ($1, 'test-host', 4242, 4, ARRAY['x'], 'test',
                now() + CASE WHEN $2 THEN interval '1 hour' ELSE interval '-1 hour' END)
        """,
        worker_id,
        alive,
    )


async def job_count(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM pgfleet.jobs"))


class Listener:
    """A LISTEN connection on the pgfleet channel that counts notifications."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.received: asyncio.Queue[str] = asyncio.Queue()

    def _on(self, *_args: Any) -> None:
        self.received.put_nowait(_args[-1])

    async def next(self, timeout: float = 10.0) -> str:
        return await asyncio.wait_for(self.received.get(), timeout)

    def drain(self) -> int:
        n = 0
        while not self.received.empty():
            self.received.get_nowait()
            n += 1
        return n


@asynccontextmanager
async def listening(dsn: str) -> AsyncIterator[Listener]:
    conn = await asyncpg.connect(dsn)
    listener = Listener(conn)
    await conn.add_listener(CHANNEL, listener._on)
    try:
        yield listener
    finally:
        await conn.close()


async def notifications_before_marker(listener: Listener, pool: asyncpg.Pool) -> int:
    """Commit a marker notification and count the notifications that arrive before it.

    Notifications are delivered in commit order, so everything the code under test
    committed earlier is counted, with no sleeping and no guessing at delays.
    """
    marker = f"marker-{uuid.uuid4()}"
    await pool.execute("SELECT pg_notify($1, $2)", CHANNEL, marker)
    seen = 0
    while True:
        payload = await listener.next()
        if payload == marker:
            return seen
        seen += 1


class Gate:
    """A TCP port in front of Postgres that drops every connection until opened:
    a database that does not answer yet, then does."""

    def __init__(self, dsn: str) -> None:
        url = urlsplit(dsn)
        query = parse_qs(url.query)
        socket_dir = query.pop("host", [""])[0]  # the embedded server: a unix socket
        self._unix = f"{socket_dir}/.s.PGSQL.{url.port or 5432}" if not url.hostname else None
        self._target = (url.hostname or "127.0.0.1", url.port or 5432)
        self._url = url._replace(query=urlencode(query, doseq=True))
        self.opened = False
        self.refused = 0
        self._refusal = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        """Listen on a free port; returns the DSN that goes through the gate."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = int(self._server.sockets[0].getsockname()[1])
        credentials, at, _ = self._url.netloc.rpartition("@")
        return urlunsplit(self._url._replace(netloc=f"{credentials}{at}127.0.0.1:{port}"))

    async def refusals(self, n: int) -> None:
        while self.refused < n:
            self._refusal.clear()
            await self._refusal.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.opened:
            self.refused += 1
            self._refusal.set()
            writer.close()
            return
        if self._unix is not None:
            up_reader, up_writer = await asyncio.open_unix_connection(self._unix)
        else:
            up_reader, up_writer = await asyncio.open_connection(*self._target)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
