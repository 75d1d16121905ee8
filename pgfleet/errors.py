"""The exceptions pgfleet raises. Driver errors are mapped to these at the SQL boundary."""

from __future__ import annotations

from typing import Any
from uuid import UUID


class PgfleetError(Exception):
    """Base class of every error pgfleet raises itself."""


class ValidationError(PgfleetError, ValueError):
    """Bad input: an invalid name, option or payload. Nothing was written."""


class InvalidName(ValidationError):
    """A job, queue or cron name that is not 1-128 of letters, digits and ``_ - . :``."""


class InvalidOptions(ValidationError):
    """An enqueue or worker option out of its allowed range."""


class PayloadError(ValidationError):
    """A payload that cannot be encoded as JSON."""


class PayloadTooLarge(PayloadError):
    """An encoded payload larger than the queue's ``max_payload_bytes``."""


class UnknownJobName(ValidationError):
    """Enqueue of a name with no registered handler, in strict mode."""


class InvalidDependency(ValidationError):
    """A job's ``after`` names a job that does not exist, or the dependencies of a
    batch form a cycle: nothing was enqueued."""


class DuplicateJobKey(PgfleetError, ValueError):
    """The same job_key twice in one batch, or a key held by another active job."""

    def __init__(self, message: str, job_key: str) -> None:
        super().__init__(message)
        self.job_key = job_key


def missing_job(job_id: Any) -> str:
    """What to say about a job id that finds no row. A well-formed id may be of a
    job that finished and is gone: pruned after ``finished_job_retention``, or
    removed as it succeeded by a worker with ``remove_succeeded_jobs`` (the
    database keeps no trace of either, so which one cannot be told)."""
    text = f"no job with id {job_id}"
    try:
        UUID(str(job_id))
    except ValueError:
        return text
    return text + (
        " (a finished job is gone once pruned after finished_job_retention, and a "
        "succeeded one at once where workers run with remove_succeeded_jobs)"
    )


class JobNotFound(PgfleetError, LookupError):
    """No job with that id (see :func:`missing_job`)."""

    def __init__(self, job_id: Any) -> None:
        super().__init__(missing_job(job_id))
        self.job_id = job_id


class InvalidJobState(PgfleetError):
    """A management operation the job's current status does not allow."""

    def __init__(self, job_id: Any, operation: str, status: str, allowed: tuple[str, ...]):
        super().__init__(
            f"cannot {operation} job {job_id}: it is {status}, and {operation} "
            f"applies only to {_either(allowed)} jobs"
        )
        self.job_id = job_id
        self.operation = operation
        self.status = status
        self.allowed = allowed


class MigrationError(PgfleetError):
    """A migration could not be applied, or an applied one was edited since."""


class SchemaNotReady(PgfleetError):
    """The pgfleet schema is missing or older than this version needs."""


class DatabaseUnavailable(PgfleetError, ConnectionError):
    """Postgres could not be reached; the operation did not happen."""


class DatabaseRefused(DatabaseUnavailable):
    """Postgres answered but refused the login: the database or the role does not
    exist, or the password is wrong. Retrying will not help until someone fixes the
    configuration or creates what is missing."""


class PermanentError(Exception):
    """Raise from a handler to fail the job at once, without further retries."""


class PayloadDecodeError(PermanentError):
    """A stored payload does not decode into the handler's annotated type."""


class Snooze(Exception):  # a request, not an error: raise pgfleet.Snooze(90)
    """Raise from a handler to run the job again after ``delay`` seconds without
    using an attempt (the provider said "come back in 90 s"). The job's
    ``snoozes`` count grows by one; past its handler's ``max_snoozes`` (see
    :class:`pgfleet.RetryPolicy`) the job fails instead."""

    def __init__(self, delay: float) -> None:
        seconds = delay.total_seconds() if hasattr(delay, "total_seconds") else delay
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not 0 <= seconds <= 100 * 365.25 * 86400
        ):
            raise ValueError(f"Snooze delay must be 0 to 100 years of seconds, got {delay!r}")
        super().__init__(f"snoozed for {float(seconds):g}s")
        self.delay = float(seconds)


def _either(words: tuple[str, ...]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} or {words[-1]}"
