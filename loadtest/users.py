"""What every enqueueing Locust user shares: its options, its pacing and the job budget.

Runs inside Locust (gevent), but imports neither gevent nor a database driver, so
the harness's tests can exercise the arithmetic directly.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NOTIFY_MODES = ("transaction", "coalesced", "off")


def add_arguments(parser: Any) -> None:
    """Locust command-line options of the pgfleet users (``LOCUST_*`` variables too)."""
    parser.add_argument(
        "--job-name",
        "--job-kind",  # the old spelling
        dest="job_name",
        default="noop",
        env_var="LOCUST_JOB_NAME",
        help="job name to enqueue (worker.app's jobs: noop, sleep, cpu, ...)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=10,
        env_var="LOCUST_BATCH_SIZE",
        help="jobs per request / transaction (1: the single-job form)",
    )
    parser.add_argument(
        "--target-rate",
        type=float,
        default=0.0,
        env_var="LOCUST_TARGET_RATE",
        help="jobs per second for the whole run, spread over the users (0: as fast as possible)",
    )
    parser.add_argument(
        "--total-jobs",
        type=int,
        default=0,
        env_var="LOCUST_TOTAL_JOBS",
        help="stop the run once this many jobs were enqueued (0: no limit; one process only)",
    )
    parser.add_argument(
        "--notify",
        choices=NOTIFY_MODES,
        default="coalesced",
        env_var="LOCUST_NOTIFY",
        help="database user: notify per transaction, coalesced after commits, or off",
    )
    parser.add_argument(
        "--dsn",
        default=os.environ.get("PGFLEET_DATABASE_URL", ""),
        env_var="LOCUST_DSN",
        help="database user: the pgfleet database (default PGFLEET_DATABASE_URL)",
    )
    parser.add_argument(
        "--api-token",
        default=os.environ.get("PGFLEET_API_TOKEN", ""),
        env_var="LOCUST_API_TOKEN",
        is_secret=True,
        help="HTTP user: bearer token of the jobs API (default PGFLEET_API_TOKEN)",
    )
    parser.add_argument(
        "--max-failure-ratio",
        type=float,
        default=0.01,
        env_var="LOCUST_MAX_FAILURE_RATIO",
        help="exit non-zero when more than this fraction of requests failed",
    )
    parser.add_argument(
        "--max-p95-ms",
        type=float,
        default=0.0,
        env_var="LOCUST_MAX_P95_MS",
        help="exit non-zero when the aggregated 95th percentile exceeds this (0: no bound)",
    )
    parser.add_argument(
        "--max-p99-ms",
        type=float,
        default=0.0,
        env_var="LOCUST_MAX_P99_MS",
        help="exit non-zero when the aggregated 99th percentile exceeds this (0: no bound)",
    )


def request_name(prefix: str, batch: int) -> str:
    """The Locust name of a request: the report reads the batch size back from it."""
    return f"{prefix} batch={batch}"


def batch_of(name: str) -> int | None:
    """The batch size a :func:`request_name` carries, or None."""
    _, sep, tail = name.rpartition(" batch=")
    return int(tail) if sep and tail.isdigit() else None


class Pacer:
    """Constant pacing on an absolute schedule: a user that falls behind skips the
    missed slots instead of bursting to catch up, so the offered rate never
    exceeds the target."""

    def __init__(self, period: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.period = period
        self._clock = clock
        # A random phase spreads users over the period instead of firing together.
        self._next = clock() + random.random() * period

    def wait(self) -> float:
        if self.period <= 0:
            return 0.0
        now = self._clock()
        self._next += self.period
        if self._next < now - self.period:
            self._next = now
        return max(0.0, self._next - now)


def user_period(target_rate: float, batch: int, users: int) -> float:
    """Seconds between one user's requests so that ``users`` of them offer
    ``target_rate`` jobs per second in batches of ``batch``."""
    if target_rate <= 0:
        return 0.0
    return max(1, users) * batch / target_rate


@dataclass
class Budget:
    """The jobs left when a run is limited by ``--total-jobs`` (shared by the users
    of one Locust process: greenlets never preempt each other mid-method)."""

    remaining: int | None
    active: int = 0

    def take(self, batch: int) -> int:
        """How many jobs the next request carries (0: the budget is spent)."""
        if self.remaining is None:
            return batch
        n = min(batch, self.remaining)
        self.remaining -= n
        return n


def job_bodies(name: str, n: int, seq: int) -> list[dict[str, Any]]:
    """``n`` HTTP job objects. The payload is small and varies, like real ones."""
    return [{"name": name, "payload": {"n": seq + i}} for i in range(n)]


@dataclass(frozen=True)
class Settings:
    job_name: str
    batch: int
    target_rate: float
    total_jobs: int
    notify: str
    dsn: str
    api_token: str

    @classmethod
    def from_options(cls, options: Any) -> Settings:
        if options.batch_size < 1:
            raise ValueError(f"--batch-size must be at least 1, got {options.batch_size}")
        return cls(
            job_name=options.job_name,
            batch=options.batch_size,
            target_rate=options.target_rate,
            total_jobs=options.total_jobs,
            notify=options.notify,
            dsn=options.dsn,
            api_token=options.api_token,
        )
