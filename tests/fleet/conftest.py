"""Fixtures for the fleet-artifact tests.

``prometheus`` is a real Prometheus (the Debian/upstream binary) loading the
repository's recording and alert rules and scraping a stand-in worker: an HTTP
endpoint that serves pgfleet's own metric objects (``pgfleet.service.metrics``) fed
with made-up activity for the reference kinds. Dashboard queries run against it, so
a metric or label name that pgfleet does not export shows up as an empty panel.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest
import yaml

from tests.fleet.support import REFERENCE_JOB_NAMES, RULES, Prometheus, binary

if TYPE_CHECKING:
    from pgfleet.db.types import Pool


class _FakeConnection:
    def __init__(self, worker: StandInWorker) -> None:
        self.worker = worker

    async def fetch(self, sql: str) -> list[dict[str, Any]]:
        # Told apart by what each statement reads: parents, limits, pauses, else stats.
        if "waiting_on > 0" in sql:
            return self.worker.parent_rows()
        if "limit_starts" in sql:
            return self.worker.limit_rows()
        if "queue_pauses" in sql:
            return self.worker.pause_rows()
        return self.worker.queue_rows()

    async def fetchval(self, sql: str, *_args: Any) -> int | bool:
        # The metrics lease is always granted; three workers are alive.
        return True if "pgfleet.leases" in sql else 3


class _FakePool:
    """Just enough of an asyncpg pool for QueueStats.refresh(): not a whole
    :class:`pgfleet.db.types.Pool`, so it is cast to one where handed over."""

    def __init__(self, worker: StandInWorker) -> None:
        self.worker = worker

    @asynccontextmanager
    async def acquire(self) -> AsyncIterator[_FakeConnection]:
        yield _FakeConnection(self.worker)


class StandInWorker:
    """pgfleet's real per-process and queue-level metrics, fed made-up activity.

    Every scrape advances the activity: each reference kind finishes jobs with
    every outcome, pickups and wakeups are observed, the backlog ages.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        from pgfleet.service.metrics import ProcessMetrics, QueueStats, WorkerMetrics

        self.registry = CollectorRegistry()
        self.metrics = ProcessMetrics(self.registry)
        self.events = WorkerMetrics(self.metrics, lambda: 5, concurrency=16)
        self.events.prime(REFERENCE_JOB_NAMES)
        self.events.leader_changed(True)
        self.stats = QueueStats(cast("Pool", _FakePool(self)), REFERENCE_JOB_NAMES)
        self.registry.register(self.stats)
        self.ticks = 0
        self.lock = threading.Lock()

    def queue_rows(self) -> list[dict[str, Any]]:
        return [
            {
                "name": kind,
                "queued": 10 + i,
                "scheduled": i,
                "running": 1,
                "oldest_age": float(self.ticks + i),
                "dead": self.ticks // 5 if kind in ("fail", "flaky") else 0,
            }
            for i, kind in enumerate(REFERENCE_JOB_NAMES)
        ]

    def limit_rows(self) -> list[dict[str, Any]]:
        return [
            {"name": "reports", "reason": "paused", "n": 3},
            {"name": "thumbnails", "reason": "concurrency", "n": 2 + self.ticks % 3},
        ]

    def pause_rows(self) -> list[dict[str, Any]]:
        since = datetime.now(UTC) - timedelta(seconds=60 + self.ticks)
        return [{"kind": "name", "name": "reports", "paused_at": since}]

    def parent_rows(self) -> list[dict[str, Any]]:
        return [{"name": "noop", "waiting": 100 - self.ticks % 100}, {"name": "cpu", "waiting": 1}]

    def advance(self) -> None:
        self.ticks += 1
        for i, kind in enumerate(REFERENCE_JOB_NAMES):
            job: Any = SimpleNamespace(name=kind)  # all the events read is .name
            for n in range(3):
                self.events.job_started(job, pickup_delay=0.002 * (n + 1) * (i + 1))
                self.events.job_finished(job, "succeeded", 0.01 * (n + 1) * (i + 1))
            outcome = ("retried", "failed", "cancelled", "aborted")[self.ticks % 4]
            self.events.job_finished(job, outcome, 0.5)
            self.metrics.count_enqueued(kind, 4)
        for source in ("notify", "poll", "completion", "reconnect"):
            self.events.wakeup(source)
        self.events.jobs_rescued(1)

    def render(self) -> bytes:
        from pgfleet.service.metrics import render

        with self.lock:
            self.advance()
            asyncio.run(self.stats.refresh())
            return render(self.registry)


def _serve(worker: StandInWorker) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = worker.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, name="stand-in-worker", daemon=True).start()
    return server


@pytest.fixture(scope="session")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus scraping a stand-in worker every second, with the repo's rules."""
    prom_binary = binary("prometheus")
    server = _serve(StandInWorker())
    root: Path = tmp_path_factory.mktemp("prometheus")
    config = root / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {
                    "scrape_interval": "1s",
                    "scrape_timeout": "1s",
                    "evaluation_interval": "1s",
                },
                "rule_files": [str(RULES / "recording.yml"), str(RULES / "alerts.yml")],
                "scrape_configs": [
                    {
                        "job_name": "pgfleet-worker",
                        "static_configs": [{"targets": [f"127.0.0.1:{server.server_address[1]}"]}],
                    }
                ],
            }
        )
    )
    prom = Prometheus(prom_binary, config, root / "data", root / "prometheus.log")
    try:
        prom.start()
        yield prom
    finally:
        prom.stop()
        server.shutdown()
        server.server_close()
