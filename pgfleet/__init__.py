"""pgfleet: durable PostgreSQL-backed background jobs for Python asyncio.

Delivery is at-least-once: make handlers idempotent (see the README).
"""

from pgfleet.db.migrate import Migration, migrate, migration_script, migrations
from pgfleet.errors import (
    DatabaseUnavailable,
    DuplicateJobKey,
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
    UnknownJobName,
    ValidationError,
)
from pgfleet.jobs import (
    EnqueueOptions,
    EnqueueRequest,
    Job,
    JobKeyMode,
    JobStatus,
    WorkerInfo,
)
from pgfleet.queue import NotifyMode, Queue, create_pool

__version__ = "0.1.0"

__all__ = [
    "DatabaseUnavailable",
    "DuplicateJobKey",
    "EnqueueOptions",
    "EnqueueRequest",
    "InvalidJobState",
    "InvalidName",
    "InvalidOptions",
    "Job",
    "JobKeyMode",
    "JobNotFound",
    "JobStatus",
    "Migration",
    "MigrationError",
    "NotifyMode",
    "PayloadDecodeError",
    "PayloadError",
    "PayloadTooLarge",
    "PermanentError",
    "PgfleetError",
    "Queue",
    "SchemaNotReady",
    "UnknownJobName",
    "ValidationError",
    "WorkerInfo",
    "__version__",
    "create_pool",
    "migrate",
    "migration_script",
    "migrations",
]
