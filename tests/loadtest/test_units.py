"""The load-test harness's arithmetic, without Locust, gevent or a database."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from loadtest import gate, locustcsv, report, scenarios, users


def test_the_harness_side_never_imports_gevent() -> None:
    import loadtest.harness
    import loadtest.run
    import loadtest.sampling  # noqa: F401

    assert "gevent" not in sys.modules, "only Locust's own processes may patch with gevent"


@pytest.mark.parametrize(
    ("name", "batch"),
    [("enqueue batch=1", 1), ("/jobs batch=100", 100), ("Aggregated", None), ("x batch=", None)],
)
def test_request_names_carry_the_batch_size(name: str, batch: int | None) -> None:
    assert users.batch_of(name) == batch
    if batch is not None:
        assert users.batch_of(users.request_name(name.rsplit(" ", 1)[0], batch)) == batch


def test_user_period_spreads_the_target_rate_over_users_and_batches() -> None:
    assert users.user_period(0, 10, 8) == 0  # as fast as possible
    assert users.user_period(1000, 10, 8) == pytest.approx(0.08)  # 8 users x 12.5 req/s x 10
    assert users.user_period(100, 1, 0) == pytest.approx(0.01)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pacer_keeps_an_absolute_schedule_and_skips_missed_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(random, "random", lambda: 0.0)
    clock = FakeClock()
    pacer = users.Pacer(0.5, clock)
    assert pacer.wait() == pytest.approx(0.5)
    clock.now += 0.2  # the request took 0.2 s of the next slot
    assert pacer.wait() == pytest.approx(0.8)  # the slot after is at 101.0
    clock.now = 110.0  # fell far behind: no burst to catch up
    assert pacer.wait() == 0.0
    assert pacer.wait() == pytest.approx(0.5)
    assert users.Pacer(0, clock).wait() == 0.0


def test_budget_hands_out_whole_batches_then_the_rest_then_nothing() -> None:
    budget = users.Budget(25)
    assert [budget.take(10) for _ in range(4)] == [10, 10, 5, 0]
    assert users.Budget(None).take(10) == 10


@pytest.mark.parametrize(
    ("totals", "limits", "expected"),
    [
        (gate.Totals(100, 0, 5, 9), gate.Limits(0.01), []),
        (gate.Totals(100, 1, 5, 9), gate.Limits(0.01), []),
        (gate.Totals(100, 2, 5, 9), gate.Limits(0.01), ["failure ratio 2.00% (2/100)"]),
        (gate.Totals(100, 0, 50, 90), gate.Limits(0.01, max_p95_ms=40), ["95th percentile 50 ms"]),
        (gate.Totals(100, 0, 50, 90), gate.Limits(0.01, max_p99_ms=80), ["99th percentile 90 ms"]),
        (gate.Totals(0, 0, 0, 0), gate.Limits(1.0), ["no request completed"]),
    ],
)
def test_gate_names_each_violation(
    totals: gate.Totals, limits: gate.Limits, expected: list[str]
) -> None:
    problems = gate.violations(totals, limits)
    assert len(problems) == len(expected)
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start)


def test_plateau_is_the_median_from_where_a_curve_nears_its_best() -> None:
    flat = report.plateau([1, 2, 4, 8, 16], [500, 900, 1000, 1010, 995])
    assert (flat.level, flat.start, flat.best, flat.best_at) == (997.5, 2, 1010, 8)
    lucky = report.plateau([1, 2, 4, 8, 16], [1900, 3000, 2200, 1600, 2100])
    assert (lucky.level, lucky.start) == (2150, 2)  # one lucky point does not set the cap
    rising = report.plateau([1, 2, 4], [100, 200, 400])
    assert (rising.level, rising.start) == (400, 4)


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        ([1, 5, 9, 10, 9, 10, 10, 9, 10], True),  # grows, then flat
        ([10, 20, 30, 40, 50, 60, 70, 80, 90], False),  # keeps growing
        ([0, 0, 0, 0, 0, 0, 0, 0, 0], True),
        ([1, 2, 3], True),  # too short to tell
    ],
)
def test_bounded_compares_the_last_third_with_the_middle_third(
    series: list[float], expected: bool
) -> None:
    assert report.bounded(series) is expected


def test_scenario_parameters_can_be_overridden_by_name() -> None:
    base = scenarios.Contention()
    changed = scenarios.override(base, ["producers=1,8", "seconds=3", "modes=off"])
    assert changed.producers == (1, 8)
    assert changed.seconds == 3.0
    assert changed.modes == ("off",)
    with pytest.raises(SystemExit, match="unknown parameter 'nope'"):
        scenarios.override(base, ["nope=1"])


def test_every_profile_defines_every_scenario() -> None:
    for profile in scenarios.PROFILES.values():
        assert set(profile) == set(scenarios.SCENARIOS)


def test_locust_stats_are_summarised_in_jobs(tmp_path: Path) -> None:
    header = (
        "Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,"
        "Min Response Time,Max Response Time,Average Content Size,Requests/s,Failures/s,"
        "50%,66%,75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%"
    )
    rows = [
        "POST,/jobs batch=10,100,2,3,3.5,1,20,10.0,50.0,1.0,3,3,4,4,5,8,9,12,20,20,20",
        "POST,/jobs batch=1,10,0,2,2.0,1,5,1.0,5.0,0.0,2,2,2,2,3,4,5,5,5,5,5",
        ",Aggregated,110,2,3,3.4,1,20,9.2,55.0,1.0,3,3,4,4,5,8,9,12,20,20,20",
    ]
    (tmp_path / "run_stats.csv").write_text("\n".join([header, *rows]) + "\n")
    s = locustcsv.summarize(tmp_path / "run")
    assert (s.requests, s.failures) == (110, 2)
    assert s.jobs == 98 * 10 + 10  # failed requests carried no committed job
    assert s.jobs_per_s == pytest.approx(50 * 10 + 5)
    assert (s.p50_ms, s.p95_ms, s.p99_ms) == (3, 8, 12)


def test_the_committed_full_run_rebuilds_into_a_consistent_report(tmp_path: Path) -> None:
    runs = sorted((Path(__file__).resolve().parents[2] / "loadtest" / "reports").iterdir())
    assert runs, "loadtest/reports/ holds at least one full run"
    path = report.write_report(runs[-1], out=tmp_path)
    text = path.read_text()
    assert "a notification per commit caps single-job enqueue at about" in text
    assert "Coalescing lifts it to about" in text
    assert "**Verdict: bounded**" in text
    for plot in ("contention_commits.png", "drain_rate.png", "pickup_latency.png", "soak.png"):
        assert (tmp_path / plot).stat().st_size > 10_000
    assert "FAILED" not in text


def test_the_load_tests_use_pgfleets_public_names_only() -> None:
    """No private module (pgfleet._x) and no SQL layer (pgfleet.db): the database
    user enqueues through pgfleet.contrib.psycopg."""
    import ast

    for path in sorted((Path(__file__).resolve().parents[2] / "loadtest").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                parts = module.split(".")
                if parts[0] == "pgfleet" and len(parts) > 1:
                    assert not parts[1].startswith("_"), f"{path.name} imports {module}"
                    assert parts[1] != "db", f"{path.name} imports {module}"


def test_soak_batches_are_sized_to_the_rate() -> None:
    soak = scenarios.Soak(users=8, batch_period=0.1)
    assert scenarios.soak_batch(soak, 17_900) == 224  # 8 producers x 10/s x 224 >= 17,900
    assert scenarios.soak_batch(soak, 100) == 2
    assert scenarios.soak_batch(soak, 1) == 1
    assert scenarios.soak_batch(soak, 10_000_000) == scenarios.MAX_BATCH
    assert scenarios.soak_batch(scenarios.Soak(batch=10), 17_900) == 10  # set: kept


@pytest.mark.parametrize(("achieved", "reached"), [(3_000, False), (17_100, True)])
def test_a_soak_short_of_its_target_rate_fails_its_verdict(
    tmp_path: Path, achieved: float, reached: bool
) -> None:
    rep = report.Report(tmp_path, tmp_path)
    point = {"target_rate": 17_879.0, "achieved_rate": achieved, "capacity": 25_541.0}
    verdicts: dict[str, bool] = {}
    text = report._soak_rate(rep, point, verdicts)
    assert verdicts == {"rate reached": reached}
    assert f"Achieved {achieved:,.0f} jobs/s against a target of 17,879" in text
    assert rep.headline["soak_capacity_share"] == round(achieved / 25_541, 3)


def test_a_soak_without_a_recorded_rate_is_not_judged_on_it(tmp_path: Path) -> None:
    verdicts: dict[str, bool] = {}
    assert report._soak_rate(report.Report(tmp_path, tmp_path), {"target_rate": 1}, verdicts) == ""
    assert verdicts == {}
