"""Django's tasks framework, from Django (6 and later) or the ``django-tasks``
backport (Django 5.2 on Python 3.11): the same names either way."""

from __future__ import annotations

from importlib import import_module
from importlib.util import find_spec
from typing import Any

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_finished",
    "task_started",
]

_DJANGO_6 = find_spec("django.tasks") is not None
_ROOT = "django.tasks" if _DJANGO_6 else "django_tasks"
_base = import_module(f"{_ROOT}.base")
_exceptions = import_module(f"{_ROOT}.exceptions")
_signals = import_module(f"{_ROOT}.signals")

task_backends: Any = import_module(_ROOT).task_backends
BaseTaskBackend: Any = import_module(f"{_ROOT}.backends.base").BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
InvalidTask: Any = _exceptions.InvalidTask if _DJANGO_6 else _exceptions.InvalidTaskError
TaskResultDoesNotExist: Any = _exceptions.TaskResultDoesNotExist
task_started: Any = _signals.task_started
task_finished: Any = _signals.task_finished
normalize_json: Any = import_module(
    "django.utils.json" if _DJANGO_6 else "django_tasks.utils"
).normalize_json
