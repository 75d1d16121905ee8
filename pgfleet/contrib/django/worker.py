"""The worker side: a pgfleet Registry of a project's tasks, and the asyncpg
connection string of a Django database.

Tasks are found the way Django finds them: importing every installed app's
``tasks`` module (and the backend's ``MODULES``) declares them, and the backend
records each as it is validated. A task runs with Django's signals
(``task_started``, ``task_finished``) and, for ``takes_context`` tasks, its
``TaskContext``; sync tasks run in the worker's threads with Django's database
connections checked before and closed after, as a request would.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Iterable
from inspect import iscoroutinefunction
from typing import Any
from urllib.parse import quote, urlencode

from django.db import close_old_connections, connections
from django.utils import timezone
from django.utils.module_loading import autodiscover_modules

from pgfleet.contrib.django.backend import KNOWN_TASKS, TaskBackend, job_name, result_of
from pgfleet.contrib.django.compat import (
    TaskContext,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from pgfleet.errors import InvalidOptions, PermanentError
from pgfleet.jobs import Job
from pgfleet.registry import Registry

__all__ = ["TaskFailed", "TaskFailedPermanently", "asyncpg_dsn", "build_registry"]

#: libpq parameters of a Django database's OPTIONS that asyncpg's URL takes too.
_PASSED_OPTIONS = (
    "sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "passfile",
    "target_session_attrs", "application_name", "connect_timeout", "service",
)  # fmt: skip


class TaskFailed(Exception):
    """A task raised: stored as ``<exception class path>\\n<traceback>`` so that
    Django's ``TaskError`` can be rebuilt from the job."""

    def __init__(self, error: BaseException) -> None:
        cls = type(error)
        trace = "".join(traceback.format_exception(error))
        super().__init__(f"{cls.__module__}.{cls.__qualname__}\n{trace}")


class TaskFailedPermanently(TaskFailed, PermanentError):
    """A task raised :class:`pgfleet.PermanentError`: no further attempts."""


def build_registry(backend: TaskBackend, queues: Iterable[str]) -> Registry:
    """A Registry with a handler per task and queue of ``backend``."""
    autodiscover_modules("tasks")
    for module in backend.modules:
        importlib.import_module(module)
    registry = Registry()
    tasks = KNOWN_TASKS.get(backend.alias, {})
    for queue in sorted(set(queues)):
        for path, task in sorted(tasks.items()):
            registry.register(
                job_name(queue, path), _handler(task.using(queue_name=queue), backend)
            )
    return registry


def _handler(task: Any, backend: TaskBackend) -> Any:
    def call_args(job: Job, payload: Any) -> tuple[Any, list[Any], dict[str, Any]]:
        result = result_of(task, job, backend.alias)
        args = list(payload.get("args", [])) if isinstance(payload, dict) else []
        kwargs = dict(payload.get("kwargs", {})) if isinstance(payload, dict) else {}
        if task.takes_context:
            args.insert(0, TaskContext(task_result=result))
        return result, args, kwargs

    if iscoroutinefunction(task.func):

        async def run_async(job: Job, payload: Any) -> Any:
            result, args, kwargs = call_args(job, payload)
            await task_started.asend(type(backend), task_result=result)
            try:
                value = await task.func(*args, **kwargs)
            except Exception as exc:
                _finish(result, TaskResultStatus.FAILED)
                raise _failure(exc) from exc
            else:
                _finish(result, TaskResultStatus.SUCCESSFUL, value)
            finally:
                await task_finished.asend(type(backend), task_result=result)
            return normalize_json(value)

        return run_async

    def run(job: Job, payload: Any) -> Any:
        close_old_connections()
        try:
            result, args, kwargs = call_args(job, payload)
            task_started.send(type(backend), task_result=result)
            try:
                value = task.func(*args, **kwargs)
            except Exception as exc:
                _finish(result, TaskResultStatus.FAILED)
                raise _failure(exc) from exc
            else:
                _finish(result, TaskResultStatus.SUCCESSFUL, value)
            finally:
                task_finished.send(type(backend), task_result=result)
            # Stored as the job's result: the TaskResult's return_value.
            return normalize_json(value)
        finally:
            close_old_connections()

    return run


def _finish(result: Any, status: Any, value: Any = None) -> None:
    """The attempt's outcome on the result ``task_finished`` receivers are sent (a
    failed attempt that will be retried reads FAILED there, READY in the job)."""
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    if value is not None:
        object.__setattr__(result, "_return_value", normalize_json(value))


def _failure(exc: Exception) -> TaskFailed:
    if isinstance(exc, PermanentError):
        return TaskFailedPermanently(exc)
    return TaskFailed(exc)


def asyncpg_dsn(alias: str) -> str:
    """The connection string of Django's database ``alias`` for asyncpg: the same
    host, port, name, user, password and TLS settings, nothing to keep twice."""
    settings = connections[alias].settings_dict
    if settings.get("ENGINE") != "django.db.backends.postgresql":
        raise InvalidOptions(
            f"database {alias!r} is {settings.get('ENGINE')!r}: pgfleet needs PostgreSQL"
        )
    user = quote(str(settings.get("USER") or ""), safe="")
    password = quote(str(settings.get("PASSWORD") or ""), safe="")
    host = str(settings.get("HOST") or "")
    port = str(settings.get("PORT") or "")
    name = quote(str(settings.get("NAME") or ""), safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    query: dict[str, str] = {}
    if host.startswith("/"):  # a Unix socket directory
        query["host"] = host
        netloc = credentials
    else:
        netloc = credentials + (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    if host.startswith("/") and port:
        query["port"] = port
    for key, value in (settings.get("OPTIONS") or {}).items():
        if key in _PASSED_OPTIONS and value is not None:
            query[key] = str(value)
    tail = f"?{urlencode(query)}" if query else ""
    return f"postgresql://{netloc}/{name}{tail}"
