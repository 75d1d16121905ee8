"""A worker application for the runtime tests: every handler records what it did
in ``public.executions`` so tests count effects in the database, not in memory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

import asyncpg

import pgfleet
from pgfleet import Job, PermanentError, Registry

registry = Registry()
_pool: asyncpg.Pool | None = None

SCHEMA = """
CREATE TABLE IF NOT EXISTS public.executions (
    job_id      uuid        NOT NULL,
    name        text        NOT NULL,
    attempt     integer     NOT NULL,
    pid         integer     NOT NULL,
    worker_id   uuid,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    seq         bigserial
);
"""


async def ensure_schema(pool: Any) -> None:
    # Several workers start at once: serialise the IF NOT EXISTS.
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(4242)")
        await conn.execute(SCHEMA)


@registry.on_startup
async def _startup(pool: asyncpg.Pool) -> None:
    global _pool
    _pool = pool
    await ensure_schema(pool)


def pool() -> asyncpg.Pool:
    assert _pool is not None, "the worker has not started"
    return _pool


async def _start(job: Job) -> int:
    return int(
        await pool().fetchval(
            "INSERT INTO public.executions (job_id, name, attempt, pid, worker_id) "
            "VALUES ($1, $2, $3, $4, $5) RETURNING seq",
            job.id,
            job.name,
            job.attempt,
            os.getpid(),
            job.worker_id,
        )
    )


async def _finish(seq: int) -> None:
    await pool().execute(
        "UPDATE public.executions SET finished_at = clock_timestamp() WHERE seq = $1", seq
    )


@registry.job("record")
async def record(job: Job, payload: Any) -> None:
    await _finish(await _start(job))


@registry.job("serial")
async def serial(job: Job, payload: dict[str, int]) -> None:
    seq = await _start(job)
    await asyncio.sleep(payload.get("ms", 5) / 1000)
    await _finish(seq)


@registry.job("long")
async def long(job: Job, payload: dict[str, Any]) -> None:
    """Runs for payload['s'] seconds (or until shutdown when payload['polite'])."""
    seq = await _start(job)
    if payload.get("polite"):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pgfleet.shutdown_requested(), payload["s"])
    else:
        await asyncio.sleep(payload["s"])
    await _finish(seq)


@registry.job("kill_worker")
async def kill_worker(job: Job, payload: Any) -> None:
    """A poison job: takes its worker process down on every attempt."""
    await _start(job)
    os.kill(os.getpid(), signal.SIGKILL)


@registry.job("fail")
async def fail(job: Job, payload: Any) -> None:
    await _start(job)
    raise PermanentError("this job always fails")


@registry.job("flaky")
async def flaky(job: Job, payload: dict[str, int]) -> None:
    await _start(job)
    if job.attempt <= payload.get("failures", 1):
        raise RuntimeError(f"transient failure on attempt {job.attempt}")


@registry.job("echo")
async def echo(job: Job, payload: Any) -> Any:
    """Returns its payload: the job's result."""
    return payload


@registry.job("sync_record")
def sync_record(job: Job, payload: Any) -> None:
    time.sleep(0.001)
    asyncio.run_coroutine_threadsafe(_finish_sync(job), _loop).result()


_loop: asyncio.AbstractEventLoop


@registry.on_startup
async def _remember_loop(_pool: Any) -> None:
    global _loop
    _loop = asyncio.get_running_loop()


async def _finish_sync(job: Job) -> None:
    await _finish(await _start(job))
