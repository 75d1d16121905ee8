"""Helpers for testing code that uses pgfleet.

- :func:`run_job` calls a registered handler directly, with its payload encoded and
  decoded exactly as a worker would, without a database.
- :func:`drain` runs a real worker in this process against your database until no
  runnable job is left, and returns what it did.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from pgfleet import _ids, context
from pgfleet._runtime.outcomes import RunStats
from pgfleet.errors import InvalidOptions, UnknownJobName
from pgfleet.jobs import Job, JobStatus, validate_name
from pgfleet.payloads import encode_payload
from pgfleet.queue import Queue
from pgfleet.registry import Registry
from pgfleet.worker import Worker, WorkerConfig

if TYPE_CHECKING:
    from pgfleet.db.deadlines import AppPool

__all__ = ["RunStats", "drain", "make_job", "run_job"]


def make_job(
    name: str,
    payload: Any = None,
    *,
    attempt: int = 1,
    max_attempts: int = 25,
    queue_name: str | None = None,
    job_key: str | None = None,
    priority: int = 0,
) -> Job:
    """A running Job as a handler would receive it (payload round-tripped through JSON)."""
    validate_name(name)
    now = dt.datetime.now(dt.UTC)
    return Job(
        id=_ids.uuid7(),
        name=name,
        payload=json.loads(encode_payload(payload)),
        status=JobStatus.RUNNING,
        attempt=attempt,
        max_attempts=max_attempts,
        priority=priority,
        queue_name=queue_name,
        job_key=job_key,
        run_at=now,
        created_at=now,
        started_at=now,
        finished_at=None,
        last_error=None,
        worker_id=None,
        lock_token=uuid.uuid4(),
    )


async def run_job(registry: Registry, name: str, payload: Any = None, **job_fields: Any) -> Any:
    """Run the handler registered for ``name`` once and return its result.

    Exceptions propagate as they would into the worker (a PayloadDecodeError when
    the payload does not fit the handler's annotation). Sync handlers run inline.
    """
    handler = registry.get(name)
    if handler is None:
        raise UnknownJobName(f"no handler is registered for job name {name!r}")
    job = make_job(name, payload, **job_fields)
    decoded = handler.decode(job.payload) if handler.takes_payload else None
    token = context._job.set(job)
    try:
        result = handler.call(job, decoded)
        if handler.is_async:
            result = await result
        return result
    finally:
        context._job.reset(token)


async def drain(
    pool: AppPool,
    registry: Registry,
    config: WorkerConfig | None = None,
    **config_fields: Any,
) -> RunStats:
    """Run a worker in this process until no runnable job is left; return its stats.

    Jobs scheduled for later (delays, retry backoffs) are not waited for: they show
    up as ``retried`` and stay queued.
    """
    if config is not None and config_fields:
        raise InvalidOptions("pass a WorkerConfig or config fields, not both")
    cfg = config or WorkerConfig(**config_fields)
    total = await Worker(pool, registry, cfg).run(burst=True)
    # A burst ends on a round that claimed nothing; the jobs that round's last
    # outcomes released from waiting (dependents, a batch's callback) are due now.
    queue = Queue(pool)
    more = total
    while more.claimed and any(
        (await queue.runnable_backlog_by_name(registry.names(), at_most=1)).values()
    ):
        more = await Worker(pool, registry, cfg).run(burst=True)
        for f in fields(RunStats):
            if f.name == "by_name":
                for name, per in more.by_name.items():
                    mine = total.by_name.setdefault(name, {})
                    for outcome, n in per.items():
                        mine[outcome] = mine.get(outcome, 0) + n
            else:
                setattr(total, f.name, getattr(total, f.name) + getattr(more, f.name))
    return total
