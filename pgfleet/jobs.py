"""Value types of the public API. No I/O here."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from pgfleet.errors import InvalidName, InvalidOptions

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
MAX_JOB_KEY_LENGTH = 512
MAX_ATTEMPTS_LIMIT = 1000
PRIORITY_MIN, PRIORITY_MAX = -32768, 32767
#: Jobs due within this many seconds wake the workers when enqueued.
SOON = 60.0
#: Delays beyond this are refused as absurd (about 100 years).
MAX_DELAY_SECONDS = 100 * 365.25 * 86400
#: Parents one job may wait on (a batch's callback waits on its members: no limit).
MAX_PARENTS = 1000

_valid_names: set[str] = set()


def validate_name(value: object, what: str = "job name") -> str:
    """Return ``value`` if it is a valid job/queue/cron name, else raise InvalidName."""
    if not isinstance(value, str):
        raise InvalidName(f"{what} must be a string, got {type(value).__name__}")
    if value in _valid_names:
        return value
    if NAME_PATTERN.fullmatch(value) is None:
        shown = value if len(value) <= 40 else value[:40] + "…"
        raise InvalidName(
            f"invalid {what} {shown!r}: use 1-128 letters, digits, '_', '-', '.' or ':'"
        )
    if len(_valid_names) < 10_000:
        _valid_names.add(value)
    return value


class JobStatus(enum.StrEnum):
    """Where a job is in its life. ``failed`` is the dead state: kept for a person."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: Enqueued with ``after``: waits until its parents finished, outside every
    #: claim path, then becomes ``queued`` (or ``cancelled`` with its parent).
    WAITING = "waiting"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)

    @classmethod
    def parse(cls, value: object) -> JobStatus:
        """Accept a JobStatus or its string value; anything else is a clear error."""
        if isinstance(value, JobStatus):
            return value
        try:
            if not isinstance(value, str):
                raise ValueError(value)
            return cls(value)
        except ValueError:
            allowed = ", ".join(s.value for s in cls)
            raise InvalidOptions(
                f"unknown job status {value!r}: expected one of {allowed}"
            ) from None


class JobKeyMode(enum.StrEnum):
    """What an enqueue does when its job_key is held by a queued or running job.

    A running job is never modified by any mode.
    """

    #: Keep the existing job unchanged and return its id.
    DEDUPE = "dedupe"
    #: Overwrite the queued job, run_at included: the timer restarts (debounce).
    REPLACE = "replace"
    #: Overwrite the queued job's payload and options but keep its run_at.
    PRESERVE_RUN_AT = "preserve_run_at"


class NotifyMode(enum.StrEnum):
    """How enqueues wake workers. Notifications only affect latency, never whether
    a job runs: every idle worker also polls.

    The producers that write on the caller's connection (psycopg, SQLAlchemy,
    Django) notify within the caller's transaction in both ``COALESCED`` and
    ``TRANSACTION`` modes, as ``Queue`` does inside a caller's transaction."""

    #: Default. At most one notifying statement per queue is in flight at a time,
    #: so producers never queue on Postgres' commit-time notification lock: a
    #: single enqueue that finds none in flight carries its NOTIFY in its own insert
    #: (one round trip, one commit); enqueues that overlap it commit without one,
    #: and one coalesced NOTIFY per burst follows them from a separate statement.
    #: An enqueue inside the caller's transaction notifies within that transaction.
    COALESCED = "coalesced"
    #: Every enqueue transaction carries its own NOTIFY (at most one per transaction).
    TRANSACTION = "transaction"
    #: No notifications: workers find jobs by polling.
    OFF = "off"


