"""app.py: a web application that runs a pgfleet worker inside its own process,
enqueues from its request handlers and serves the worker's Prometheus metrics.

Run it with `python app.py` (aiohttp comes with pgfleet[service]). In FastAPI or
Starlette, enter `running_worker` in the application's lifespan the same way.
"""

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web
from prometheus_client import CollectorRegistry

import pgfleet
from pgfleet.service.metrics import (
    CONTENT_TYPE,
    ProcessMetrics,
    QueueStats,
    WorkerMetrics,
    render,
)

registry = pgfleet.Registry()


@registry.job("send_welcome")
async def send_welcome(job: pgfleet.Job, payload: dict[str, str]) -> None:
    print(f"welcome, {payload['email']}")


@contextlib.asynccontextmanager
async def running_worker(
    pool: asyncpg.Pool, prometheus: CollectorRegistry
) -> AsyncIterator[QueueStats]:
    """A worker running in the background until the block exits, then drained
    (handlers still running get shutdown_grace_period to finish). Its metrics go
    to ``prometheus``; the queue-level gauges (queued, oldest age, dead...) come
    from the returned collector, refreshed before each scrape."""
    worker = pgfleet.Worker(pool, registry, pgfleet.WorkerConfig(concurrency=4))
    metrics = ProcessMetrics(prometheus)
    events = WorkerMetrics(metrics, lambda: worker.active_jobs, worker.config.concurrency)
    events.prime(worker.served_names)
    worker.add_events(events)
    stats = QueueStats(pool, registry.names())
    prometheus.register(stats)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(shutdown=stop.wait()))
    try:
        yield stats
    finally:
        stop.set()
        await task
        await stats.release()


async def pgfleet_context(app: web.Application) -> AsyncIterator[None]:
    """aiohttp's lifespan: the pool, the queue and the worker live as long as the app."""
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"], max_size=10)
    prometheus = CollectorRegistry()
    try:
        async with running_worker(pool, prometheus) as stats:
            app[QUEUE] = pgfleet.Queue(pool)
            app[PROMETHEUS] = prometheus
            app[STATS] = stats
            yield
    finally:
        await pool.close()


async def signup(request: web.Request) -> web.Response:
    body = await request.json()
    job_id = await request.app[QUEUE].enqueue("send_welcome", {"email": body["email"]})
    return web.json_response({"job": str(job_id)}, status=202)


async def metrics(request: web.Request) -> web.Response:
    await request.app[STATS].refresh()  # the queue-level gauges are read at scrape time
    body = render(request.app[PROMETHEUS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


QUEUE = web.AppKey("queue", pgfleet.Queue)
PROMETHEUS = web.AppKey("prometheus", CollectorRegistry)
STATS = web.AppKey("stats", QueueStats)


def make_app() -> web.Application:
    app = web.Application()
    app.cleanup_ctx.append(pgfleet_context)
    app.router.add_post("/signup", signup)
    app.router.add_get("/metrics", metrics)
    return app


if __name__ == "__main__":
    web.run_app(make_app(), host="127.0.0.1", port=8080)
