"""What KEDA's HPA does to the worker Deployment under the load tests' traffic.

A step-by-step replica simulation for the capacity report and for
``tests/kubernetes``: the load profile (the load tests' sustained rate, a burst at
their highest steady rate, back, then idle) arrives at a FIFO backlog; each ready
replica drains it at the per-replica rate the drain scenario measured (one
``pgfleet worker`` process at the default concurrency) or, for handlers that take
time, at ``concurrency / handler seconds`` when that is lower. Every HPA sync period
the Horizontal Pod Autoscaler that KEDA creates reads the ScaledObject's triggers
(due jobs and oldest due age, as the trigger queries compute them) and does what the
Kubernetes controller does:

- per metric (an external metric with an ``AverageValue`` target), a usage ratio
  ``value / (target * current)`` within the 10 % tolerance keeps ``current``,
  else the proposal is ``ceil(value / target)``; the largest proposal wins;
- stabilisation: the recommendation is held between the lowest recommendation of
  the scale-up window and the highest of the scale-down window;
- rate limits: each behaviour policy bounds the change relative to the replica
  count at the start of its period (``selectPolicy`` picks among them);
- bounds: ``minReplicaCount`` .. ``maxReplicaCount``.

New pods drain only after ``startup`` seconds (scheduling, image, migrate init
container, start-up probe); removed pods stop draining at once (they drain what they
hold within the grace period, nothing is lost, but claim nothing new).

The settings are read from the ScaledObject of deploy/kubernetes/overlays/keda-postgres,
so the simulation and the report follow the shipped defaults.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
KEDA_POSTGRES = ROOT / "deploy" / "kubernetes" / "overlays" / "keda-postgres" / "scaledobject.yaml"
ALERT_RULES = ROOT / "deploy" / "rules" / "alerts.yml"

#: Names of the ScaledObject triggers and the signal each one carries: claimed plus
#: due jobs (handler slots the work needs), and the oldest due job's age in seconds.
DUE = "running-and-due"
AGE = "oldest-due-age"
SIGNALS = (DUE, AGE)

#: Kubernetes' HPA defaults (kube-controller-manager flags).
HPA_SYNC_PERIOD = 15
HPA_TOLERANCE = 0.1


@dataclass(frozen=True)
class Policy:
    type: str  # "Pods" or "Percent"
    value: int
    period: int


@dataclass(frozen=True)
class Rules:
    stabilization: int
    policies: tuple[Policy, ...]
    select: str = "Max"  # "Max", "Min" or "Disabled"


@dataclass(frozen=True)
class Autoscaler:
    min_replicas: int
    max_replicas: int
    #: Trigger name -> target (AverageValue) of its metric.
    targets: dict[str, float]
    scale_up: Rules
    scale_down: Rules
    #: The running-and-due query counts at most this many due rows.
    due_cap: int
    sync_period: int = HPA_SYNC_PERIOD
    tolerance: float = HPA_TOLERANCE
    #: Whether the first signal counts running jobs too (False: due jobs only, the
    #: alternative docs/operations/kubernetes.md explains against).
    count_running: bool = True


def _rules(spec: dict[str, Any]) -> Rules:
    return Rules(
        stabilization=int(spec["stabilizationWindowSeconds"]),
        policies=tuple(
            Policy(p["type"], int(p["value"]), int(p["periodSeconds"])) for p in spec["policies"]
        ),
        select=spec.get("selectPolicy", "Max"),
    )


def due_cap(query: str) -> int:
    """The LIMIT of the running-and-due query (the most due rows it counts)."""
    words = query.replace("(", " ").replace(")", " ").split()
    limits = [int(words[i + 1]) for i, w in enumerate(words[:-1]) if w.upper() == "LIMIT"]
    if len(limits) != 1:
        raise ValueError(f"expected one LIMIT in the {DUE} query, found {limits}")
    return limits[0]


def from_scaled_object(obj: dict[str, Any]) -> Autoscaler:
    """The HPA settings a KEDA ScaledObject makes (the fields our overlays set)."""
    spec = obj["spec"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    targets: dict[str, float] = {}
    cap = 0
    for trigger in spec["triggers"]:
        meta = trigger["metadata"]
        name = trigger["name"]
        if name not in SIGNALS:
            raise ValueError(f"unknown trigger {name!r}: expected one of {SIGNALS}")
        if trigger.get("metricType", "AverageValue") != "AverageValue":
            raise ValueError(f"trigger {name!r}: only AverageValue is simulated")
        target = meta.get("targetQueryValue", meta.get("threshold"))
        targets[name] = float(target)
        if name == DUE and "query" in meta and trigger["type"] == "postgresql":
            cap = due_cap(meta["query"])
    return Autoscaler(
        min_replicas=int(spec["minReplicaCount"]),
        max_replicas=int(spec["maxReplicaCount"]),
        targets=targets,
        scale_up=_rules(behavior["scaleUp"]),
        scale_down=_rules(behavior["scaleDown"]),
        due_cap=cap or 10**9,
    )


def shipped_autoscaler(path: Path = KEDA_POSTGRES) -> Autoscaler:
    with path.open() as f:
        return from_scaled_object(yaml.safe_load(f))


def alert_threshold(path: Path = ALERT_RULES) -> float:
    """PgfleetBacklogAgeHigh's threshold in seconds (``... > N``)."""
    with path.open() as f:
        groups = yaml.safe_load(f)["groups"]
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == "PgfleetBacklogAgeHigh":
                return float(str(rule["expr"]).rsplit(">", 1)[1])
    raise ValueError(f"{path}: no PgfleetBacklogAgeHigh rule")


