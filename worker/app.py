"""Jobs of the reference fleet, by name (``pgfleet worker --app worker.app:registry``).

- ``noop``: does nothing (throughput and pickup-latency measurements).
- ``sleep``: awaits ``{"ms": N}`` milliseconds (I/O-bound work).
- ``cpu``: burns ``{"ms": N}`` milliseconds of CPU in a worker thread.
- ``fail``: always fails permanently (dead-job alerts and dashboards).
- ``flaky``: fails its first ``{"failures": k}`` attempts, then succeeds (retries).
- ``send_email``: idempotent, since delivery is at-least-once: it records its effect
  under a unique key *before* "sending", so a re-run after a crash never sends twice.
- ``prune_sessions``: an infallible maintenance job run by the ``crons`` schedule.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pgfleet import CronJob, Job, PermanentError, Registry

log = logging.getLogger("worker.app")

registry = Registry()
_pool: Any = None

_SCHEMA = """
CREATE SCHEMA IF NOT EXISTS fleet;
CREATE TABLE IF NOT EXISTS fleet.sent_emails (
    idempotency_key text PRIMARY KEY,
    job_id          uuid        NOT NULL,
    address         text        NOT NULL,
    sent_at         timestamptz NOT NULL DEFAULT now()
);
"""


@registry.on_startup
async def _startup(pool: Any) -> None:
    global _pool
    _pool = pool
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('fleet.schema'))")
        await conn.execute(_SCHEMA)


@dataclass
class Millis:
    ms: int = 0


@dataclass
class Flaky:
    failures: int = 1


@dataclass
class SendEmail:
    address: str
    template: str = "welcome"
    key: str | None = None


@registry.job("noop")
async def noop(job: Job) -> None:
    return None


@registry.job("sleep")
async def sleep(job: Job, payload: Millis) -> None:
    await asyncio.sleep(payload.ms / 1000)


@registry.job("cpu")
def cpu(job: Job, payload: Millis) -> None:
    deadline = time.perf_counter() + payload.ms / 1000
    x = 0
    while time.perf_counter() < deadline:
        x = (x * 31 + 7) % 1_000_003


@registry.job("fail")
async def fail(job: Job) -> None:
    raise PermanentError("the fail job always fails")


@registry.job("flaky")
async def flaky(job: Job, payload: Flaky) -> None:
    if job.attempt <= payload.failures:
        raise RuntimeError(f"flaky: transient failure on attempt {job.attempt}")


@registry.job("send_email")
async def send_email(job: Job, payload: SendEmail) -> None:
    key = payload.key or f"{payload.template}:{payload.address}"
    inserted = await _pool.fetchval(
        "INSERT INTO fleet.sent_emails (idempotency_key, job_id, address) VALUES ($1, $2, $3) "
        "ON CONFLICT (idempotency_key) DO NOTHING RETURNING true",
        key,
        job.id,
        payload.address,
    )
    if not inserted:
        # The key holds the address (from the payload): personal data stays out of logs.
        log.info("job %s: email already sent; not sending again", job.id)
        return
    # Here a real service would call the mail provider, passing `key` as its
    # idempotency key. The effect was recorded first: a crash from here on means
    # at most a missed send, never a duplicate (see docs/design/delivery.md).


@registry.job("prune_sessions", infallible=True)
async def prune_sessions(job: Job) -> None:
    await _pool.execute("DELETE FROM fleet.sent_emails WHERE sent_at < now() - interval '7 days'")


crons = [
    CronJob.interval("prune-sent-emails", "prune_sessions", timedelta(minutes=10)),
]
