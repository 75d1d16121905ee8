"""The last write of Locust's CSVs.

Locust rewrites ``PREFIX_stats.csv`` and ``PREFIX_failures.csv`` once a second
while it runs but not at shutdown, so the files miss up to the last second of
requests. After Locust closed them (at interpreter exit), this writes both once
more from the final statistics, with Locust's own formatter and columns.
"""

from __future__ import annotations

import atexit
import csv
from typing import Any


def _write_final(environment: Any, prefix: str) -> None:
    from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

    writer = StatsCSV(environment, PERCENTILES_TO_REPORT)
    with open(f"{prefix}_stats.csv", "w", newline="") as f:
        writer.requests_csv(csv.writer(f))
    with open(f"{prefix}_failures.csv", "w", newline="") as f:
        writer.failures_csv(csv.writer(f))


def on_quitting(environment: Any, **_kw: Any) -> None:
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if prefix:
        atexit.register(_write_final, environment, prefix)


def install(events: Any) -> None:
    events.quitting.add_listener(on_quitting)