class Hpa:
    """The replica decisions of one HorizontalPodAutoscaler, as the controller makes them."""

    def __init__(self, config: Autoscaler, replicas: int) -> None:
        self.config = config
        self.replicas = replicas
        self.recommendations: list[tuple[float, int]] = []
        self.up_events: list[tuple[float, int]] = []
        self.down_events: list[tuple[float, int]] = []

    def proposal(self, metrics: Mapping[str, float]) -> int:
        """The largest replica count any metric asks for (before behaviour)."""
        current = self.replicas
        best = 0
        for name, value in metrics.items():
            target = self.config.targets[name]
            ratio = value / (target * current)
            if abs(1.0 - ratio) <= self.config.tolerance:
                wanted = current
            else:
                wanted = math.ceil(value / target)
            best = max(best, wanted)
        return best

    def _stabilize(self, now: float, desired: int) -> int:
        up_cut = now - self.config.scale_up.stabilization
        down_cut = now - self.config.scale_down.stabilization
        up, down = desired, desired
        for at, rec in self.recommendations:
            if at > up_cut:
                up = min(up, rec)
            if at > down_cut:
                down = max(down, rec)
        keep = max(self.config.scale_up.stabilization, self.config.scale_down.stabilization)
        self.recommendations = [(a, r) for a, r in self.recommendations if a > now - keep]
        self.recommendations.append((now, desired))
        return min(max(self.replicas, up), down)

    @staticmethod
    def _changed(events: list[tuple[float, int]], now: float, period: int) -> int:
        return sum(n for at, n in events if at > now - period)

    def _up_limit(self, now: float) -> int:
        rules = self.config.scale_up
        if rules.select == "Disabled":
            return self.replicas
        limits = []
        for p in rules.policies:
            start = (
                self.replicas
                - self._changed(self.up_events, now, p.period)
                + self._changed(self.down_events, now, p.period)
            )
            if p.type == "Pods":
                limits.append(start + p.value)
            else:
                limits.append(math.ceil(start * (1 + p.value / 100)))
        return min(limits) if rules.select == "Min" else max(limits)

    def _down_limit(self, now: float) -> int:
        rules = self.config.scale_down
        if rules.select == "Disabled":
            return self.replicas
        limits = []
        for p in rules.policies:
            start = (
                self.replicas
                + self._changed(self.down_events, now, p.period)
                - self._changed(self.up_events, now, p.period)
            )
            if p.type == "Pods":
                limits.append(start - p.value)
            else:
                limits.append(int(start * (1 - p.value / 100)))
        # Scaling down, "Max" means the biggest change: the lowest limit.
        return max(limits) if rules.select == "Min" else min(limits)

    def sync(self, now: float, metrics: Mapping[str, float]) -> int:
        """One controller sync: the new replica count."""
        cfg = self.config
        desired = self._stabilize(now, self.proposal(metrics))
        current = self.replicas
        if desired > current:
            desired = min(desired, cfg.max_replicas, max(self._up_limit(now), current))
        elif desired < current:
            desired = max(desired, cfg.min_replicas, min(self._down_limit(now), current))
        desired = min(max(desired, cfg.min_replicas), cfg.max_replicas)
        if desired > current:
            self.up_events.append((now, desired - current))
        elif desired < current:
            self.down_events.append((now, current - desired))
        keep = max([p.period for p in cfg.scale_up.policies + cfg.scale_down.policies] + [0])
        self.up_events = [e for e in self.up_events if e[0] > now - keep]
        self.down_events = [e for e in self.down_events if e[0] > now - keep]
        self.replicas = desired
        return desired


