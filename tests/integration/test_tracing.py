"""One trace from the request to the handler, through OpenTelemetry's in-memory
exporter: an HTTP request's span, the enqueue's producer span and the handler's
span of each attempt share the trace, for the jobs API (an incoming traceparent)
and for the psycopg producer. Without a provider nothing is stored."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import asyncpg
import psycopg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pgfleet import Job, Queue, Registry
from pgfleet._runtime import tracing
from pgfleet.contrib.psycopg import Producer
from pgfleet.service.api import ApiConfig, JobsApi
from pgfleet.testing import drain


@pytest.fixture
def exporter() -> Iterator[tuple[InMemorySpanExporter, Any]]:
    """A provider for pgfleet's spans (the global one can be set once per process)."""
    found = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(found))
    original = tracing._tracer
    tracing._tracer = lambda: provider.get_tracer("pgfleet")
    try:
        yield found, provider.get_tracer("app")
    finally:
        tracing._tracer = original


def _registry(fail_first: bool = False) -> Registry:
    registry = Registry()
    attempts: list[int] = []

    @registry.job("send")
    async def send(job: Job) -> None:
        attempts.append(job.attempt)
        if fail_first and job.attempt == 1:
            raise RuntimeError("first attempt fails")

    return registry


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def _assert_one_story(spans: tuple[ReadableSpan, ...], request: str) -> None:
    found = _by_name(spans)
    (outer,) = found[request]
    (enqueue,) = found["pgfleet.enqueue send"]
    handlers = found["pgfleet.job send"]
    assert {s.context.trace_id for s in [outer, enqueue, *handlers]} == {outer.context.trace_id}
    assert enqueue.kind is trace.SpanKind.PRODUCER
    for handler in handlers:
        assert handler.parent is not None and handler.parent.span_id == enqueue.context.span_id
        assert handler.kind is trace.SpanKind.CONSUMER


async def test_a_psycopg_producer_and_the_handler_continue_the_requests_trace(
    exporter: tuple[InMemorySpanExporter, Any], pool: asyncpg.Pool, database: str
) -> None:
    spans, app_tracer = exporter

    def handle_request() -> None:
        with (
            app_tracer.start_as_current_span("POST /orders"),
            psycopg.connect(database) as conn,
            conn.transaction(),
        ):
            Producer().enqueue(conn, "send", {"order": 1})

    await asyncio.to_thread(handle_request)
    stats = await drain(pool, _registry(fail_first=True), poll_interval=0.05)
    while stats.succeeded == 0:
        await pool.execute("UPDATE pgfleet.jobs SET run_at = now() WHERE status = 'queued'")
        stats = await drain(pool, _registry(), poll_interval=0.05)
    _assert_one_story(spans.get_finished_spans(), "POST /orders")
    attempts = [
        s.attributes["pgfleet.job.attempt"]  # type: ignore[index]
        for s in _by_name(spans.get_finished_spans())["pgfleet.job send"]
    ]
    assert attempts == [1, 2]  # retries: further attempts of the same enqueue


async def test_the_jobs_api_continues_an_incoming_traceparent(
    exporter: tuple[InMemorySpanExporter, Any], pool: asyncpg.Pool
) -> None:
    spans, app_tracer = exporter
    api = JobsApi(Queue(pool), ApiConfig())
    async with TestClient(TestServer(api.application())) as client:
        with app_tracer.start_as_current_span("client request"):
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers)
            response = await client.post("/jobs", json={"name": "send"}, headers=headers)
            assert response.status == 202
    await drain(pool, _registry(), poll_interval=0.05)
    _assert_one_story(spans.get_finished_spans(), "client request")


async def test_without_a_provider_nothing_is_traced_or_stored(pool: asyncpg.Pool) -> None:
    assert tracing.current_tracer() is None
    job_id = await Queue(pool).enqueue("send")
    assert (
        await pool.fetchval("SELECT trace_context FROM pgfleet.jobs WHERE id = $1", job_id) is None
    )
    job = await Queue(pool).get(job_id)
    assert job is not None and job.trace_context is None