@dataclass(frozen=True, slots=True)
class EnqueueOptions:
    """How and when a job runs. Every field is checked at construction."""

    run_at: datetime | None = None
    delay: timedelta | float | None = None
    priority: int = 0
    max_attempts: int | None = None
    queue_name: str | None = None
    job_key: str | None = None
    job_key_mode: JobKeyMode = JobKeyMode.DEDUPE
    #: The key flow control counts the job under (a tenant, an account): limits
    #: set with ``per_key`` apply to each key, and a name's keys take turns.
    limit_key: str | None = None
    #: Parents: the job waits (status ``waiting``) until every one of them
    #: succeeded, then is due in the transaction that finished the last one. Job ids
    #: (UUID or its text), or, in :meth:`~pgfleet.Queue.enqueue_many`, the index of
    #: a request of the same batch. A parent that fails or is cancelled cancels the
    #: job (and the jobs waiting on it), unless ``run_anyway``.
    #: Any sequence is accepted; it is kept as a tuple of UUIDs and ints.
    after: Sequence[UUID | int | str] = ()
    #: Run once every parent finished, whatever their outcome.
    run_anyway: bool = False

    def __post_init__(self) -> None:  # noqa: C901 - a flat list of independent option checks
        if self.after or self.run_anyway:
            self._check_after()
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime):
                raise InvalidOptions(f"run_at must be a datetime, got {type(self.run_at).__name__}")
            if self.run_at.tzinfo is None or self.run_at.utcoffset() is None:
                raise InvalidOptions(
                    "run_at must be timezone-aware (a naive datetime is ambiguous); "
                    "use datetime.now(timezone.utc) or attach a tzinfo"
                )
            if self.delay is not None:
                raise InvalidOptions("give run_at or delay, not both")
        if self.delay is not None:
            seconds = self.delay_seconds
            if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DELAY_SECONDS:
                raise InvalidOptions(f"delay must be between 0 and 100 years, got {self.delay!r}")
        if not _is_int(self.priority) or not PRIORITY_MIN <= self.priority <= PRIORITY_MAX:
            raise InvalidOptions(
                f"priority must be an integer in [{PRIORITY_MIN}, {PRIORITY_MAX}], "
                f"got {self.priority!r}"
            )
        if self.max_attempts is not None and (
            not _is_int(self.max_attempts) or not 1 <= self.max_attempts <= MAX_ATTEMPTS_LIMIT
        ):
            raise InvalidOptions(
                f"max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT} (it counts "
                f"the first attempt), got {self.max_attempts!r}"
            )
        if self.queue_name is not None:
            validate_name(self.queue_name, "queue name")
        if self.job_key is not None:
            key = self.job_key
            if not isinstance(key, str) or not 1 <= len(key) <= MAX_JOB_KEY_LENGTH:
                raise InvalidOptions(
                    f"job_key must be a string of 1 to {MAX_JOB_KEY_LENGTH} characters"
                )
            if "\x00" in key:
                raise InvalidOptions("job_key must not contain NUL characters")
        if self.limit_key is not None:
            key = self.limit_key
            if not isinstance(key, str) or not 1 <= len(key) <= MAX_JOB_KEY_LENGTH:
                raise InvalidOptions(
                    f"limit_key must be a string of 1 to {MAX_JOB_KEY_LENGTH} characters"
                )
            if "\x00" in key:
                raise InvalidOptions("limit_key must not contain NUL characters")
        if not isinstance(self.job_key_mode, JobKeyMode):
            try:
                object.__setattr__(self, "job_key_mode", JobKeyMode(self.job_key_mode))
            except ValueError:
                allowed = ", ".join(m.value for m in JobKeyMode)
                raise InvalidOptions(
                    f"unknown job_key_mode {self.job_key_mode!r}: expected one of {allowed}"
                ) from None

    def _check_after(self) -> None:
        after = self.after
        if isinstance(after, str | bytes | UUID | int) or not hasattr(after, "__iter__"):
            after = (after,)  # type: ignore[assignment]
        parents: dict[UUID | int, None] = {}
        for item in after:
            if isinstance(item, UUID):
                parent: UUID | int = item
            elif isinstance(item, str):
                try:
                    parent = UUID(item)
                except ValueError:
                    raise InvalidOptions(f"after: {item!r} is not a job id") from None
            elif isinstance(item, int) and not isinstance(item, bool) and item >= 0:
                parent = item
            else:
                raise InvalidOptions(
                    "after takes job ids (UUID) or indexes of requests of the same batch, "
                    f"got {item!r}"
                )
            parents[parent] = None
        if len(parents) > MAX_PARENTS:
            raise InvalidOptions(f"after names {len(parents)} jobs; at most {MAX_PARENTS}")
        object.__setattr__(self, "after", tuple(parents))
        if not isinstance(self.run_anyway, bool):
            raise InvalidOptions(f"run_anyway must be a boolean, got {self.run_anyway!r}")
        if self.run_anyway and not parents:
            raise InvalidOptions("run_anyway needs after: the parents it runs after")
        if parents and self.job_key is not None:
            raise InvalidOptions(
                "a job with after cannot have a job_key: a waiting job holds no key"
            )

    @property
    def delay_seconds(self) -> float:
        delay = self.delay
        if delay is None:
            return 0.0
        if isinstance(delay, timedelta):
            return delay.total_seconds()
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise InvalidOptions(
                f"delay must be a timedelta or seconds, got {type(delay).__name__}"
            )
        return float(delay)

    @property
    def runs_now(self) -> bool:
        """True unless the job waits for parents (their completion makes it due) or
        is scheduled more than ``SOON`` seconds ahead: the enqueue wakes the workers,
        which then learn when it is due and start it on time (a job due later is
        found by their idle checks)."""
        if self.after:
            return False
        if self.run_at is None:
            return self.delay_seconds <= SOON
        return (self.run_at - datetime.now(UTC)).total_seconds() <= SOON


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


