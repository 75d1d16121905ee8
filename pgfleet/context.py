"""What a running handler can ask about its worker, without passing parameters.

The values travel in context variables, so they work across awaits in the handler
and inside sync handlers running in the worker's threads. Outside a job they are
inert: ``is_shutting_down()`` is False, ``worker_started_at()`` is None and
``shutdown_requested()`` never resolves. Tasks a handler spawns itself inherit a
copy of the context at creation.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from pgfleet.jobs import Job


@dataclass(frozen=True, slots=True)
class WorkerState:
    """Shared by every job of one worker."""

    started_at: datetime
    shutting_down: threading.Event
    shutdown_future: asyncio.Future[None]
    #: Ids of the running jobs someone asked to cancel (read from handler
    #: threads too: set membership needs no lock).
    cancelled: set[UUID] = field(default_factory=set)


_worker: contextvars.ContextVar[WorkerState | None] = contextvars.ContextVar(
    "pgfleet_worker", default=None
)
_job: contextvars.ContextVar[Job | None] = contextvars.ContextVar("pgfleet_job", default=None)


def is_shutting_down() -> bool:
    """True once the worker running the current job has begun shutting down."""
    state = _worker.get()
    return state is not None and state.shutting_down.is_set()


async def shutdown_requested() -> None:
    """Resolve when the worker running the current job begins shutting down."""
    state = _worker.get()
    if state is None:
        await asyncio.get_running_loop().create_future()  # inert: never resolves
        return
    await asyncio.shield(state.shutdown_future)


def worker_started_at() -> datetime | None:
    """When the worker running the current job started (database clock)."""
    state = _worker.get()
    return None if state is None else state.started_at


def current_job() -> Job | None:
    """The job whose handler is running in this context, if any."""
    return _job.get()


def cancel_requested() -> bool:
    """True once someone asked to cancel the current job (``Queue.cancel`` on a
    running job). An async handler is cancelled after the worker's
    ``cancel_grace_period``; a sync handler should poll this and stop. Once it is
    true, whatever the handler returns or raises ends the job cancelled."""
    state = _worker.get()
    if state is None or not state.cancelled:
        return False
    job = _job.get()
    return job is not None and job.id in state.cancelled


def enter_job(state: WorkerState, job: Job) -> None:
    """Set the context of a job's task (called at the top of the task)."""
    _worker.set(state)
    _job.set(job)


# ---------------------------------------------------------------- logging


_installed = False


def install_log_record_factory() -> None:
    """Make every log record carry ``pgfleet_job_name``, ``pgfleet_job_id`` and
    ``pgfleet_job_attempt``.

    Records emitted inside a handler (by any logger) get the current job's values;
    others get None, so formatters may always reference them. The prefix keeps
    them clear of an application's own ``extra={"job_id": ...}``. Idempotent, and
    it chains to whatever factory was installed before.
    """
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        job = _job.get()
        if job is None:
            record.pgfleet_job_name = record.pgfleet_job_id = record.pgfleet_job_attempt = None
        else:
            record.pgfleet_job_name = job.name
            record.pgfleet_job_id = str(job.id)
            record.pgfleet_job_attempt = job.attempt
        return record

    logging.setLogRecordFactory(factory)
    _installed = True
