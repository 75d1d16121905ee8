"""Loads ``queries.sql`` once at import: every runtime query, by name, with its shape.

The names are declared on :class:`Queries` so that a typo is a type error, and the
loader refuses to import when the file and the declarations disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal, Self

Shape = Literal[":one", ":many", ":val", ":exec"]

_HEADER = re.compile(r"^--\s*name:\s*([a-z][a-z0-9_]*)\s+(:one|:many|:val|:exec)\s*$")
_FRAGMENT = re.compile(r"^--\s*fragment:\s*([a-z][a-z0-9_]*)\s*$")
_INCLUDE = re.compile(r"^--\s*include:\s*([a-z][a-z0-9_]*)\s*$")


@dataclass(frozen=True, slots=True)
class Query:
    name: str
    shape: Shape
    sql: str


def expand(text: str) -> str:
    """The file's text with its fragments spliced in: a ``-- fragment: x`` block
    (up to the next fragment or query) is text shared by several queries, and a
    line ``-- include: x`` stands for it. Spliced once, at load, from the file's
    own text (never from anything given at run time), so every query stays one
    static string. A fragment must come before what includes it, and one nothing
    includes is an error (it would drift)."""
    fragments: dict[str, list[str]] = {}
    used: set[str] = set()
    out: list[str] = []
    into = out
    for line in text.splitlines():
        stripped = line.strip()
        opens = _FRAGMENT.match(stripped)
        include = _INCLUDE.match(stripped)
        if opens:
            key = opens.group(1)
            if key in fragments:
                raise ValueError(f"fragment {key!r} is defined twice in queries.sql")
            into = fragments[key] = []
        elif include:
            key = include.group(1)
            if key not in fragments:
                raise ValueError(
                    f"{key!r} is included but is not a fragment defined above it in queries.sql"
                )
            used.add(key)
            into.extend("\n".join(fragments[key]).strip("\n").splitlines())
        else:
            if _HEADER.match(stripped):
                into = out
            into.append(line)
    unused = fragments.keys() - used
    if unused:
        raise ValueError(f"fragments {sorted(unused)} in queries.sql are never included")
    return "\n".join(out)


def _body_comments_dropped(lines: list[str]) -> list[str]:
    """A statement's lines without the whole-line comments of its body: its leading
    comment (what it is, as ``pg_stat_activity`` shows it) stays. The server parses
    less, and the claim statement fits asyncpg's statement cache with room to spare
    (its cap counts comments)."""
    kept: list[str] = []
    in_body = False
    for line in lines:
        is_comment = line.lstrip().startswith("--")
        if in_body and is_comment:
            continue
        in_body = in_body or bool(line.strip() and not is_comment)
        kept.append(line)
    return kept


def parse(text: str) -> dict[str, Query]:
    """Split a file of ``-- name: x :shape`` blocks into queries (its fragments
    spliced in first: see :func:`expand`)."""
    found: dict[str, Query] = {}
    name: str | None = None
    shape: Shape = ":exec"
    lines: list[str] = []

    def flush() -> None:
        if name is None:
            return
        sql = "\n".join(_body_comments_dropped(lines)).strip().rstrip(";").strip()
        if not sql:
            raise ValueError(f"query {name!r} in queries.sql is empty")
        found[name] = Query(name, shape, sql)

    for line in expand(text).splitlines():
        match = _HEADER.match(line.strip())
        if match:
            flush()
            name = match.group(1)
            if name in found:
                raise ValueError(f"query {name!r} is defined twice in queries.sql")
            shape = match.group(2)  # type: ignore[assignment]
            lines = []
        elif name is not None:
            lines.append(line)
    flush()
    return found


class QueryFile:
    """A ``.sql`` file of named queries and the class declaring them: one annotated
    attribute per named block, checked at import so that neither can drift."""

    FILE = ""

    def __init__(self, loaded: dict[str, Query]) -> None:
        declared = set(type(self).__annotations__)
        missing = declared - loaded.keys()
        extra = loaded.keys() - declared
        if missing or extra:
            raise ImportError(
                f"{self.FILE} and {type(self).__name__} disagree: missing {sorted(missing)}, "
                f"undeclared {sorted(extra)}"
            )
        for key, query in loaded.items():
            setattr(self, key, query)

    @classmethod
    def load(cls) -> Self:
        text = resources.files("pgfleet.db").joinpath(cls.FILE).read_text("utf-8")
        return cls(parse(text))


class Queries(QueryFile):
    """Attribute access to the loaded queries; one attribute per named block."""

    job_insert: Query
    job_insert_notify: Query
    job_insert_plain: Query
    job_insert_plain_notify: Query
    job_insert_many_plain: Query
    job_insert_many: Query
    job_insert_keyed_dedupe: Query
    job_insert_keyed_replace: Query
    job_insert_keyed_preserve_run_at: Query
    job_ids_by_active_key: Query
    notify_jobs: Query
    notify_wakeup: Query
    job_get: Query
    job_status_get: Query
    job_status_many: Query
    job_list_recent: Query
    job_count_by_status: Query
    job_count_queued: Query
    job_count_queued_by_names: Query
    job_cancel: Query
    job_await: Query
    job_get_many: Query
    job_cancels_of_worker: Query
    job_retry: Query
    job_reschedule: Query
    job_permanently_fail: Query
    job_complete: Query
    jobs_history_restore: Query
    jobs_history_move: Query
    jobs_history_prepare: Query
    jobs_history_drop: Query
    jobs_history_prune: Query
    job_prune_finished: Query
    limits_set: Query
    limits_set_default: Query
    limits_clear: Query
    limits_list: Query
    pause_name: Query
    pause_queue: Query
    resume_name: Query
    resume_queue: Query
    paused_list: Query
    jobs_waiting_on_limit: Query
    worker_list: Query
    worker_force_unlock: Query
    job_complete_and_claim: Query
    job_complete_and_claim_lean: Query
    worker_heartbeat: Query
    worker_deregister: Query
    job_rescue: Query
    ping: Query
    claim_session_begin: Query
    claim_session_end: Query
    claim_transaction_begin: Query
    claim_transaction_commit: Query
    claim_transaction_rollback: Query
    job_next_due: Query
    job_release_unknown: Query
    queue_stats: Query
    workers_alive: Query
    jobs_table_health: Query
    jobs_vacuum: Query
    jobs_analyze: Query
    lease_acquire: Query
    lease_release: Query
    cron_now: Query
    cron_register: Query
    cron_get: Query
    cron_advance: Query
    cron_record_job: Query
    job_insert_waiting: Query
    job_dependencies_link: Query
    job_settle_new: Query
    batch_progress: Query
    job_parents: Query
    job_children: Query
    job_count_waiting: Query

    FILE = "queries.sql"


Q = Queries.load()
