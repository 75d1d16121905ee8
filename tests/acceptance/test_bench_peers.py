"""tools/bench/peers.py runs end to end at a tiny scale against the pinned pgqueuer
(speed is measured by `make bench-peers`, never asserted in tests; graphile-worker,
a Node.js contender, has its own smoke test: test_bench_graphile.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from tests.pgharness import Server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


async def test_peer_comparison_runs_and_reports_the_criteria(
    pg_server: Server, tmp_path: Path
) -> None:
    pytest.importorskip("pgqueuer", reason="pgqueuer (the dev extra pins 1.6.0) is not installed")
    out = tmp_path / "peers.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.bench.peers",
        "--database",
        f"pgfleet_peers_t{os.getpid()}",
        "--repeats",
        "1",
        "--contenders",
        "pgfleet,pgqueuer,raw",
        "--no-checkpoint",
        "--single",
        "20",
        "--batch-total",
        "1000",
        "--drain-total",
        "200",
        "--single-drain-total",
        "20",
        "--pgqueuer-drain-total",
        "200",
        "--latency-seconds",
        "0.5",
        "--json",
        str(out),
        cwd=ROOT,
        env={**os.environ, "PGFLEET_BENCH_DSN": pg_server.admin_dsn},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 600)
    assert proc.returncode == 0, output.decode()[-3000:]
    report = json.loads(out.read_text())
    assert set(report["rows"]) >= {
        "enqueue single",
        "enqueue batches of 500",
        "drain c1",
        "drain c16",
        "drain c64",
        "drain limit4 c16",
        "pickup plain",
        "pickup stale",
    }
    assert all(
        row["pgfleet"] > 0 and row["pgqueuer"] > 0
        for row in report["rows"].values()
        if "pgfleet" in row
    )
    assert len(report["criteria"]) == 7
    assert report["cpu"]["drain c16 pgfleet"]["client_ms"] > 0
    assert report["wal"]["drain c16 pgfleet"]["bytes"] > 0
    assert "the issues' criteria" in output.decode()
