"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

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
