"""The keda-prometheus triggers' queries against a real Prometheus and a native fleet.

The native fleet (tools/fleet: a real worker process and the real jobs API) runs
against this test's database; a real Prometheus scrapes them the way the Prometheus
Operator scrapes the base's PodMonitor: job label from the pods'
app.kubernetes.io/name (pgfleet-worker, pgfleet-api) and the namespace label of the
pods (pgfleet). The worker serves only ``sleep``: two long sleeps run, and ``noop``
jobs wait, due, for a worker that never comes. Each trigger query, taken from the
rendered manifest, must then return one value: running plus due jobs exactly, and
the oldest due job's age as the database sees it.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import yaml

from pgfleet import EnqueueOptions, Queue
from tests.fleet.support import Prometheus, binary
from tests.kubernetes.support import find, render, trigger
from tests.procs import eventually, free_ports
from tools.fleet import FleetConfig, NativeFleet, Ports

pytestmark = pytest.mark.slow

DEADLINE = 180.0
NAMESPACE = "pgfleet"
DUE_NOOPS = 7
RUNNING_SLEEPS = 2
OLDEST_AGE = 200.0


def trigger_queries() -> dict[str, str]:
    scaled = find(render("overlays/keda-prometheus"), "ScaledObject", "pgfleet-worker")
    return {
        name: trigger(scaled, name)["metadata"]["query"]
        for name in ("running-and-due", "oldest-due-age")
    }


def operator_like_config(fleet: NativeFleet, scrape_interval: int = 1) -> dict[str, Any]:
    """Scrape configs with the labels a PodMonitor's generated config attaches."""

    def job(name: str, urls: list[str]) -> dict[str, Any]:
        targets = [u.removeprefix("http://").removesuffix("/metrics") for u in urls]
        return {
            "job_name": f"podMonitor/{NAMESPACE}/pgfleet/{name}",
            "static_configs": [{"targets": targets}],
            "relabel_configs": [
                {"target_label": "job", "replacement": name},
                {"target_label": "namespace", "replacement": NAMESPACE},
                {"target_label": "container", "replacement": name.removeprefix("pgfleet-")},
            ],
        }

    return {
        "global": {
            "scrape_interval": f"{scrape_interval}s",
            "scrape_timeout": f"{scrape_interval}s",
            "evaluation_interval": f"{scrape_interval}s",
        },
        "scrape_configs": [
            job("pgfleet-worker", fleet.worker_metrics_urls),
            job("pgfleet-api", [fleet.api_metrics_url]),
        ],
    }


async def value_of(prom: Prometheus, expr: str) -> float | None:
    """The query's single value; KEDA refuses anything but one element."""
    body = await asyncio.to_thread(prom.query, expr)
    assert body["status"] == "success", (expr, body.get("error"))
    result = body["data"]["result"]
    if body["data"]["resultType"] == "scalar":
        return float(result[1])
    assert len(result) <= 1, f"KEDA needs a single element, got {result}"
    return float(result[0]["value"][1]) if result else None


@pytest.mark.timeout(600)
async def test_prometheus_trigger_queries_see_the_fleets_backlog(
    database: str, tmp_path: Path
) -> None:
    binary("prometheus")
    queries = trigger_queries()
    base = free_ports(4)
    fleet = NativeFleet(
        FleetConfig(
            database_url=database,
            state_dir=tmp_path / "fleet",
            processes=1,
            ports=Ports(workers=base, api=base + 1, api_metrics=base + 2, prometheus=base + 3),
            prometheus=False,
            rate=0,
            worker_args=("--kinds", "sleep", "--shutdown-grace-period", "1"),
        ),
    )
    config = tmp_path / "prometheus.yml"
    prom = Prometheus(binary("prometheus"), config, tmp_path / "data", tmp_path / "prom.log")
    pool = await asyncpg.create_pool(database, min_size=1, max_size=2)
    try:
        await fleet.start()
        config.write_text(yaml.safe_dump(operator_like_config(fleet)))
        await asyncio.to_thread(prom.start)

        queue = Queue(pool)
        now = await pool.fetchval("SELECT now()")
        oldest = now - timedelta(seconds=OLDEST_AGE)
        for i in range(DUE_NOOPS):
            run_at = oldest + timedelta(seconds=10 * i)
            await queue.enqueue("noop", {}, options=EnqueueOptions(run_at=run_at))
        await queue.enqueue("noop", {}, options=EnqueueOptions(delay=3600))  # not due
        for _ in range(RUNNING_SLEEPS):
            await queue.enqueue("sleep", {"ms": 600_000})

        async def running_sleeps() -> bool:
            n = await pool.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE status = 'running'")
            return bool(n == RUNNING_SLEEPS)

        await eventually(running_sleeps, DEADLINE, "the worker to claim both sleeps")

        expected = DUE_NOOPS + RUNNING_SLEEPS

        seen: list[float | None] = []

        async def slots_seen() -> bool:
            value = await value_of(prom, queries["running-and-due"])
            if not seen or seen[-1] != value:
                seen.append(value)
            return value == expected

        try:
            await eventually(slots_seen, DEADLINE, f"running-and-due to read {expected}")
        except TimeoutError:
            # What it read instead, and what the fleet reported, for the next reader.
            parts = {
                name: await asyncio.to_thread(prom.query, name)
                for name in (
                    "pgfleet_jobs_running",
                    "pgfleet_jobs_queued",
                    "pgfleet_jobs_waiting_on_limit",
                    "up",
                )
            }
            raise AssertionError(f"running-and-due read {seen}; series: {parts}") from None

        age = await value_of(prom, queries["oldest-due-age"])
        db_age = await pool.fetchval(
            "SELECT extract(epoch FROM now() - min(run_at))::float8 FROM pgfleet.jobs"
            " WHERE status = 'queued' AND run_at <= now()"
        )
        assert age is not None
        # Sampled at the last scrape: at least the age it was seeded with, at most
        # the age the database reports now.
        assert OLDEST_AGE <= age <= math.ceil(db_age), (age, db_age)

        # The signal is the one the backlog alert uses: the same series, maxed.
        alert_view = await value_of(
            prom,
            f'max(max by (kind) (pgfleet_oldest_queued_job_age_seconds{{namespace="{NAMESPACE}"}}))',
        )
        assert alert_view is not None and alert_view >= age

        # Another namespace's fleet is not counted: the queries select on namespace.
        other = queries["running-and-due"].replace(f'namespace="{NAMESPACE}"', 'namespace="other"')
        assert await value_of(prom, other) == 0
    finally:
        await pool.close()
        prom.stop()
        await fleet.stop()
