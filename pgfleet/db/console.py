"""Loads ``console.sql``: the operator console's queries, checked like ``queries.sql``."""

from __future__ import annotations

from importlib import resources

from pgfleet.db.queries import Query, parse


class ConsoleQueries:
    """Attribute access to the console's queries; one attribute per named block."""

    console_jobs_page: Query
    console_jobs_window_end: Query
    console_now: Query
    console_leases: Query
    console_dead_count: Query
    console_retry_dead: Query
    console_cancel_dead: Query
    console_worker_jobs: Query
    console_crons: Query

    def __init__(self, loaded: dict[str, Query]) -> None:
        declared = set(type(self).__annotations__)
        missing = declared - loaded.keys()
        extra = loaded.keys() - declared
        if missing or extra:
            raise ImportError(
                f"console.sql and ConsoleQueries disagree: missing {sorted(missing)}, "
                f"undeclared {sorted(extra)}"
            )
        for key, query in loaded.items():
            setattr(self, key, query)


def _load() -> ConsoleQueries:
    text = resources.files("pgfleet.db").joinpath("console.sql").read_text("utf-8")
    return ConsoleQueries(parse(text))


CQ = _load()
