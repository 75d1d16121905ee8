"""A span per job execution when ``opentelemetry-api`` is installed and the
application has installed a tracer provider; nothing otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from pgfleet.jobs import Job

_trace: Any
try:
    import opentelemetry.trace as _trace
except ImportError:  # pragma: no cover - exercised where the package is absent
    _trace = None


# A proxy tracer: it follows whatever provider the application installs later, so
# it is taken once rather than per job.
_TRACER: Any = None if _trace is None else _trace.get_tracer("pgfleet")
_NO_PROVIDER: tuple[type, ...] = (
    () if _trace is None else (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)
)
#: What a job runs in while no provider is installed.
NO_SPAN: AbstractContextManager[None] = contextlib.nullcontext()


def _tracer() -> Any:
    """The tracer, or None while no provider is installed: the API's default
    provider records nothing, and opening its non-recording spans cost a third of
    the worker's CPU per no-op job (measured with the drain benchmark)."""
    if _trace is None or isinstance(_trace.get_tracer_provider(), _NO_PROVIDER):
        return None
    return _TRACER


def current_tracer() -> Any:
    """The tracer to open job spans with, or None: take it once per claim round."""
    return _tracer()


@contextlib.contextmanager
def span(tracer: Any, job: Job) -> Iterator[Any]:
    """A span named ``pgfleet.job <name>`` with the job's name, id and attempt.

    The payload is never attached.
    """
    attributes = {
        "pgfleet.job.name": job.name,
        "pgfleet.job.id": str(job.id),
        "pgfleet.job.attempt": job.attempt,
        "pgfleet.job.max_attempts": job.max_attempts,
    }
    if job.queue_name is not None:
        attributes["pgfleet.job.queue_name"] = job.queue_name
    with tracer.start_as_current_span(f"pgfleet.job {job.name}", attributes=attributes) as span:
        yield span
