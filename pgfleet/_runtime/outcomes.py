"""What a handler's attempt produced, on its way to the database, and the tally
of what was written."""

from __future__ import annotations

from dataclasses import dataclass, field

from pgfleet.jobs import Job

#: What the database does with an attempt (the ``action`` column of the claim
#: round's outcome list): the job succeeded, failed for good, is retried later, or is handed
#: back at shutdown without its attempt counted; snoozed (back later, its attempt
#: not counted) or cancelled (someone asked while it ran).
ACTIONS = ("succeeded", "failed", "retry", "aborted", "snooze", "cancelled")


class Outcome:
    """A finished attempt waiting to be written by the next claim round."""

    __slots__ = (
        "action", "delay", "duration", "error", "job", "label", "resent", "result", "started",
    )  # fmt: skip

    def __init__(
        self,
        job: Job,
        action: str,
        label: str,
        duration: float,
        delay: float = 0.0,
        error: str | None = None,
        result: str | None = None,
    ) -> None:
        self.job = job
        #: A succeeded handler's return value as JSON text (None: it returned None).
        self.result = result
        #: What the database does: one of ACTIONS.
        self.action = action
        #: What the events report: succeeded / retried / failed / aborted, or
        #: released (never started: counted in RunStats only).
        self.label = label
        self.duration = duration
        self.delay = delay
        self.error = error
        #: Carried by a round whose answer was lost: it may already be applied.
        self.resent = False
        #: When the handler started (``time.perf_counter()``), for a job started
        #: from the hold: its claim left ``started_at`` empty.
        self.started: float | None = None

    @classmethod
    def aborted(cls, job: Job, duration: float = 0.0) -> Outcome:
        """Handed back at shutdown: requeued in place, its attempt not counted."""
        return cls(job, "aborted", "aborted", duration)

    @classmethod
    def released(cls, job: Job) -> Outcome:
        """Claimed ahead and never started (held past its time, or at shutdown):
        requeued in place like an aborted attempt, but no attempt ever ran, so no
        ``job_finished`` event reports it."""
        return cls(job, "aborted", "released", 0.0)


@dataclass
class RunStats:
    """What one ``Worker.run`` did, by outcome (as written to the database)."""

    claimed: int = 0
    succeeded: int = 0
    retried: int = 0
    snoozed: int = 0
    failed: int = 0
    aborted: int = 0
    #: Claimed ahead of a free slot and handed back unstarted (see ``prefetch``).
    released: int = 0
    cancelled: int = 0
    rescued: int = 0
    by_name: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, name: str, outcome: str) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        per = self.by_name.setdefault(name, {})
        per[outcome] = per.get(outcome, 0) + 1
