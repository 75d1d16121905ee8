"""graphile-worker (Node.js) as a contender of tools/bench/peers.py: installed from
the npm registry into a cache (its pinned Node.js 22 with it), run in its default
and batched modes beside pgfleet at a tiny scale. Skipped, with the reason, where
npm or the registry is not to be had. Speed is never asserted here."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from tests.pgharness import Server
from tools.bench import graphile

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def install() -> graphile.Install:
    try:
        return graphile.provision()
    except graphile.Unavailable as exc:
        pytest.skip(f"graphile-worker {graphile.VERSION} cannot be provisioned here: {exc}")


async def test_graphile_worker_runs_beside_pgfleet_in_both_modes(
    pg_server: Server, install: graphile.Install, tmp_path: Path
) -> None:
    out = tmp_path / "peers.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tools.bench.peers",
        "--database",
        f"pgfleet_graphile_t{os.getpid()}",
        "--repeats",
        "1",
        "--contenders",
        "pgfleet,graphile",
        "--phases",
        "enqueue,drain-c16,latency-plain",
        "--no-checkpoint",
        "--single",
        "20",
        "--batch-total",
        "1000",
        "--drain-total",
        "600",
        "--graphile-default-drain-total",
        "300",
        "--latency-seconds",
        "0.5",
        "--json",
        str(out),
        cwd=ROOT,
        env={**os.environ, "PGFLEET_BENCH_DSN": pg_server.admin_dsn},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 300)
    text = output.decode()
    assert proc.returncode == 0, text[-3000:]
    report = json.loads(out.read_text())
    assert report["versions"]["graphile-worker"] == graphile.VERSION
    assert report["contenders"] == ["pgfleet", "graphile-default", "graphile-batched"]
    assert report["phases"] == ["enqueue-single", "enqueue-batch", "drain-c16", "latency-plain"]
    # Only the chosen phases ran: no other drain level, no stale latency.
    assert not any(k.startswith(("drain c1 ", "drain c64 ")) for k in report["runs"])
    assert not any("stale" in k for k in report["runs"])
    drain = report["rows"]["drain c16"]
    assert drain["pgfleet"] > 0
    assert drain["graphile-default"] > 0
    assert drain["graphile-batched"] > 0
    assert drain["ratio_graphile_batched"] == drain["pgfleet"] / drain["graphile-batched"]
    assert "drain c16 >= 1.0x graphile batched" in report["criteria"]
    for row in ("enqueue single", "enqueue batches of 500"):
        assert report["rows"][row]["graphile-batched"] > 0
    for mode in graphile.MODES:
        key = f"drain c16 graphile-{mode}"
        # The child's own CPU is counted (it is never reaped inside the meter),
        # and so are its backends and the WAL its deletes wrote.
        assert report["cpu"][key]["client_ms"] > 0, key
        assert report["cpu"][key]["postgres_ms"] is not None, key
        assert report["wal"][key]["bytes"] > 0, key
        assert report["drains"]["c16"][f"graphile-{mode}"]["jobs_per_s"] > 0
    pickup = report["rows"]["pickup plain"]
    assert pickup["graphile-batched_p99"] >= pickup["graphile-batched_p50"] > 0
    assert "| c16 | graphile-batched |" in text


def test_the_manifest_pins_exact_versions_and_the_lock_matches_it() -> None:
    manifest = json.loads((graphile.HERE / "package.json").read_text())
    lock = json.loads((graphile.HERE / "package-lock.json").read_text())
    for name, version in manifest["dependencies"].items():
        assert version[0].isdigit(), f"{name} is not pinned exactly: {version}"
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
    assert graphile.NODE_VERSION.startswith("22.")
