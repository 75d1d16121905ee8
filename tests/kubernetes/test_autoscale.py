"""The replica simulation (loadtest/autoscale.py): HPA math, and the shipped defaults.

The controller's arithmetic is checked step by step against hand-computed values
(tolerance, the largest metric winning, rate-limit policies relative to the start of
their period, stabilisation windows, bounds). Then the keda-postgres defaults, read
from the rendered ScaledObject, run the load tests' profile at the per-replica drain
rate the committed capacity report measured: the oldest due job must stay under the
backlog alert's threshold, the fleet must not flap while the load holds, and no job
may be lost.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest

from loadtest import autoscale
from loadtest.autoscale import (
    AGE,
    DUE,
    Autoscaler,
    Hpa,
    Policy,
    Rules,
    Simulation,
    Workload,
    simulate,
)
from loadtest.report import Report
from tests.kubernetes.support import ROOT, find, render

COMMITTED_DRAIN = ROOT / "loadtest" / "reports" / "2026-11-30" / "drain" / "points.json"

UP = Rules(0, (Policy("Percent", 100, 15), Policy("Pods", 4, 15)), "Max")
DOWN = Rules(300, (Policy("Percent", 25, 60),), "Max")


def config(**changes: object) -> Autoscaler:
    base = {
        "min_replicas": 2,
        "max_replicas": 20,
        "targets": {DUE: 12.0, AGE: 30.0},
        "scale_up": UP,
        "scale_down": DOWN,
        "due_cap": 100_000,
    }
    base.update(changes)
    return Autoscaler(**base)  # type: ignore[arg-type]


def drain_rate() -> float:
    rate = autoscale.measured_drain_rate(json.loads(COMMITTED_DRAIN.read_text()))
    assert rate is not None, "the committed report has no 1-process, concurrency-16 drain"
    return rate


# ------------------------------------------------------------------ HPA arithmetic


def test_proposal_is_ceil_of_value_over_target_outside_the_tolerance() -> None:
    hpa = Hpa(config(), replicas=4)
    # 46 / (12 * 4) = 0.96: within 10 %, keep 4.
    assert hpa.proposal({DUE: 46}) == 4
    # 60 / 48 = 1.25 is outside: ceil(60 / 12) = 5; 37 / 48 = 0.77: ceil(37 / 12) = 4.
    assert hpa.proposal({DUE: 60}) == 5
    assert hpa.proposal({DUE: 37}) == 4
    assert hpa.proposal({DUE: 13}) == 2
    # The larger metric wins: age 200 s / 30 s -> 7.
    assert hpa.proposal({DUE: 13, AGE: 200}) == 7


def test_scale_up_is_limited_per_period_from_the_period_start() -> None:
    hpa = Hpa(config(), replicas=2)
    want = {DUE: 12 * 20}
    # max(2 + 4 pods, 2 * 200 %) = 6, then 12 (6 * 2), then 20 (bounded by max).
    assert [hpa.sync(t, want) for t in (0, 15, 30, 45)] == [6, 12, 20, 20]
    # Within one period the limit counts from the period's start, not the last sync.
    hpa = Hpa(config(scale_up=Rules(0, (Policy("Pods", 4, 60),), "Max")), replicas=2)
    assert [hpa.sync(t, want) for t in (0, 15, 30, 61, 75)] == [6, 6, 6, 10, 10]
    # selectPolicy Min takes the smaller of the two policies.
    hpa = Hpa(config(scale_up=Rules(0, UP.policies, "Min")), replicas=10)
    assert hpa.sync(0, want) == 14
    hpa = Hpa(config(scale_up=Rules(0, UP.policies, "Disabled")), replicas=3)
    assert hpa.sync(0, want) == 3


def test_scale_down_waits_for_the_window_then_steps_by_policy() -> None:
    hpa = Hpa(config(), replicas=2)
    high = {DUE: 12 * 20}
    for t in (0, 15, 30):
        hpa.sync(t, high)
    assert hpa.replicas == 20
    idle = {DUE: 0, AGE: 0}
    # The highest recommendation of the last 300 s (20, last made at 30) holds the fleet.
    assert {hpa.sync(t, idle) for t in range(45, 316, 15)} == {20}
    # The window has passed: 25 % a minute (int(20 * 0.75) = 15), counted from the
    # replicas at the start of the policy's period.
    assert hpa.sync(330, idle) == 15
    assert hpa.sync(345, idle) == 15
    assert hpa.sync(375, idle) == 15
    assert hpa.sync(390, idle) == 11
    steps = [hpa.sync(t, idle) for t in range(405, 1200, 15)]
    assert steps[-1] == 2, "down to minReplicaCount, never below"
    assert min(steps) == 2


def test_scale_up_stabilisation_takes_the_lowest_recent_recommendation() -> None:
    hpa = Hpa(config(scale_up=Rules(30, UP.policies, "Max")), replicas=2)
    assert hpa.sync(0, {DUE: 12 * 3}) == 3
    # 10 wanted, but 3 was recommended within the last 30 s.
    assert hpa.sync(15, {DUE: 12 * 10}) == 3
    # 3 left the window (recorded at 0, not after 30 - 30): 10, limited to 3 + 4 pods.
    assert hpa.sync(30, {DUE: 12 * 10}) == 7
    assert hpa.sync(45, {DUE: 12 * 10}) == 10


# ------------------------------------------------------------------ the queue model


def test_simulation_loses_no_job_and_ages_fifo() -> None:
    work = Workload(((0, 100.0), (60, 0.0)), 300, per_replica_rate=30, startup=30)
    sim = simulate(config(max_replicas=3), work)
    arrived = sum(s.rate for s in sim.steps)
    drained = sum(s.drained for s in sim.steps)
    assert arrived == 6000
    assert math.isclose(arrived, drained + sim.steps[-1].backlog)
    # Two replicas (60/s) against 100/s: a backlog, then more pods, then drained.
    assert sim.steps[59].backlog > 0 and sim.steps[-1].backlog == 0
    assert sim.max_replicas == 3
    # FIFO: the oldest waiting job arrived at least backlog / arrival-rate seconds ago.
    worst = max(sim.steps, key=lambda s: s.backlog)
    assert worst.age >= worst.backlog / 100


def test_settings_are_those_of_the_rendered_scaled_object() -> None:
    rendered = find(render("overlays/keda-postgres"), "ScaledObject", "pgfleet-worker")
    assert autoscale.from_scaled_object(rendered) == autoscale.shipped_autoscaler()
    prometheus = find(render("overlays/keda-prometheus"), "ScaledObject", "pgfleet-worker")
    shipped = autoscale.shipped_autoscaler()
    from_prometheus = autoscale.from_scaled_object(prometheus)
    assert from_prometheus.targets == shipped.targets
    assert from_prometheus.scale_up == shipped.scale_up
    assert from_prometheus.scale_down == shipped.scale_down


# ------------------------------------------------------------------ the defaults


def reversals(sim: Simulation, start: int, end: int) -> int:
    """Scale-downs followed by a scale-up while the arrival rate does not change."""
    changes = [(t, n) for t, n in sim.replica_changes() if start <= t < end]
    flips, went_down, last = 0, False, None
    for _, n in changes:
        if last is not None:
            if n < last:
                went_down = True
            elif n > last and went_down:
                flips += 1
        last = n
    return flips


@pytest.mark.parametrize("lag", [0, 30], ids=["postgresql", "prometheus-lag-30s"])
def test_defaults_keep_backlog_age_under_the_alert_threshold(lag: int) -> None:
    cfg = autoscale.shipped_autoscaler()
    threshold = autoscale.alert_threshold()
    assert threshold == 300
    rate = drain_rate()
    for work in autoscale.default_workloads(rate):
        work = Workload(
            work.profile,
            work.duration,
            work.per_replica_rate,
            work.startup,
            lag,
            work.concurrency,
            work.label,
        )
        sim = simulate(cfg, work)
        assert sim.max_age < threshold / 2, autoscale.describe(sim)
        assert all(cfg.min_replicas <= s.replicas <= cfg.max_replicas for s in sim.steps)
        burst = max(r for _, r in work.profile)
        needed = math.ceil(burst / work.per_replica_rate)
        assert needed <= cfg.max_replicas, "maxReplicaCount must carry the burst"
        # While each level of the profile holds, the fleet never shrinks and regrows.
        bounds = [int(t) for t, _ in work.profile] + [work.duration]
        for start, end in itertools.pairwise(bounds):
            assert reversals(sim, start + 60, end) == 0, (start, autoscale.describe(sim))
        # Idle at the end: back to the floor, the backlog gone.
        assert sim.steps[-1].replicas == cfg.min_replicas
        assert sim.steps[-1].backlog == 0


def test_counting_due_jobs_alone_would_flap() -> None:
    """Why the first trigger counts running jobs: due jobs alone vanish whenever the
    fleet keeps up, and the fleet shrinks and regrows under a steady burst."""
    slow = autoscale.default_workloads(drain_rate())[1]
    cfg = autoscale.shipped_autoscaler()
    burst_start, burst_end = (int(t) for t, _ in slow.profile[1:3])
    shipped = simulate(cfg, slow)
    due_only = simulate(dataclasses.replace(cfg, count_running=False), slow)
    assert reversals(shipped, burst_start, burst_end) == 0
    assert reversals(due_only, burst_start, burst_end) >= 1, autoscale.describe(due_only)
    # Once the burst's first backlog is gone, only the due-only fleet falls behind again.

    def settled_age(sim: Simulation) -> float:
        return max(s.age for s in sim.steps if burst_start + 120 <= s.t < burst_end)

    assert settled_age(shipped) == 0
    assert settled_age(due_only) > 0


def test_fifty_ms_handlers_need_the_autoscaler() -> None:
    """The slow workload is the one that scales; without KEDA it would not keep up."""
    rate = drain_rate()
    slow = autoscale.default_workloads(rate)[1]
    cfg = autoscale.shipped_autoscaler()
    sim = simulate(cfg, slow)
    assert sim.max_replicas > 10
    fixed = simulate(
        Autoscaler(
            cfg.min_replicas,
            cfg.min_replicas,
            cfg.targets,
            cfg.scale_up,
            cfg.scale_down,
            cfg.due_cap,
        ),
        slow,
    )
    assert fixed.max_age > autoscale.alert_threshold()


def test_capacity_report_plots_the_simulation(tmp_path: Path) -> None:
    rep = Report(tmp_path, tmp_path)
    autoscale.report_section(rep, json.loads(COMMITTED_DRAIN.read_text()))
    assert rep.plots == ["autoscaling.png"]
    assert (tmp_path / "autoscaling.png").stat().st_size > 10_000
    text = "\n".join(rep.lines)
    assert "## Autoscaling on Kubernetes (simulated)" in text
    assert "replica count over time" in text
    (check,) = rep.checks
    assert check["ok"], check
    assert rep.headline["autoscaling"]["per_replica_rate"] == round(drain_rate())
    # Without a one-process drain at concurrency 16 there is nothing to simulate.
    empty = Report(tmp_path, tmp_path / "none")
    autoscale.report_section(empty, {"points": []})
    assert empty.plots == [] and empty.lines == []