@dataclass(frozen=True)
class Workload:
    """Arrivals and what one replica drains."""

    #: (start second, jobs/s) steps; the last one lasts until the end.
    profile: tuple[tuple[float, float], ...]
    duration: int
    #: Jobs/s one ready replica drains.
    per_replica_rate: float
    #: Seconds from a pod's creation to its first claim.
    startup: int = 30
    #: Seconds the signal lags the database (0: the postgresql trigger queries it).
    metric_lag: int = 0
    #: Handler slots per replica (PGFLEET_CONCURRENCY): a replica draining at its full
    #: rate holds this many jobs running.
    concurrency: int = 16
    label: str = ""

    def rate_at(self, t: float) -> float:
        rate = 0.0
        for start, r in self.profile:
            if t >= start:
                rate = r
        return rate


@dataclass
class Step:
    t: int
    rate: float
    replicas: int
    ready: int
    #: Jobs finished in this second.
    drained: float
    #: Due jobs waiting, jobs running, oldest due age (end of the second).
    backlog: float
    running: float
    age: float
    #: What the triggers returned at the last HPA sync.
    slots_signal: float
    age_signal: float


@dataclass
class Simulation:
    workload: Workload
    config: Autoscaler
    steps: list[Step] = field(default_factory=list)

    @property
    def max_age(self) -> float:
        return max(s.age for s in self.steps)

    @property
    def max_replicas(self) -> int:
        return max(s.replicas for s in self.steps)

    def replica_changes(self) -> list[tuple[int, int]]:
        """(second, replicas) at the start and at every change."""
        out: list[tuple[int, int]] = []
        for s in self.steps:
            if not out or out[-1][1] != s.replicas:
                out.append((s.t, s.replicas))
        return out


def simulate(config: Autoscaler, workload: Workload, initial: int | None = None) -> Simulation:
    """One-second steps of arrivals, draining and (every sync period) the HPA."""
    replicas = config.min_replicas if initial is None else initial
    hpa = Hpa(config, replicas)
    # Ready times of the pods, oldest first; scale-in removes the newest.
    pods: list[float] = [-float(workload.startup)] * replicas
    backlog: deque[list[float]] = deque()  # [became due at, jobs]
    history: list[tuple[float, float, float]] = []  # (due, running, oldest age)
    sim = Simulation(workload, config)
    signals = {DUE: 0.0, AGE: 0.0}
    for t in range(workload.duration):
        rate = workload.rate_at(t)
        if rate > 0:
            backlog.append([float(t), rate])
        ready = sum(1 for at in pods if at <= t)
        capacity = ready * workload.per_replica_rate
        drained = 0.0
        while drained < capacity and backlog:
            head = backlog[0]
            take = min(capacity - drained, head[1])
            head[1] -= take
            drained += take
            if head[1] <= 1e-9:
                backlog.popleft()
        due = sum(c[1] for c in backlog)
        # Busy slots: the share of the ready replicas' rate in use, times their slots
        # (Little's law for handlers that take concurrency / rate seconds each).
        running = drained / workload.per_replica_rate * workload.concurrency
        # Age of the oldest job still waiting at the end of this second.
        age = (t + 1 - backlog[0][0]) if backlog else 0.0
        history.append((due, running, age))
        if t % config.sync_period == 0:
            seen = history[max(0, len(history) - 1 - workload.metric_lag)]
            signals = {
                DUE: float(
                    (math.ceil(seen[1]) if config.count_running else 0)
                    + min(math.floor(seen[0]), config.due_cap)
                ),
                AGE: float(math.ceil(seen[2])),
            }
            new = hpa.sync(float(t), {k: v for k, v in signals.items() if k in config.targets})
            if new > len(pods):
                pods.extend([float(t + workload.startup)] * (new - len(pods)))
            elif new < len(pods):
                del pods[new:]
        sim.steps.append(
            Step(t, rate, len(pods), ready, drained, due, running, age, signals[DUE], signals[AGE])
        )
    return sim


# ------------------------------------------------------------------ inputs


def measured_drain_rate(drain_doc: dict[str, Any], concurrency: int = 16) -> float | None:
    """Jobs/s of one worker process at this concurrency in a drain scenario's points."""
    for p in drain_doc.get("points", []):
        if (
            p.get("processes") == 1
            and p.get("concurrency") == concurrency
            and p.get("drain_seconds")
            and p.get("jobs_done")
        ):
            return float(p["jobs_done"]) / float(p["drain_seconds"])
    return None


def load_profile(sustained: float, burst: float) -> tuple[tuple[float, float], ...]:
    """An hour: sustained traffic, a 10-minute burst, sustained again, a 3-minute burst
    at half the rate, sustained, then idle for the last 12 minutes."""
    return (
        (0, sustained),
        (600, burst),
        (1200, sustained),
        (2100, burst / 2),
        (2280, sustained),
        (2880, 0.0),
    )


