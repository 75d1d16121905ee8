"""Runtime events. The library emits them; the service turns them into metrics.

Every hook is called synchronously on the event loop from the runtime's hot path,
so implementations must be cheap and must never block (no I/O). The default
implementation does nothing.
"""

from __future__ import annotations

from pgfleet.jobs import Job

#: Outcomes of a job attempt as ``job_finished`` reports them.
OUTCOMES = ("succeeded", "retried", "snoozed", "failed", "aborted", "cancelled")

#: Why a claim loop woke up.
WAKE_SOURCES = ("notify", "poll", "completion", "reconnect", "start")


class WorkerEvents:
    """Override the hooks you need."""

    def job_started(self, job: Job, pickup_delay: float) -> None:
        """A job was claimed and its handler is starting. ``pickup_delay`` is the
        claim time minus the time it became due, in seconds (database clock)."""

    def jobs_claimed(self, count: int) -> None:
        """A claim round took ``count`` jobs; their handlers start next (each
        reports ``job_started``)."""

    def job_finished(self, job: Job, outcome: str, duration: float) -> None:
        """An attempt's outcome was written. ``outcome`` is one of OUTCOMES:
        ``cancelled`` means the job was taken away while running (rescued,
        completed or failed by an operator) and the handler's outcome was discarded,
        or someone cancelled it while it ran; ``snoozed`` that the handler asked
        to run again later without using an attempt;
        ``aborted`` means it was stopped at shutdown and requeued."""

    def wakeup(self, source: str) -> None:
        """A claim loop woke up; ``source`` is one of WAKE_SOURCES."""

    def jobs_rescued(self, count: int) -> None:
        """This worker, as leader, recovered ``count`` jobs from dead workers."""

    def leader_changed(self, is_leader: bool) -> None:
        """This worker gained or lost the fleet leadership."""
