"""Loads ``console.sql``: the operator console's queries, checked like ``queries.sql``."""

from __future__ import annotations

from pgfleet.db.queries import Query, QueryFile


class ConsoleQueries(QueryFile):
    """Attribute access to the console's queries; one attribute per named block."""

    FILE = "console.sql"

    console_jobs_page: Query
    console_jobs_window_end: Query
    console_now: Query
    console_leases: Query
    console_dead_count: Query
    console_retry_dead: Query
    console_cancel_dead: Query
    console_worker_jobs: Query
    console_crons: Query


CQ = ConsoleQueries.load()
