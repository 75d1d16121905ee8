"""A worker application for the console's browser tests.

``charge_card`` fails for good until the test "fixes" the processor by inserting a
row in ``public.console_fixes``; every run that got through is recorded in
``public.console_runs`` with the pid of the worker process that ran it.
"""

from __future__ import annotations

import os
from typing import Any

import asyncpg

from pgfleet import CronJob, DailySchedule, Job, PermanentError, Registry

registry = Registry()
_pool: asyncpg.Pool | None = None

SCHEMA = """
CREATE TABLE IF NOT EXISTS public.console_fixes (kind text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS public.console_runs (
    job_id uuid NOT NULL, name text NOT NULL, pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

#: What the failing processor says: markup, to show that errors render as text.
REFUSAL = "card processor refused: <script>window.__pwned = 'error'</script>"


@registry.on_startup
async def _startup(pool: asyncpg.Pool) -> None:
    global _pool
    _pool = pool
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(4243)")
        await conn.execute(SCHEMA)


async def _ran(job: Job) -> None:
    assert _pool is not None
    await _pool.execute(
        "INSERT INTO public.console_runs (job_id, name, pid) VALUES ($1, $2, $3)",
        job.id,
        job.name,
        os.getpid(),
    )


@registry.job("charge_card")
async def charge_card(job: Job, payload: Any) -> None:
    assert _pool is not None
    fixed = await _pool.fetchval(
        "SELECT count(*) FROM public.console_fixes WHERE kind = $1", job.name
    )
    if not fixed:
        raise PermanentError(REFUSAL)
    await _ran(job)


@registry.job("send_email")
async def send_email(job: Job, payload: Any) -> None:
    await _ran(job)


crons = [
    CronJob.daily_in_timezone("nightly-report", "send_email", DailySchedule(3, 30), "Europe/Paris"),
    CronJob.interval("digest", "send_email", 3600).catch_up_on_start(),
]
