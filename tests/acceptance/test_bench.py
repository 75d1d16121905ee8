"""`pgfleet bench` runs end to end at a tiny scale (speed is measured by `make bench`,
never asserted in tests)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.pgharness import Server
from tests.procs import start

pytestmark = pytest.mark.slow


async def test_bench_runs_every_suite_and_writes_json(pg_server: Server, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    name = f"pgfleet_bench_t{os.getpid()}"
    proc = await start(
        [
            "bench",
            "--dsn",
            pg_server.admin_dsn,
            "--database",
            name,
            "--repeats",
            "1",
            "--scale",
            "0.005",
            "--json",
            str(out),
        ],
        tmp_path,
        "bench",
    )
    assert await proc.process.wait() == 0, proc.output()[-3000:]
    report = json.loads(out.read_text())
    names = {r["name"] for r in report["results"]}
    for expected in (
        "raw single",
        "batch",
        "32 producers coalesced",
        "drain c1",
        "drain c64",
        "drain 2 processes c64",
        "pickup p99",
        "claim retained",
    ):
        assert expected in names
    assert all(r["median"] > 0 for r in report["results"])
    # CPU per job next to every throughput measurement of the drain and enqueue suites:
    # the client's always, Postgres' too when its processes are readable (a local server).
    by_name = {r["name"]: r for r in report["results"]}
    for metered in ("raw single", "single pool", "32 producers coalesced", "drain c16"):
        assert by_name[metered]["client_cpu_ms_per_job"] > 0
        if os.access("/proc/1/stat", os.R_OK) and "127.0.0.1" in pg_server.admin_dsn:
            assert by_name[metered]["pg_cpu_ms_per_job"] is not None
    assert "cpu/job client" in proc.output()
    assert report["facts"]["after drain"]["table_bytes"] > 0
    assert "summary (medians)" in proc.output()


def test_the_installed_package_ships_no_benchmark() -> None:
    """The suites and their raw-SQL rival live in tools/bench/, outside pgfleet."""
    import importlib.util

    assert importlib.util.find_spec("pgfleet.bench") is None
    assert importlib.util.find_spec("pgfleet.db.benchsql") is None
    assert importlib.util.find_spec("tools.bench.suite") is not None