def default_workloads(per_replica_rate: float, concurrency: int = 16) -> list[Workload]:
    """The report's two workloads: no-op handlers, and handlers of 50 ms."""
    # The load tests' own rates: the soak's sustained rate, the top steady rate.
    from loadtest.scenarios import PROFILES

    steady = PROFILES["full"]["steady"]
    soak = PROFILES["full"]["soak"]
    profile = load_profile(float(soak.rate), float(max(steady.rates)))
    slow = min(per_replica_rate, concurrency / 0.05)
    return [
        Workload(
            profile,
            3600,
            per_replica_rate,
            concurrency=concurrency,
            label="no-op handlers (measured drain rate)",
        ),
        Workload(
            profile,
            3600,
            slow,
            concurrency=concurrency,
            label="50 ms handlers (concurrency / 0.05 s)",
        ),
    ]


def describe(sim: Simulation) -> str:
    changes = ", ".join(f"{t}s:{n}" for t, n in sim.replica_changes())
    return (
        f"{sim.workload.label}: {sim.workload.per_replica_rate:,.0f} jobs/s per replica; "
        f"replicas at most {sim.max_replicas}, backlog age at most {sim.max_age:.0f} s; "
        f"replica count over time {changes}"
    )


# ------------------------------------------------------------------ report


def report_section(rep: Any, drain_doc: dict[str, Any]) -> None:
    """The capacity report's "Autoscaling on Kubernetes" section and plot."""
    import matplotlib.pyplot as plt

    rate = measured_drain_rate(drain_doc)
    if rate is None:
        return
    config = shipped_autoscaler()
    threshold = alert_threshold()
    sims = [simulate(config, w) for w in default_workloads(rate)]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for sim, style in zip(sims, ("-", "--"), strict=False):
        t = [s.t / 60 for s in sim.steps]
        axes[1].plot(t, [s.replicas for s in sim.steps], style, label=sim.workload.label)
        axes[2].plot(t, [s.age for s in sim.steps], style, label=sim.workload.label)
    first = sims[0].steps
    axes[0].plot([s.t / 60 for s in first], [s.rate for s in first], color="tab:gray")
    axes[0].set_ylabel("arrivals (jobs/s)")
    axes[1].set_ylabel("worker replicas")
    axes[1].axhline(config.max_replicas, color="tab:red", linestyle=":", label="maxReplicaCount")
    axes[2].axhline(threshold, color="tab:red", label="backlog alert threshold")
    axes[2].set_ylabel("oldest due job age (s)")
    axes[2].set_yscale("symlog", linthresh=1)
    axes[2].set_xlabel("minutes")
    for a in axes:
        a.grid(True, alpha=0.3)
        a.set_ylim(bottom=0)
    axes[1].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    axes[0].set_title("KEDA keda-postgres defaults: simulated HPA")
    ok = all(s.max_age < threshold for s in sims)
    rep.check(
        "autoscaling: simulated backlog age stays under the alert threshold",
        ok,
        "; ".join(f"{s.workload.label}: at most {s.max_age:.0f} s" for s in sims)
        + f" (threshold {threshold:g} s)",
    )
    rep.headline["autoscaling"] = {
        "per_replica_rate": round(rate),
        "max_replicas": [s.max_replicas for s in sims],
        "max_age_s": [round(s.max_age, 1) for s in sims],
    }
    up = ", ".join(f"{p.type} {p.value}/{p.period}s" for p in config.scale_up.policies)
    down = ", ".join(f"{p.type} {p.value}/{p.period}s" for p in config.scale_down.policies)
    rep.add(
        "## Autoscaling on Kubernetes (simulated)",
        "",
        f"The keda-postgres overlay's defaults: {config.min_replicas}..{config.max_replicas} "
        f"replicas, {json.dumps(config.targets)} per replica, scale-up {up} "
        f"(stabilisation {config.scale_up.stabilization} s), scale-down {down} "
        f"(stabilisation {config.scale_down.stabilization} s); HPA sync every "
        f"{config.sync_period} s, new pods drain after 30 s. One replica drained "
        f"**{rate:,.0f} jobs/s** in the drain scenario (one process, concurrency 16). "
        "The load: the soak's sustained rate, a 10-minute burst at the highest steady "
        "rate, a shorter one at half of it, then nothing "
        "(`loadtest/autoscale.py`; `tests/kubernetes` checks the same numbers).",
        "",
        *(f"- {describe(s)}" for s in sims),
        "",
    )
    rep.figure(fig, "autoscaling.png", "simulated replicas and backlog age under KEDA")
