"""Reading Locust's CSV output (``--csv PREFIX``): ``PREFIX_stats.csv`` has one row
per (type, name) plus ``Aggregated``; response times are milliseconds."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from loadtest.users import batch_of


@dataclass(frozen=True)
class Row:
    type: str
    name: str
    requests: int
    failures: int
    rps: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    @property
    def batch(self) -> int | None:
        return batch_of(self.name)


def _num(value: str) -> float:
    try:
        return float(value)
    except ValueError:  # "N/A" when there was no request
        return 0.0


def read_stats(prefix: Path) -> list[Row]:
    """Every row of ``PREFIX_stats.csv``, the Aggregated one last."""
    path = prefix.parent / f"{prefix.name}_stats.csv"
    with path.open(newline="") as f:
        return [
            Row(
                type=r["Type"],
                name=r["Name"],
                requests=int(r["Request Count"]),
                failures=int(r["Failure Count"]),
                rps=_num(r["Requests/s"]),
                mean_ms=_num(r["Average Response Time"]),
                p50_ms=_num(r["50%"]),
                p95_ms=_num(r["95%"]),
                p99_ms=_num(r["99%"]),
                max_ms=_num(r["Max Response Time"]),
            )
            for r in csv.DictReader(f)
        ]


@dataclass(frozen=True)
class Summary:
    requests: int
    failures: int
    jobs: int  # jobs carried by successful requests (batch size from the name)
    rps: float
    jobs_per_s: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float


def summarize(prefix: Path) -> Summary:
    rows = read_stats(prefix)
    total = next(r for r in rows if r.name == "Aggregated")
    named = [r for r in rows if r.name != "Aggregated"]
    jobs = sum((r.requests - r.failures) * (r.batch or 1) for r in named)
    jobs_rate = sum(r.rps * (r.batch or 1) for r in named)
    return Summary(
        requests=total.requests,
        failures=total.failures,
        jobs=jobs,
        rps=total.rps,
        jobs_per_s=jobs_rate,
        mean_ms=total.mean_ms,
        p50_ms=total.p50_ms,
        p95_ms=total.p95_ms,
        p99_ms=total.p99_ms,
    )
