"""Loading an application's registry (and cron list) from ``module:attribute``."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from pgfleet.registry import Registry


class AppError(Exception):
    """An --app/--crons path that does not name what it should."""


def load_object(path: str, what: str) -> Any:
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise AppError(f"{what} must look like module.path:attribute, got {path!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: the working directory is importable
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppError(f"cannot import {module_name!r} for {what} {path!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppError(f"module {module_name!r} has no attribute {attr!r} ({what})") from None
    return obj


def load_registry(path: str) -> Registry:
    obj = load_object(path, "--app")
    if callable(obj) and not isinstance(obj, Registry):
        obj = obj()
    if not isinstance(obj, Registry):
        raise AppError(f"--app {path!r} is a {type(obj).__name__}, not a pgfleet.Registry")
    return obj


def load_crons(path: str | None) -> list[Any]:
    if not path:
        return []
    obj = load_object(path, "--crons")
    if callable(obj):
        obj = obj()
    if not isinstance(obj, list | tuple):
        raise AppError(f"--crons {path!r} must be a list of CronJob, got {type(obj).__name__}")
    return list(obj)
