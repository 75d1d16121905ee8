"""``TaskBackend``: Django's tasks framework on pgfleet.

A task enqueued here is a pgfleet job named ``<queue name>:<task's module path>``
(``default:shop.tasks.send_receipt``): the worker of a Django queue serves exactly
that queue's jobs. Its payload is ``{"args": [...], "kwargs": {...}}`` (JSON, as
Django requires); Django's priority (-100..100, higher first) becomes pgfleet's
(lower first) and ``run_after`` its ``run_at``. The job is written on Django's own
connection to the backend's database, in the transaction in progress there: inside
``transaction.atomic()`` it commits or rolls back with the block, and no worker can
see it before the commit. ``TaskResult``\\ s are read back from the job
(``get_result``).

``OPTIONS`` (all optional): ``DATABASE`` (the alias of Django's database holding
pgfleet's schema, default ``"default"``), ``ENQUEUE_ON_COMMIT`` (write the job only
once the transaction in progress commits, as the framework's pre-release setting of
that name did; default False: the write joins the transaction instead),
``MAX_ATTEMPTS`` (attempts per task, first included: 25), ``MAX_PAYLOAD_BYTES`` (of
a task's encoded arguments: 1 MiB), ``MODULES`` (modules to
import for their tasks besides each installed app's ``tasks`` module) and
``NOTIFY`` (``"coalesced"``, ``"transaction"`` or ``"off"``).
"""

from __future__ import annotations

import builtins
import functools
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils.module_loading import import_string

from pgfleet import _ids
from pgfleet.contrib.django.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
)
from pgfleet.contrib.psycopg import Producer
from pgfleet.db import psycopg_driver
from pgfleet.db.plans import DEFAULT_MAX_ATTEMPTS
from pgfleet.errors import InvalidName, InvalidOptions
from pgfleet.jobs import NAME_PATTERN, EnqueueOptions, Job, JobStatus, NotifyMode, validate_name
from pgfleet.payloads import DEFAULT_MAX_PAYLOAD_BYTES

__all__ = ["TaskBackend", "job_name", "parse_job_name"]

#: What each backend alias has been handed (``validate_task`` sees every task as it
#: is declared): the tasks its workers can run, by module path.
KNOWN_TASKS: dict[str, dict[str, Any]] = {}

_STATUS = {
    JobStatus.QUEUED: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
}

#: Prefixes of a failed task's stored error (see pgfleet.contrib.django.worker).
ERROR_PREFIXES = ("TaskFailed: ", "TaskFailedPermanently: ")


def job_name(queue_name: str, module_path: str) -> str:
    """The pgfleet job name of a task on a Django queue."""
    return f"{queue_name}:{module_path}"


def parse_job_name(name: str) -> tuple[str, str] | None:
    """(queue name, module path) of a Django task's job name; None for other jobs."""
    queue, sep, path = name.partition(":")
    return (queue, path) if sep and queue and path else None


