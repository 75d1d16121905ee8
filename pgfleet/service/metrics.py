"""Prometheus metrics of a pgfleet process.

Per-process series (counters, histograms, the active-jobs gauge) come from runtime
events and cost a few dictionary operations on the event loop: the claim loop never
waits on an exporter. Queue-level gauges (queued, scheduled, running, oldest age,
dead, workers alive) come from the database at scrape time and are exported only by
the holder of the fleet's ``metrics`` lease, so a fleet of replicas scraped together
reports each job name once.

Labels are the job name (the label is called ``kind``: the dashboards and alert
rules select on it), the outcome and the wakeup source: never job ids, payloads or
worker ids. Job names a producer sends are bounded too: at most
``PGFLEET_METRICS_MAX_NAMES`` (200) distinct names get series of their own,
names an application registers always do, and the rest share ``kind="_other"``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pgfleet._runtime.waiting import waiting_now
from pgfleet._version import __version__
from pgfleet.db.store import KindStats, Store
from pgfleet.db.types import Pool
from pgfleet.events import WorkerEvents
from pgfleet.jobs import Job
from pgfleet.limits import Paused
from pgfleet.service.process import env_default

log = logging.getLogger("pgfleet")

# The *_created series double the exposition for no dashboard or alert.
disable_created_metrics()  # type: ignore[no-untyped-call]

#: Handler wall time: 1 ms .. 1 h, so millisecond handlers and multi-minute ones
#: both land in resolving buckets.
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600,
)  # fmt: skip
#: Claim time minus due time: 1 ms .. 1 day, for a backlog of hours.
PICKUP_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400,
)  # fmt: skip

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The label of job names past the budget.
OTHER = "_other"


def default_max_names() -> int:
    """``PGFLEET_METRICS_MAX_NAMES``, 200 by default (0: no bound)."""
    value = env_default("METRICS_MAX_NAMES", "200")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"PGFLEET_METRICS_MAX_NAMES must be an integer, got {value!r}") from None
    if number < 0:
        raise ValueError(f"PGFLEET_METRICS_MAX_NAMES must be 0 or more, got {number}")
    return number


class NameLabels:
    """Job names as label values, at most ``limit`` distinct ones (0: no limit).

    Every job name becomes a series of each metric it labels; a producer that
    sends a new name per request (a typo loop, an id in the name, an attacker
    without --strict) would grow the scrape without bound. ``known`` names (the
    application's handlers) always get their own label; other names do while
    the budget lasts, then share ``_other``."""

    def __init__(
        self, limit: int | None = None, known: Iterable[str] = (), *, warn: bool = True
    ) -> None:
        self.limit = default_max_names() if limit is None else limit
        self._warn = warn
        self._known = frozenset(known)
        self._seen: set[str] = set()
        self.overflowed = False

    def __call__(self, name: str) -> str:
        if name in self._known or name in self._seen:
            return name
        if not self.limit or len(self._seen) < self.limit:
            self._seen.add(name)
            return name
        self.overflowed = True
        if self._warn:
            self._warn = False
            log.warning(
                "more than %d job names seen: further ones are counted under kind=%r "
                "(PGFLEET_METRICS_MAX_NAMES, or --strict with --app)",
                self.limit,
                OTHER,
            )
        return OTHER


class ProcessMetrics:
    """The per-process metrics, registered on one CollectorRegistry.

    Every pgfleet process counts what it enqueues; worker processes (``worker=True``)
    also carry the job, wakeup and slot series.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        worker: bool = True,
        names: NameLabels | None = None,
    ) -> None:
        self.registry = registry
        self.names = names or NameLabels()
        self.enqueued = Counter(
            "pgfleet_jobs_enqueued",
            "Jobs enqueued through this process.",
            ["kind"],
            registry=registry,
        )
        self.build = Gauge(
            "pgfleet_build_info", "pgfleet version of this process.", ["version"], registry=registry
        )
        self.build.labels(__version__).set(1)
        self.waiters = Gauge(
            "pgfleet_job_waiters",
            "Queue.wait calls (the API's long polls included) waiting now in this process.",
            registry=registry,
        )
        self.waiters.set_function(waiting_now)
        if worker:
            self._worker_series(registry)

    def _worker_series(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram(
            "pgfleet_job_duration_seconds",
            "Handler wall time per attempt, by job name and outcome.",
            ["kind", "outcome"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.pickup = Histogram(
            "pgfleet_job_pickup_delay_seconds",
            "Time from a job becoming due to a worker claiming it.",
            ["kind"],
            buckets=PICKUP_BUCKETS,
            registry=registry,
        )
        self.finished = Counter(
            "pgfleet_jobs_finished",
            "Job attempts finished, by outcome: succeeded, retried, snoozed (runs again "
            "later, no attempt used), failed, cancelled (cancelled while running, or taken "
            "away: outcome discarded), aborted (stopped at shutdown).",
            ["kind", "outcome"],
            registry=registry,
        )
        self.rescued = Counter(
            "pgfleet_jobs_rescued",
            "Jobs recovered from dead workers by this process (as leader).",
            registry=registry,
        )
        self.active = Gauge(
            "pgfleet_worker_active_jobs", "Handlers running in this process.", registry=registry
        )
        self.concurrency = Gauge(
            "pgfleet_worker_concurrency",
            "Handler slots of this process (active jobs can reach it).",
            registry=registry,
        )
        self.wakeups = Counter(
            "pgfleet_worker_wakeups",
            "Claim-loop wakeups by source: notify, poll, completion, reconnect.",
            ["source"],
            registry=registry,
        )
        self.leader = Gauge(
            "pgfleet_worker_leader",
            "1 while this process leads the fleet's maintenance (rescue, pruning).",
            registry=registry,
        )
        for source in ("notify", "poll", "completion", "reconnect"):
            self.wakeups.labels(source)

    def count_enqueued(self, name: str, count: int) -> None:
        """``Queue.on_enqueued`` hook."""
        self.enqueued.labels(self.names(name)).inc(count)


class WorkerMetrics(WorkerEvents):
    """Turns a worker's events into the per-process metrics."""

    def __init__(self, metrics: ProcessMetrics, active: Callable[[], int], concurrency: int):
        self.m = metrics
        self.m.active.set_function(active)
        self.m.concurrency.set(concurrency)
        # Label children are cached: the hot path does one dict lookup per event.
        self._pickup: dict[str, Any] = {}
        self._done: dict[tuple[str, str], tuple[Any, Any]] = {}

    def prime(self, names: Iterable[str]) -> None:
        """Create the series of every served job name so they exist before any job."""
        for name in names:
            self._pickup_for(name)
            for outcome in ("succeeded", "retried", "failed"):
                self._done_for(name, outcome)

    def _pickup_for(self, name: str) -> Any:
        child = self._pickup.get(name)
        if child is None:
            child = self._pickup[name] = self.m.pickup.labels(name)
        return child

    def _done_for(self, name: str, outcome: str) -> tuple[Any, Any]:
        pair = self._done.get((name, outcome))
        if pair is None:
            pair = self._done[name, outcome] = (
                self.m.duration.labels(name, outcome),
                self.m.finished.labels(name, outcome),
            )
        return pair

    def job_started(self, job: Job, pickup_delay: float) -> None:
        self._pickup_for(job.name).observe(max(pickup_delay, 0.0))

    def job_finished(self, job: Job, outcome: str, duration: float) -> None:
        histogram, counter = self._done_for(job.name, outcome)
        histogram.observe(duration)
        counter.inc()

    def wakeup(self, source: str) -> None:
        self.m.wakeups.labels(source).inc()

    def jobs_rescued(self, count: int) -> None:
        self.m.rescued.inc(count)

    def leader_changed(self, is_leader: bool) -> None:
        self.m.leader.set(1 if is_leader else 0)


class QueueStats(Collector):
    """Queue-level gauges from the database, refreshed right before each scrape.

    Every process that serves metrics (workers and API processes alike) carries
    one, and they compete for the ``metrics`` lease at scrape time: only the holder
    runs the query and exports the gauges, so replicas scraped together report each
    job name once, and the gauges outlive the loss of every worker as long as any
    process is scraped. ``refresh`` is async; ``collect`` (called synchronously by
    prometheus_client while rendering) yields the last result.
    """

    ROLE = "metrics"

    def __init__(
        self,
        pool: Pool,
        known_names: Iterable[str] = (),
        lease: float = 45.0,
        max_names: int | None = None,
    ):
        self._store = Store(pool)
        self._known = set(known_names)
        self._max_names = default_max_names() if max_names is None else max_names
        self._overflowed = False
        self._lease = lease
        self.holder = uuid.uuid4()
        self.holding = False
        self._rows: list[KindStats] | None = None
        self._alive: int = 0
        self._waiting: list[tuple[str, str, int]] = []
        self._paused: list[Paused] = []
        self._waiting_on_parents: dict[str, int] = {}
        self._took = 0.0

    async def refresh(self) -> None:
        start = time.perf_counter()
        try:
            async with self._store.acquire("queue metrics") as store:
                self.holding = await store.lease_acquire(
                    role=self.ROLE, holder=self.holder, lease_seconds=self._lease
                )
                if self.holding:
                    self._rows = await store.queue_stats()
                    self._alive = await store.workers_alive()
                    self._waiting = await store.jobs_waiting_on_limit()
                    self._paused = await store.paused_list()
                    self._waiting_on_parents = await store.job_count_waiting()
                else:
                    self._rows = None
        except Exception as exc:
            log.warning("queue-level metrics unavailable: %s", exc)
            self._rows = None
        self._took = time.perf_counter() - start

    async def release(self) -> None:
        """Give the lease up at shutdown so another process takes over at once."""
        if self.holding:
            with contextlib.suppress(Exception):
                await self._store.lease_release(role=self.ROLE, holder=self.holder)
            self.holding = False

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = self._rows
        if rows is None:
            return
        families = {
            "queued": GaugeMetricFamily(
                "pgfleet_jobs_queued", "Jobs runnable now (run_at <= now).", labels=["kind"]
            ),
            "scheduled": GaugeMetricFamily(
                "pgfleet_jobs_scheduled",
                "Queued jobs due later (delays, retry backoffs).",
                labels=["kind"],
            ),
            "running": GaugeMetricFamily(
                "pgfleet_jobs_running",
                "Jobs claimed and running (not those held ahead by prefetch).",
                labels=["kind"],
            ),
            "oldest_age": GaugeMetricFamily(
                "pgfleet_oldest_queued_job_age_seconds",
                "now - run_at of the oldest runnable job; 0 when none.",
                labels=["kind"],
            ),
            "dead": GaugeMetricFamily(
                "pgfleet_jobs_dead", "Failed jobs currently retained.", labels=["kind"]
            ),
        }
        seen = set()
        for name, values in self._bounded(rows).items():
            seen.add(name)
            for key, family in families.items():
                family.add_metric([name], values[key])
        for name in sorted(self._known - seen):
            for family in families.values():
                family.add_metric([name], 0.0)
        yield from families.values()
        waiting = GaugeMetricFamily(
            "pgfleet_jobs_waiting_on_limit",
            "Due jobs held back by flow control, by reason: paused (the name or its queue), "
            "concurrency or rate (a limit that binds). Adding workers cannot run them.",
            labels=["kind", "reason"],
        )
        labels = NameLabels(self._max_names, self._known, warn=False)
        summed: dict[tuple[str, str], float] = {}
        for job_name, reason, count in self._waiting:
            label = (labels(job_name), reason)
            summed[label] = summed.get(label, 0.0) + count
        for (kind, reason), total in sorted(summed.items()):
            waiting.add_metric([kind, reason], total)
        yield waiting
        paused = GaugeMetricFamily(
            "pgfleet_paused_seconds",
            "How long a job name (target=job_name) or a named queue (target=queue) has "
            "been paused.",
            labels=["target", "name"],
        )
        now = datetime.now(UTC)
        for p in self._paused:
            target = "job_name" if p.kind == "name" else "queue"
            paused.add_metric([target, p.name], max((now - p.paused_at).total_seconds(), 0.0))
        yield paused
        parents = GaugeMetricFamily(
            "pgfleet_jobs_waiting_on_parents",
            "Jobs enqueued with parents (after) that wait for them to finish; "
            "outside the runnable backlog.",
            labels=["kind"],
        )
        summed_parents: dict[str, float] = {}
        for name in sorted(self._waiting_on_parents, key=lambda n: (n not in self._known, n)):
            kind = labels(name)
            summed_parents[kind] = summed_parents.get(kind, 0.0) + self._waiting_on_parents[name]
        for kind, value in summed_parents.items():
            parents.add_metric([kind], value)
        yield parents
        yield GaugeMetricFamily(
            "pgfleet_workers_alive", "Registered workers with a live heartbeat.", value=self._alive
        )
        yield GaugeMetricFamily(
            "pgfleet_queue_collector_up",
            "1 on the one process exporting the queue-level gauges.",
            value=1,
        )
        yield GaugeMetricFamily(
            "pgfleet_queue_stats_query_seconds",
            "Time the queue-level query took at the last scrape.",
            value=self._took,
        )

    def _bounded(self, rows: list[KindStats]) -> dict[str, dict[str, float]]:
        """The rows by label: known names first, then the others by name while the
        budget lasts; the rest summed under ``_other`` (the oldest age: the largest)."""
        labels = NameLabels(self._max_names, self._known, warn=False)
        ordered = sorted(rows, key=lambda r: (r.name not in self._known, r.name))
        out: dict[str, dict[str, float]] = {}
        for row in ordered:
            label = labels(row.name)
            values = out.setdefault(label, dict.fromkeys(_STAT_KEYS, 0.0))
            for key in _STAT_KEYS:
                value = float(getattr(row, key))
                if key == "oldest_age":
                    values[key] = max(values[key], value)
                else:
                    values[key] += value
        if labels.overflowed and not self._overflowed:
            self._overflowed = True
            log.warning(
                "more than %d job names in the queue: the gauges sum the others under "
                "kind=%r (PGFLEET_METRICS_MAX_NAMES)",
                self._max_names,
                OTHER,
            )
        return out


_STAT_KEYS = ("queued", "scheduled", "running", "oldest_age", "dead")


def render(registry: CollectorRegistry) -> bytes:
    return bytes(generate_latest(registry))
