"""The summary of ``pgfleet bench`` (tools/bench/suite.py): ratios to a reference,
and for results measured in turn with theirs, the median of each repeat's ratio."""

from __future__ import annotations

import pytest

from tools.bench.suite import Bench, Result, _report


def test_a_paired_result_reports_the_median_of_each_repeats_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = Bench("postgresql://unused", repeats=3, scale=1.0)
    bench.results = [
        Result("base", "jobs/s", [100.0, 200.0, 100.0]),
        Result("paired", "jobs/s", [90.0, 100.0, 80.0], reference="base", extra={"paired": True}),
        Result("unpaired", "jobs/s", [90.0, 100.0, 80.0], reference="base"),
    ]
    rows = {row["name"]: row for row in _report(bench)["results"]}
    # Medians 90 / 100; each repeat's ratios 0.9, 0.5 and 0.8.
    assert rows["paired"]["ratio"] == pytest.approx(0.9)
    assert rows["paired"]["paired_ratio"] == pytest.approx(0.8)
    assert "paired" not in rows["paired"]
    assert rows["unpaired"]["paired_ratio"] is None
    assert rows["base"]["ratio"] is None and rows["base"]["paired_ratio"] is None
    assert "each repeat's ratio: median 80%" in capsys.readouterr().out
