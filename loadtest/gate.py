"""The release gate: a run that failed too often or was too slow exits non-zero.

:func:`violations` is a pure function of the aggregated numbers so that it can be
tested without Locust; :func:`install` hooks it to ``events.quitting``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("pgfleet.loadtest")


@dataclass(frozen=True)
class Limits:
    max_failure_ratio: float
    max_p95_ms: float = 0.0
    max_p99_ms: float = 0.0


@dataclass(frozen=True)
class Totals:
    requests: int
    failures: int
    p95_ms: float
    p99_ms: float


def violations(totals: Totals, limits: Limits) -> list[str]:
    """What makes the run fail, in words (empty: it passes)."""
    problems: list[str] = []
    if totals.requests == 0:
        return ["no request completed"]
    ratio = totals.failures / totals.requests
    if ratio > limits.max_failure_ratio:
        problems.append(
            f"failure ratio {ratio:.2%} ({totals.failures}/{totals.requests}) "
            f"exceeds {limits.max_failure_ratio:.2%}"
        )
    for label, value, bound in (
        ("95th", totals.p95_ms, limits.max_p95_ms),
        ("99th", totals.p99_ms, limits.max_p99_ms),
    ):
        if bound > 0 and value > bound:
            problems.append(f"{label} percentile {value:.0f} ms exceeds {bound:.0f} ms")
    return problems


def on_quitting(environment: Any, **_kw: Any) -> None:
    options = environment.parsed_options
    limits = Limits(options.max_failure_ratio, options.max_p95_ms, options.max_p99_ms)
    total = environment.stats.total
    totals = Totals(
        requests=total.num_requests,
        failures=total.num_failures,
        p95_ms=total.get_response_time_percentile(0.95) or 0.0,
        p99_ms=total.get_response_time_percentile(0.99) or 0.0,
    )
    problems = violations(totals, limits)
    for problem in problems:
        log.error("load test gate: %s", problem)
    if problems:
        environment.process_exit_code = 1


def install(events: Any) -> None:
    events.quitting.add_listener(on_quitting)
