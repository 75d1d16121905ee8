"""A span per job execution when ``opentelemetry-api`` is installed; nothing otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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


def _tracer() -> Any:
    return _TRACER


@contextlib.contextmanager
def job_span(job: Job) -> Iterator[Any]:
    """A span named ``pgfleet.job <name>`` with the job's name, id and attempt.

    The payload is never attached.
    """
    tracer = _tracer()
    if tracer is None:
        yield None
        return
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
