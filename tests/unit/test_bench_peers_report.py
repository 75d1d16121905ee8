"""tools/bench/peers.py's report: rows per contender, ratios against graphile-worker's
batched mode, the drain table with WAL per job; and a saved run reported again."""

from __future__ import annotations

from typing import Any

import pytest

from tools.bench import peers


def saved() -> dict[str, Any]:
    runs = {
        "drain c16 pgfleet": [30_000.0, 20_000.0, 25_000.0],
        "drain c16 graphile-batched": [40_000.0, 50_000.0, 30_000.0],
        "drain c16 graphile-default": [2_000.0, 2_500.0, 3_000.0],
        "drain c1 pgfleet": [10_000.0],
        "drain c1 graphile-batched": [20_000.0],
    }
    cpu = {k: [[0.02, 0.03]] * len(v) for k, v in runs.items()}
    wal = {k: [200e6] * len(v) for k, v in runs.items()}
    return {
        "runs": runs,
        "cpu_runs": cpu,
        "wal_runs": wal,
        "jobs": {
            "single": 2000,
            "batch_total": 20_000,
            "drain_total": 200_000,
            "single_drain_total": 3000,
            "graphile_default_drain_total": 20_000,
        },
    }


def test_ratios_against_graphile_batched_are_of_medians(capsys: pytest.CaptureFixture[str]) -> None:
    out = peers.report(peers.runs_from_json(saved()))
    row = out["rows"]["drain c16"]
    assert row["pgfleet"] == 25_000 and row["graphile-batched"] == 40_000
    assert row["ratio_graphile_batched"] == pytest.approx(25_000 / 40_000)
    assert row["ratio_graphile_default"] == pytest.approx(25_000 / 2_500)
    assert "pgqueuer" not in row and "ratio" not in row
    assert out["criteria"] == {
        "drain c1 >= 0.8x graphile batched": pytest.approx(0.5),
        "drain c16 >= 1.0x graphile batched": pytest.approx(0.625),
    }
    # WAL per job from each run's own job count: the default mode drained 20,000.
    assert out["wal"]["drain c16 graphile-default"]["bytes_per_job"] == pytest.approx(10_000)
    assert out["wal"]["drain c16 pgfleet"]["bytes_per_job"] == pytest.approx(1_000)
    text = capsys.readouterr().out
    assert "| c16 | graphile-batched | 40,000 | 0.020 + 0.030 | 191 (1,000 B/job) |" in text


def test_a_selection_without_a_peer_has_no_row() -> None:
    data = saved()
    data["runs"] = {"drain c16 pgfleet": [1.0]}
    assert peers.report(peers.runs_from_json(data))["rows"] == {}
