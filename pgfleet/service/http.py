"""The small HTTP endpoint of every pgfleet process: /metrics, /healthz, /readyz."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry

from pgfleet.db.deadlines import BoundedPool, DatabaseTimeout
from pgfleet.db.migrate import check_schema
from pgfleet.service.metrics import CONTENT_TYPE, QueueStats, render

if TYPE_CHECKING:
    from pgfleet.db.deadlines import AppPool

log = logging.getLogger("pgfleet")

READY_TIMEOUT = 3.0


class PortInUse(Exception):
    """The configured port cannot be bound."""


async def database_ready(pool: AppPool) -> str | None:
    """None when the database answers and the schema is current, else why not.

    The probe's connection is dropped, not handed back, when it does not answer:
    a probe every few seconds must not fill the pool with hung connections."""
    probe = BoundedPool(pool, READY_TIMEOUT)
    try:
        async with probe.acquire("readiness probe") as conn:
            await check_schema(conn)
    except DatabaseTimeout:
        return f"database did not answer within {READY_TIMEOUT:.0f}s"
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None


def readiness(
    pool: AppPool, *checks: Callable[[], str | None]
) -> Callable[[], Awaitable[str | None]]:
    """A readiness probe: each of ``checks`` (cheap, in-process) and then the database."""

    async def ready() -> str | None:
        for check in checks:
            problem = check()
            if problem is not None:
                return problem
        return await database_ready(pool)

    return ready


def metrics_routes(
    app: web.Application,
    registry: CollectorRegistry,
    stats: QueueStats | None,
    ready: Callable[[], Awaitable[str | None]],
) -> None:
    async def metrics(_request: web.Request) -> web.Response:
        if stats is not None:
            await stats.refresh()
        return web.Response(body=render(registry), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_request: web.Request) -> web.Response:
        problem = await ready()
        if problem is None:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready", "reason": problem}, status=503)

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)


class Server:
    """An aiohttp application on one host:port, started and stopped with the process."""

    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        what: str,
        *,
        shutdown_timeout: float = 60.0,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.what = what
        #: How long stop() lets requests still in flight finish before cancelling them.
        self.shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None
        self.on_stop: list[Callable[[], Awaitable[None]]] = []

    async def start(self) -> None:
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self.shutdown_timeout,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            reason = exc.strerror or exc
            raise PortInUse(
                f"cannot listen on {self.host}:{self.port} for {self.what}: {reason}"
            ) from None
        log.info("%s listening on http://%s:%d", self.what, self.host, self.port)

    async def stop(self) -> None:
        for hook in self.on_stop:
            with contextlib.suppress(Exception):
                await hook()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner.cleanup()
            self._runner = None


def metrics_server(
    host: str,
    port: int,
    registry: CollectorRegistry,
    stats: QueueStats | None,
    pool: AppPool,
    health: Callable[[], str | None] | None = None,
) -> Server:
    app = web.Application()
    metrics_routes(app, registry, stats, readiness(pool, *([health] if health else [])))
    server = Server(app, host, port, "metrics and health")
    if stats is not None:
        server.on_stop.append(stats.release)
    return server