DEFAULT_OPTIONS = EnqueueOptions()


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """One job of a batch for :meth:`pgfleet.Queue.enqueue_many`."""

    name: str
    payload: Any = None
    options: EnqueueOptions = DEFAULT_OPTIONS


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """Where a batch stands (:meth:`pgfleet.Queue.batch_progress`). A batch's id is
    its callback job's id."""

    id: UUID
    #: Jobs in the batch.
    size: int
    succeeded: int
    failed: int
    cancelled: int
    #: Members not finished yet.
    pending: int
    #: The callback's status: ``waiting`` until every member finished.
    callback_status: JobStatus

    @property
    def finished(self) -> bool:
        """Every member finished (the callback is due or done)."""
        return self.pending == 0


@dataclass(frozen=True, slots=True)
class Relative:
    """A parent or a child of a job (``job_parents``, ``job_children``)."""

    id: UUID
    #: None: a parent pruned since it finished.
    name: str | None
    status: JobStatus
    #: The child runs whatever this parent's outcome.
    run_anyway: bool
    #: The edge of a batch member to its callback.
    batch: bool


@dataclass(frozen=True, slots=True)
class AttemptError:
    """One failed attempt of a job, as :attr:`Job.errors` keeps it."""

    #: When the attempt failed (database clock).
    at: datetime
    #: Which attempt (1 is the first).
    attempt: int
    #: ``Type: message`` of what the handler raised (or why the attempt failed).
    error: str
    #: The worker that ran the attempt.
    worker_id: UUID | None


#: How many failed attempts a job keeps in :attr:`Job.errors` (the last ones; the
#: count of older ones is :attr:`Job.errors_omitted`). Fixed by the completion SQL.
MAX_KEPT_ERRORS = 10


@dataclass(frozen=True, slots=True)
class Job:
    """A job as stored: what handlers receive and what :meth:`Queue.get` returns."""

    id: UUID
    name: str
    payload: Any
    status: JobStatus
    attempt: int
    max_attempts: int
    priority: int
    queue_name: str | None
    job_key: str | None
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    last_error: str | None
    worker_id: UUID | None
    #: The token of the claim this copy was read under (internal: guards completion).
    lock_token: UUID | None = field(default=None, repr=False, compare=False)
    #: The W3C trace context of the enqueue (JSON text), when a tracer was on: the
    #: worker's span continues that trace.
    trace_context: str | None = field(default=None, repr=False, compare=False)
    #: What the handler returned (JSON values), once the job succeeded.
    result: Any = None
    #: The failed attempts' errors, oldest first: the last ``MAX_KEPT_ERRORS``.
    errors: tuple[AttemptError, ...] = ()
    #: How many older failed attempts no longer fit in ``errors``.
    errors_omitted: int = 0
    #: How many times the handler snoozed (``raise pgfleet.Snooze(delay)``).
    snoozes: int = 0
    #: When someone asked to cancel the job while it ran, and who
    #: (:meth:`Queue.cancel`); ``cancelled_by`` stays on the cancelled job.
    cancel_requested_at: datetime | None = None
    cancelled_by: str | None = None
    #: The key its flow control counts it under (``EnqueueOptions(limit_key=...)``):
    #: a tenant or an account; per-key limits and fair turns go by it.
    limit_key: str | None = None

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts


# Generated code, for a third less per claimed job than Job(...) (measured:
# docs/design/performance.md); built from fields(Job), so it cannot drift.
def _job_maker() -> Any:
    """Build ``make_job``: a Job from its field values in declaration order,
    each slot's setter called in turn (unrolled), without the frozen dataclass's
    ``__init__`` and its ``object.__setattr__`` per field."""
    names = [f.name for f in fields(Job)]
    scope: dict[str, Any] = {"_new": object.__new__, "_Job": Job}
    scope.update({f"_set_{name}": getattr(Job, name).__set__ for name in names})
    body = "".join(f"    _set_{name}(job, {name})\n" for name in names)
    source = f"def make_job({', '.join(names)}):\n    job = _new(_Job)\n{body}    return job\n"
    exec(source, scope)  # fixed text, built from the dataclass's own field names
    return scope["make_job"]


#: ``make_job(id, name, payload, ..., lock_token)``: every field, positionally,
#: already of its type; nothing is checked (the data layer's hot path only).
make_job: Callable[..., Job] = _job_maker()


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A registered worker process as :meth:`Queue.workers` lists it."""

    id: UUID
    hostname: str
    pid: int
    concurrency: int
    job_names: tuple[str, ...]
    queue_names: tuple[str, ...] | None
    version: str
    started_at: datetime
    heartbeat_at: datetime
    expires_at: datetime
    alive: bool
    running_jobs: int
    is_leader: bool
