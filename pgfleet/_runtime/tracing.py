"""Spans when ``opentelemetry-api`` is installed and the application has installed
a tracer provider; nothing otherwise (no span, no trace context stored, no cost
beyond one check per enqueue or claim round).

Every producer opens a ``pgfleet.enqueue <name>`` span (kind PRODUCER) around its
write and stores the W3C trace context of that span with the job(s): the
``traceparent`` and ``tracestate`` of :class:`TraceContextTextMapPropagator`, as JSON
text. The worker's span of each attempt, ``pgfleet.job <name>`` (kind CONSUMER), is
a child of it: the request that enqueued a job and every attempt of its handler
are one trace. A child rather than a link, because a job is the continuation of
the one request that enqueued it (one producer, one consumer per attempt), and
because tracing backends show a parent's children in its waterfall while a link
is only a reference to follow: the question "what happened to the order this
request took" is answered by one trace. Retries are further children of the same
enqueue span, told apart by ``pgfleet.job.attempt``. A job enqueued by a cron
schedule has no request behind it: its enqueue span is a root, the start of a
trace of its own."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from pgfleet.jobs import Job

_trace: Any
_W3C: Any
#: ``opentelemetry.context`` (attach/detach), or None without the package.
otel_context: Any
try:
    import opentelemetry.context as otel_context
    import opentelemetry.trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised where the package is absent
    _trace = None
    _W3C = None
    otel_context = None
else:
    _W3C = TraceContextTextMapPropagator()

#: W3C tracestate beyond this is dropped, not stored (its recommended limit is 512).
MAX_TRACESTATE = 512


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
def enqueue_span(tracer: Any, name: str, count: int = 1) -> Iterator[str]:
    """A producer span ``pgfleet.enqueue <name>`` (``<name>``: the batch's name when
    it has one, else ``batch``) around an enqueue; yields the trace context to store
    with the job(s), as JSON text."""
    attributes: dict[str, str | int] = {"pgfleet.job.name": name, "messaging.system": "pgfleet"}
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    with tracer.start_as_current_span(
        f"pgfleet.enqueue {name}", kind=_trace.SpanKind.PRODUCER, attributes=attributes
    ):
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        if len(carrier.get("tracestate", "")) > MAX_TRACESTATE:
            del carrier["tracestate"]
        yield json.dumps(carrier, separators=(",", ":"))


def batch_name(names: Any) -> str:
    """The name an enqueue span of a batch carries: its one job name, or ``batch``."""
    distinct = set(names)
    return distinct.pop() if len(distinct) == 1 else "batch"


def incoming(headers: Any) -> Any:
    """The trace context of a request's ``traceparent`` header (and tracestate), or
    None while no provider is installed or none came."""
    if _tracer() is None or "traceparent" not in headers:
        return None
    return _W3C.extract({k.lower(): v for k, v in headers.items() if k.lower() in _W3C.fields})


def _parent(job: Job) -> Any:
    text = job.trace_context
    if not text:
        return None
    try:
        carrier = json.loads(text) if isinstance(text, str) else text
        return _W3C.extract(carrier) if isinstance(carrier, dict) else None
    except ValueError:
        return None  # unreadable: the job's span starts a trace of its own


@contextlib.contextmanager
def span(tracer: Any, job: Job) -> Iterator[Any]:
    """A span named ``pgfleet.job <name>`` with the job's name, id and attempt, the
    child of its enqueue's span when one was stored with the job.

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
    with tracer.start_as_current_span(
        f"pgfleet.job {job.name}",
        context=_parent(job),
        kind=_trace.SpanKind.CONSUMER,
        attributes=attributes,
    ) as span:
        yield span
