"""Scraping the /metrics of real worker processes: names, types, labels, and values
that match the database and the work done, with no double counting across replicas."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, Queue
from tests.apps import runtime_app
from tests.procs import (
    eventually,
    free_ports,
    http_get,
    metric_types,
    parse_metrics,
    processes,
    start_worker,
    wait_http,
)

pytestmark = pytest.mark.slow

SPEC_TYPES = {
    "pgfleet_jobs_queued": "gauge",
    "pgfleet_jobs_scheduled": "gauge",
    "pgfleet_jobs_running": "gauge",
    "pgfleet_oldest_queued_job_age_seconds": "gauge",
    "pgfleet_jobs_dead": "gauge",
    "pgfleet_job_duration_seconds": "histogram",
    "pgfleet_job_pickup_delay_seconds": "histogram",
    "pgfleet_jobs_finished": "counter",
    "pgfleet_jobs_enqueued": "counter",
    "pgfleet_jobs_rescued": "counter",
    "pgfleet_worker_active_jobs": "gauge",
}
QUEUE_LEVEL = [
    "pgfleet_jobs_queued",
    "pgfleet_jobs_scheduled",
    "pgfleet_jobs_running",
    "pgfleet_oldest_queued_job_age_seconds",
    "pgfleet_jobs_dead",
]


async def test_three_workers_scraped_together(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await runtime_app.ensure_schema(pool)
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(200)])
    await queue.enqueue_many([EnqueueRequest("fail", {}) for _ in range(3)])
    await queue.enqueue_many(
        [EnqueueRequest("flaky", {"failures": 1}, EnqueueOptions(max_attempts=3)) for _ in range(4)]
    )
    # Due work nobody serves (its handler exists but this fleet does not claim it),
    # and work scheduled for later.
    await queue.enqueue_many([EnqueueRequest("serial", {}) for _ in range(7)])
    await queue.enqueue_many(
        [EnqueueRequest("record", {}, EnqueueOptions(delay=3600)) for _ in range(5)]
    )
    base = free_ports(3)
    workers = [
        await start_worker(
            database,
            tmp_path,
            "--metrics-port",
            str(base + i),
            "--job-names",
            "record,fail,flaky",
            "--backoff-base",
            "0.05",
            "--heartbeat-interval",
            "0.5",
            "--dead-worker-timeout",
            "2",
            "--poll-interval",
            "0.1",
        )
        for i in range(3)
    ]
    urls = [f"http://127.0.0.1:{base + i}" for i in range(3)]
    async with processes(*workers):
        for url in urls:
            await wait_http(f"{url}/healthz")

        async def settled() -> bool:
            n = await pool.fetchval(
                "SELECT count(*) FROM pgfleet.jobs WHERE status IN ('succeeded', 'failed')"
            )
            return int(n) == 207

        await eventually(settled, timeout=120, what="the due jobs to settle")
        texts = [(await http_get(f"{url}/metrics"))[1] for url in urls]
        ready = [await http_get(f"{url}/readyz") for url in urls]
        db_age = float(
            await pool.fetchval(
                "SELECT COALESCE(extract(epoch FROM now() - min(run_at)), 0) FROM pgfleet.jobs "
                "WHERE status = 'queued' AND run_at <= now() AND name = 'serial'"
            )
        )
        assert [await w.stop() for w in workers] == [0, 0, 0]

    assert all(code == 200 and '"ready"' in body for code, body in ready)
    # Every metric of the spec, with its type, in every process or (queue level) once.
    types: dict[str, str] = {}
    for text in texts:
        types.update(metric_types(text))
    for name, kind in SPEC_TYPES.items():
        assert types.get(name) == kind, (name, types.get(name))
    parsed = [parse_metrics(t) for t in texts]

    # Queue-level gauges come from exactly one process: no double counting.
    exporters = [p for p in parsed if "pgfleet_jobs_queued" in p]
    assert len(exporters) == 1
    holder = exporters[0]
    for name in QUEUE_LEVEL:
        kinds = [labels["kind"] for labels, _ in holder[name]]
        assert len(kinds) == len(set(kinds)), name  # once per kind
    gauge = {
        name: {labels["kind"]: value for labels, value in holder[name]} for name in QUEUE_LEVEL
    }
    assert gauge["pgfleet_jobs_queued"]["serial"] == 7  # due, nobody serves it
    assert gauge["pgfleet_jobs_queued"]["record"] == 0
    assert gauge["pgfleet_jobs_scheduled"]["record"] == 5
    assert gauge["pgfleet_jobs_dead"]["fail"] == 3
    assert gauge["pgfleet_jobs_dead"]["record"] == 0
    assert gauge["pgfleet_jobs_running"].get("record", 0) == 0
    # The oldest age was read at scrape time, before the database's own reading.
    assert 0 < gauge["pgfleet_oldest_queued_job_age_seconds"]["serial"] <= db_age
    assert gauge["pgfleet_oldest_queued_job_age_seconds"]["record"] == 0
    assert [v for _, v in holder["pgfleet_workers_alive"]] == [3]

    # Per-process counters sum to the work recorded in the database.
    def total(name: str, **match: str) -> float:
        return sum(
            value
            for p in parsed
            for labels, value in p.get(name, [])
            if all(labels.get(k) == v for k, v in match.items())
        )

    assert total("pgfleet_jobs_finished_total", kind="record", outcome="succeeded") == 200
    assert total("pgfleet_jobs_finished_total", kind="fail", outcome="failed") == 3
    assert total("pgfleet_jobs_finished_total", kind="flaky", outcome="retried") == 4
    assert total("pgfleet_jobs_finished_total", kind="flaky", outcome="succeeded") == 4
    attempts = int(await pool.fetchval("SELECT sum(attempt) FROM pgfleet.jobs"))
    assert total("pgfleet_jobs_finished_total") == attempts == 211
    # Histogram counts equal the jobs finished, per kind and outcome.
    assert total("pgfleet_job_duration_seconds_count") == attempts
    assert total("pgfleet_job_duration_seconds_count", kind="flaky", outcome="retried") == 4
    assert total("pgfleet_job_pickup_delay_seconds_count") == attempts
    # Every process reports its own active jobs and concurrency; nothing runs now.
    assert [v for p in parsed for _, v in p["pgfleet_worker_active_jobs"]] == [0, 0, 0]
    assert [v for p in parsed for _, v in p["pgfleet_worker_concurrency"]] == [16, 16, 16]
    assert sum(v for p in parsed for _, v in p["pgfleet_worker_leader"]) == 1
    # Labels never carry ids or payloads.
    allowed = {"kind", "outcome", "source", "version", "le"}
    for p in parsed:
        for samples in p.values():
            for labels, _ in samples:
                assert set(labels) <= allowed, labels
