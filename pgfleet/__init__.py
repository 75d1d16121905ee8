"""pgfleet: durable PostgreSQL-backed background jobs for Python asyncio.

Delivery is at-least-once: make handlers idempotent (see the documentation: Delivery guarantees).
"""

from pgfleet._runtime.outcomes import RunStats
from pgfleet._version import __version__ as __version__
from pgfleet.backoff import RetryPolicy
from pgfleet.config import WorkerConfig
from pgfleet.context import (
    cancel_requested,
    current_job,
    is_shutting_down,
    shutdown_requested,
    worker_started_at,
)
from pgfleet.cron import CronJob, DailySchedule, MonthlySchedule, Weekday
from pgfleet.db.migrate import Migration, migrate, migration_script, migrations
from pgfleet.errors import (
    DatabaseRefused,
    DatabaseUnavailable,
    DuplicateJobKey,
    InvalidDependency,
    InvalidJobState,
    InvalidName,
    InvalidOptions,
    JobNotFound,
    MigrationError,
    PayloadDecodeError,
    PayloadError,
    PayloadTooLarge,
    PermanentError,
    PgfleetError,
    SchemaNotReady,
    Snooze,
    UnknownJobName,
    ValidationError,
)
from pgfleet.events import WorkerEvents
from pgfleet.jobs import (
    AttemptError,
    BatchProgress,
    EnqueueOptions,
    EnqueueRequest,
    Job,
    JobKeyMode,
    JobStatus,
    Relative,
    WorkerInfo,
)
from pgfleet.queue import NotifyMode, Queue, create_pool
from pgfleet.registry import Registry
from pgfleet.worker import Worker

__all__ = [
    "AttemptError",
    "BatchProgress",
    "CronJob",
    "DailySchedule",
    "DatabaseRefused",
    "DatabaseUnavailable",
    "DuplicateJobKey",
    "EnqueueOptions",
    "EnqueueRequest",
    "InvalidDependency",
    "InvalidJobState",
    "InvalidName",
    "InvalidOptions",
    "Job",
    "JobKeyMode",
    "JobNotFound",
    "JobStatus",
    "Migration",
    "MigrationError",
    "MonthlySchedule",
    "NotifyMode",
    "PayloadDecodeError",
    "PayloadError",
    "PayloadTooLarge",
    "PermanentError",
    "PgfleetError",
    "Queue",
    "Registry",
    "Relative",
    "RetryPolicy",
    "RunStats",
    "SchemaNotReady",
    "Snooze",
    "UnknownJobName",
    "ValidationError",
    "Weekday",
    "Worker",
    "WorkerConfig",
    "WorkerEvents",
    "WorkerInfo",
    "__version__",
    "cancel_requested",
    "create_pool",
    "current_job",
    "is_shutting_down",
    "migrate",
    "migration_script",
    "migrations",
    "shutdown_requested",
    "worker_started_at",
]