class TaskBackend(BaseTaskBackend):  # type: ignore[misc]  # Django ships no annotations
    """pgfleet as a backend of Django's tasks framework (see the module)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = {str(key).upper(): value for key, value in self.options.items()}
        unknown = set(options) - {
            "DATABASE",
            "ENQUEUE_ON_COMMIT",
            "MAX_ATTEMPTS",
            "MAX_PAYLOAD_BYTES",
            "MODULES",
            "NOTIFY",
        }
        if unknown:
            raise InvalidOptions(f"TASKS[{alias!r}]['OPTIONS']: unknown {sorted(unknown)}")
        self.database: str = options.get("DATABASE", DEFAULT_DB_ALIAS)
        self.enqueue_on_commit = bool(options.get("ENQUEUE_ON_COMMIT", False))
        self.modules: list[str] = list(options.get("MODULES", ()))
        for queue in self.queues:
            _check_queue_name(queue)
        self.producer = Producer(
            notify=options.get("NOTIFY", "coalesced"),
            default_max_attempts=options.get("MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS),
            max_payload_bytes=options.get("MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES),
        )

    # ------------------------------------------------------------ tasks

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        _check_queue_name(task.queue_name)
        name = job_name(task.queue_name, task.module_path)
        if NAME_PATTERN.fullmatch(name) is None:
            raise InvalidTask(
                f"task {task.module_path!r} on queue {task.queue_name!r} makes the job name "
                f"{name!r}, over pgfleet's 128 characters"
            )
        KNOWN_TASKS.setdefault(self.alias, {}).setdefault(task.module_path, task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        payload = {"args": args, "kwargs": kwargs}
        run_at: datetime | None = task.run_after
        options = EnqueueOptions(priority=-task.priority, run_at=run_at)
        name = job_name(task.queue_name, task.module_path)
        connection = connections[self.database]
        if self.enqueue_on_commit and connection.in_atomic_block:
            job_id = _ids.uuid7()
            # Checked now, written at the commit: a bad payload raises here.
            self.producer._enqueuer.single(name, payload, options, notify=False, job_id=job_id)
            transaction.on_commit(
                functools.partial(self._write, name, payload, options, job_id),
                using=self.database,
            )
        else:
            job_id = self._write(name, payload, options)
        return self._result(task, job_id, TaskResultStatus.READY, args, kwargs)

    def _write(
        self, name: str, payload: Any, options: EnqueueOptions, job_id: UUID | None = None
    ) -> UUID:
        connection = connections[self.database]
        # Django learns of a failure inside its atomic block and rolls it back.
        with transaction.mark_for_rollback_on_error(using=self.database):
            raw = _psycopg_connection(connection)
            if job_id is None:
                return self.producer.enqueue(raw, name, payload, options=options)
            _, statement = self.producer._enqueuer.single(
                name,
                payload,
                options,
                notify=self.producer.notify_mode is not NotifyMode.OFF,
                job_id=job_id,
            )
            psycopg_driver.run_statement(raw, statement, psycopg_driver.ENQUEUE)
            return job_id

    # ------------------------------------------------------------ results

    def get_result(self, result_id: str) -> Any:
        connection = connections[self.database]
        job = self.producer.get(_psycopg_connection(connection), result_id)
        parsed = None if job is None else parse_job_name(job.name)
        if job is None or parsed is None:
            raise TaskResultDoesNotExist(result_id)
        queue, path = parsed
        try:
            task = import_string(path)
        except ImportError as exc:
            raise TaskResultDoesNotExist(f"{result_id}: task {path!r} not importable") from exc
        if not isinstance(task, Task):
            raise TaskResultDoesNotExist(f"{result_id}: {path!r} is not a task")
        return result_of(task.using(queue_name=queue), job, self.alias)

    def _result(self, task: Any, job_id: UUID, status: Any, args: Any, kwargs: Any) -> Any:
        return TaskResult(
            task=task,
            id=str(job_id),
            status=status,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )


def result_of(task: Any, job: Job, backend: str) -> Any:
    """The ``TaskResult`` a job stands for: its status, times, arguments, every
    failed attempt's error (``Job.errors``, the last ten; the last error when the
    history holds none) and, once it succeeded, its return value (``Job.result``)."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    status = _STATUS[job.status]
    if job.errors:
        errors = [_task_error(e.error) for e in job.errors]
    else:
        errors = [] if job.last_error is None else [_task_error(job.last_error)]
    attempts = job.attempt
    worker = "" if job.worker_id is None else str(job.worker_id)
    workers = [str(e.worker_id or "") for e in job.errors]
    if len(workers) < attempts:
        workers += [worker] * (attempts - len(workers))
    result = TaskResult(
        task=task,
        id=str(job.id),
        status=status,
        enqueued_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.started_at,
        args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}),
        backend=backend,
        errors=errors,
        # Django counts attempts by these: the workers of the failed attempts
        # pgfleet kept, then the current holder.
        worker_ids=workers[-attempts:] if attempts else [],
    )
    if job.status is JobStatus.SUCCEEDED:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _task_error(stored: str) -> Any:
    """A ``TaskError`` from a job's ``last_error``: the exception's class path and
    its traceback when the task raised it, pgfleet's own reason otherwise (a
    timeout, a worker that stopped heartbeating, a cancel)."""
    for prefix in ERROR_PREFIXES:
        if stored.startswith(prefix):
            path, _, trace = stored[len(prefix) :].partition("\n")
            return TaskError(exception_class_path=path, traceback=trace)
    kind = stored.partition(":")[0]
    builtin = getattr(builtins, kind, None)
    is_exception = isinstance(builtin, type) and issubclass(builtin, BaseException)
    path = f"builtins.{kind}" if is_exception else "builtins.RuntimeError"
    return TaskError(exception_class_path=path, traceback=stored)


def _check_queue_name(queue: Any) -> None:
    try:
        if not isinstance(queue, str) or ":" in queue:
            raise InvalidName(f"Django queue name {queue!r} for pgfleet: no ':' allowed")
        validate_name(queue, "Django queue name")
    except InvalidName as exc:
        raise InvalidTask(str(exc)) from None


def _psycopg_connection(connection: Any) -> psycopg.Connection[Any]:
    """The psycopg 3 connection under one of Django's connections."""
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidOptions(
            f"pgfleet's task backend needs Django's PostgreSQL backend on psycopg 3; database "
            f"{connection.alias!r} runs on {type(raw).__module__}.{type(raw).__name__}"
        )
    return raw
