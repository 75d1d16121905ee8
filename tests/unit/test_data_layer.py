"""Only the data layer (pgfleet/db/) executes SQL: every other module calls a
``Store`` method, so rows, parameters and driver errors are handled in one place."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from pathlib import Path

from pgfleet import JobStatus
from pgfleet.db.store import claimed_job

PACKAGE = Path(__file__).resolve().parents[2] / "pgfleet"

#: asyncpg's statement-running methods, called on anything.
CALL = re.compile(r"\.(fetch|fetchrow|fetchval|execute|executemany|copy_\w+)\(")

#: Calls that match the pattern but run no SQL.
NOT_SQL = re.compile(r"contextvars\.copy_context\(")

ALLOWED: set[str] = set()  # keep it empty: pgfleet/db/ alone runs SQL


def _in_data_layer(relative: str) -> bool:
    return relative.startswith("db/")


def test_only_the_data_layer_executes_sql() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if _in_data_layer(relative) or relative in ALLOWED:
            continue
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            if CALL.search(NOT_SQL.sub("", line)):
                offenders.append(f"pgfleet/{relative}:{number}: {line.strip()}")
    assert not offenders, "SQL executed outside pgfleet/db/ (use pgfleet.db.store.Store):\n" + (
        "\n".join(offenders)
    )


def test_the_allowlist_names_existing_files() -> None:
    # An entry left behind after its file was converted or moved hides nothing,
    # but says something false.
    assert all((PACKAGE / relative).exists() for relative in ALLOWED)


def test_the_pattern_sees_the_calls_it_must() -> None:
    for line in (
        "await conn.fetch(sql)",
        "await self._pool.fetchrow(Q.job_get.sql, uid)",
        "rows = await pool.fetchval(sql)",
        "await conn.execute(sql)",
        "await conn.executemany(sql, rows)",
        "await conn.copy_records_to_table('jobs', records=rows)",
    ):
        assert CALL.search(line), line
    assert not CALL.search(NOT_SQL.sub("", "ctx = contextvars.copy_context()"))


def test_a_claimed_row_becomes_a_running_job_of_the_claiming_worker() -> None:
    worker, token = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)
    row: dict[str, object] = {
        "claimed": True,
        "id": uuid.uuid4(),
        "name": "send",
        "payload": '{"to": "a@b"}',
        "attempt": 1,
        "max_attempts": 3,
        "priority": 0,
        "queue_name": None,
        "job_key": "k",
        "run_at": now,
        "created_at": now,
        "started_at": now,
        "last_error": None,
        "lock_token": token,
    }
    job = claimed_job(row, worker)  # type: ignore[arg-type]  # a Record reads the same
    assert job.status is JobStatus.RUNNING
    assert job.payload == {"to": "a@b"}
    assert (job.worker_id, job.lock_token, job.finished_at) == (worker, token, None)
    assert (job.name, job.attempt, job.job_key) == ("send", 1, "k")
