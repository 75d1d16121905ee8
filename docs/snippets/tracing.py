"""A span per job (pip install 'pgfleet[tracing]' opentelemetry-sdk)."""

import asyncio
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import pgfleet

# Install a tracer provider before the worker starts; use your exporter (OTLP...)
# in place of the console one.
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(provider)

registry = pgfleet.Registry()


@registry.job("send_email")
async def send_email(job: pgfleet.Job, payload: dict[str, str]) -> None:
    # Spans opened here are children of the job's span "pgfleet.job send_email".
    with trace.get_tracer("myapp").start_as_current_span("render template"):
        pass


async def main() -> None:
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"])
    try:
        await pgfleet.Queue(pool).enqueue("send_email", {"to": "ada@example.com"})
        await pgfleet.Worker(pool, registry).run(burst=True)
    finally:
        await pool.close()
        provider.shutdown()


asyncio.run(main())
