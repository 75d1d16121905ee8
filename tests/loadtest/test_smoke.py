"""CI's smoke run: every scenario for a few seconds against real Postgres, real
worker processes and the real API, through the same command as ``make loadtest``.

Asserted: the CSVs, the plots and the report exist with sane contents, every job
Locust counted was committed and (where workers ran) done, no request failed.
The rates are printed for the log, never asserted.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import pgharness
from tests.loadtest.support import run

PLOTS = [
    "contention_commits.png",
    "contention_latency.png",
    "contention_http.png",
    "drain_rate.png",
    "pickup_latency.png",
    "backlog_age.png",
    "soak.png",
]
SECTIONS = [
    "## Notification-commit contention",
    "## SKIP LOCKED drain throughput",
    "## Steady state",
    "## Soak",
    "## Consistency",
]


@pytest.fixture(scope="module")
def smoke(pg_server: pgharness.Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("loadtest-smoke")
    scratch = f"pgfleet_lt{os.getpid()}"
    argv = ["-m", "loadtest.run", "all", "--profile", "smoke", "--out", str(out)]
    code, output = run(
        [*argv, "--database", scratch],
        timeout=280,
        env={"PGFLEET_DATABASE_URL": pg_server.admin_dsn, "LOCUST_HOST": ""},
    )
    print(output[-3000:])
    assert code == 0, output
    try:
        yield out
    finally:
        import asyncio

        asyncio.run(pgharness.drop_database(pg_server, scratch))


@pytest.mark.timeout(300)
def test_smoke_run_writes_every_scenario_csv(smoke: Path) -> None:
    for scenario in ("contention", "drain", "steady", "soak"):
        doc = json.loads((smoke / scenario / "points.json").read_text())
        assert doc["points"], scenario
        for point in doc["points"]:
            stats = smoke / f"{point['csv']}_stats.csv"
            history = smoke / f"{point['csv']}_stats_history.csv"
            lines = stats.read_text().splitlines()
            assert lines[0].startswith("Type,Name,Request Count,Failure Count")
            assert lines[-1].startswith(",Aggregated,"), lines
            assert "batch=" in lines[1], lines
            assert len(history.read_text().splitlines()) > 1
            assert point["locust_exit"] == 0, point["name"]


@pytest.mark.timeout(300)
def test_smoke_report_is_consistent_and_has_every_plot(smoke: Path) -> None:
    summary = json.loads((smoke / "summary.json").read_text())
    print(json.dumps(summary["headline"], indent=1))
    failed = [c for c in summary["checks"] if not c["ok"]]
    assert not failed, failed
    checked = {c["what"].split()[0].rstrip(":") for c in summary["checks"]}
    assert checked == {"contention", "drain", "steady", "soak"}
    report = (smoke / "report.md").read_text()
    for section in SECTIONS:
        assert section in report
    assert re.search(r"\*\*PostgreSQL\*\* \d+", report), "the Postgres version is stated"
    assert "fsync=" in report and "synchronous_commit=" in report
    assert "a notification per commit caps single-job enqueue at about" in report
    for plot in PLOTS:
        data = (smoke / plot).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n"), plot
        assert len(data) > 10_000, plot
        assert f"]({plot})" in report
    # Every job the steady and soak runs enqueued was picked up and measured.
    steady = json.loads((smoke / "steady" / "points.json").read_text())["points"]
    for point in steady:
        assert point["pickup"]["jobs"] == point["jobs_done"] > 0
        assert point["statuses"] == {"succeeded": point["jobs_done"]}
