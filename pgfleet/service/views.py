"""JSON views of jobs and workers, shared by the HTTP jobs API and ``pgfleet jobs``.

A job view is flat: ``status`` next to the fields that state has. It never carries
the payload (payloads may hold personal data or secrets); callers that may see it
add it explicitly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgfleet.jobs import BatchProgress, Job, JobStatus, Relative, WorkerInfo
from pgfleet.limits import Limit, Paused

#: States in which ``last_error`` describes the job: it failed for good, or it is
#: between attempts (queued) or on a later attempt (running) after a failure.
_ERROR_STATES = (JobStatus.FAILED, JobStatus.QUEUED, JobStatus.RUNNING)


def timestamp(value: datetime | None) -> str | None:
    """RFC 3339 with its offset (the database returns UTC)."""
    return None if value is None else value.isoformat()


def job_view(job: Job) -> dict[str, Any]:
    """The status record of a job: id, name, status, attempts and timestamps, plus
    ``error``, ``started_at``, ``finished_at``, ``queue_name``, ``job_key``,
    ``limit_key``, ``worker_id``, ``result`` (a succeeded job's return value), ``errors`` (each
    failed attempt's, oldest first) and ``errors_omitted``, ``snoozes``,
    ``cancel_requested_at`` and ``cancelled_by`` only when the job has them."""
    view: dict[str, Any] = {
        "id": str(job.id),
        "name": job.name,
        "status": job.status.value,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "priority": job.priority,
        "run_at": timestamp(job.run_at),
        "created_at": timestamp(job.created_at),
    }
    optional = {
        "started_at": timestamp(job.started_at),
        "finished_at": timestamp(job.finished_at),
        "queue_name": job.queue_name,
        "job_key": job.job_key,
        "limit_key": job.limit_key,
        "error": job.last_error if job.status in _ERROR_STATES else None,
        "worker_id": str(job.worker_id)
        if job.worker_id is not None and job.status is JobStatus.RUNNING
        else None,
        "result": job.result if job.status is JobStatus.SUCCEEDED else None,
        "errors": [
            {
                "at": timestamp(e.at),
                "attempt": e.attempt,
                "error": e.error,
                "worker_id": None if e.worker_id is None else str(e.worker_id),
            }
            for e in job.errors
        ]
        or None,
        "errors_omitted": job.errors_omitted or None,
        "snoozes": job.snoozes or None,
        "cancel_requested_at": timestamp(job.cancel_requested_at),
        "cancelled_by": job.cancelled_by,
    }
    view.update((key, value) for key, value in optional.items() if value is not None)
    return view


def relative_view(relative: Relative) -> dict[str, Any]:
    """A parent or child of a job: its id, name (None once pruned), status, and
    whether the child runs whatever the parent's outcome."""
    return {
        "id": str(relative.id),
        "name": relative.name,
        "status": relative.status.value,
        "run_anyway": relative.run_anyway,
        "batch": relative.batch,
    }


def batch_view(progress: BatchProgress) -> dict[str, Any]:
    """A batch's progress: members by outcome, pending, and its callback's status."""
    return {
        "id": str(progress.id),
        "size": progress.size,
        "succeeded": progress.succeeded,
        "failed": progress.failed,
        "cancelled": progress.cancelled,
        "pending": progress.pending,
        "callback_status": progress.callback_status.value,
    }


def worker_view(worker: WorkerInfo) -> dict[str, Any]:
    return {
        "id": str(worker.id),
        "hostname": worker.hostname,
        "pid": worker.pid,
        "alive": worker.alive,
        "is_leader": worker.is_leader,
        "concurrency": worker.concurrency,
        "running_jobs": worker.running_jobs,
        "job_names": list(worker.job_names),
        "queue_names": None if worker.queue_names is None else list(worker.queue_names),
        "version": worker.version,
        "started_at": timestamp(worker.started_at),
        "heartbeat_at": timestamp(worker.heartbeat_at),
        "expires_at": timestamp(worker.expires_at),
    }


def limit_view(limit: Limit, waiting: dict[str, int] | None = None) -> dict[str, Any]:
    """A job name's flow control; ``waiting``: its due jobs held back, by reason."""
    view: dict[str, Any] = {
        "name": limit.name,
        "concurrency": limit.concurrency,
        "rate": limit.rate,
        "per": limit.per,
        "per_key": limit.per_key,
        "source": limit.source,
        "paused": limit.paused,
        "paused_at": timestamp(limit.paused_at),
        "updated_at": timestamp(limit.updated_at),
    }
    if waiting is not None:
        view["waiting"] = waiting
    return view


def paused_view(paused: Paused) -> dict[str, Any]:
    return {"kind": paused.kind, "name": paused.name, "paused_at": timestamp(paused.paused_at)}
