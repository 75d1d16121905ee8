"""tools/bench/profile_drain.py breaks a small pgfleet drain down per job: claim
rounds, transactions, tuple writes, WAL (by relation where pg_waldump can read the
server's WAL) and an EXPLAIN of a claim round. Counts only; no time is asserted."""

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


async def test_a_pgfleet_drain_is_broken_down_per_job(pg_server: Server, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    jobs = 400
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.bench.profile_drain",
        "--database",
        f"pgfleet_profile_t{os.getpid()}",
        "--contender",
        "pgfleet",
        "--concurrency",
        "4",
        "--jobs",
        str(jobs),
        "--explain",
        "--explain-limit",
        "8",
        "--json",
        str(out),
        cwd=ROOT,
        env={**os.environ, "PGFLEET_BENCH_DSN": pg_server.admin_dsn},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, output.decode()[-3000:]
    report = json.loads(out.read_text())
    rounds = report["rounds"]
    # Every job was claimed by some round and its outcome written by a later one.
    assert rounds["claimed_per_round"] * rounds["calls"] == pytest.approx(jobs)
    assert rounds["outcomes_per_round"] * rounds["calls"] == pytest.approx(jobs)
    per_job = report["per_job"]
    assert per_job["n_tup_upd"] >= 2  # claimed, then finished: two row versions a job
    assert per_job["xact_commit"] > 0
    assert report["wal_bytes_per_job_server_wide"] > 0
    assert "WAL" in report["explain"] and "Buffers" in report["explain"]
    if "wal_records" in report:  # pg_waldump could read the server's WAL here
        heap = [k for k in report["wal_records"] if k.startswith("Heap") and "pgfleet.jobs" in k]
        assert heap, report["wal_records"]
