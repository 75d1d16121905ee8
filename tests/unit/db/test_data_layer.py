"""Only the data layer (pgfleet/db/) executes SQL: every other module calls a
``Store`` method, so rows, parameters and driver errors are handled in one place."""

from __future__ import annotations

import re
import uuid
from dataclasses import fields
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pgfleet import Job, JobStatus
from pgfleet.db.translate import (
    ROUND_COLUMNS,
    claimed_count,
    flow_active,
    flow_pace,
    round_result,
    round_signals,
)
from pgfleet.jobs import make_job

PACKAGE = Path(__file__).resolve().parents[3] / "pgfleet"

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


def _round_row(**values: object) -> tuple[object, ...]:
    """A row as ``job_complete_and_claim`` returns it (a Record unpacks the same)."""
    row: dict[str, object] = dict.fromkeys(ROUND_COLUMNS)
    row.update(values)
    return tuple(row.values())


def test_a_claimed_row_becomes_a_running_job_of_the_claiming_worker() -> None:
    worker, token = uuid.uuid4(), uuid.uuid4()
    now = datetime.now(UTC)
    epoch = now.timestamp()
    row = _round_row(
        claimed=True,
        held=False,
        id=uuid.uuid4(),
        name="send",
        payload='{"to": "a@b"}',
        attempt=1,
        max_attempts=3,
        priority=0,
        job_key="k",
        limit_key="tenant-7",
        run_at=epoch,
        created_at=epoch - 1.5,
        started_at=epoch,
        lock_token=token,
    )
    (job,), ahead, applied = round_result([row], worker)  # type: ignore[list-item]  # a Record unpacks the same
    assert (ahead, applied) == ([], set())
    assert job.status is JobStatus.RUNNING
    assert job.payload == {"to": "a@b"}
    assert (job.worker_id, job.lock_token, job.finished_at) == (worker, token, None)
    assert (job.name, job.attempt, job.job_key, job.limit_key) == ("send", 1, "k", "tenant-7")
    assert (job.run_at, job.started_at) == (now, now)
    assert job.created_at == now - timedelta(seconds=1.5)


def test_a_round_splits_into_jobs_to_start_held_jobs_in_claim_order_and_applied_outcomes() -> None:
    worker = uuid.uuid4()
    base = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    applied_id = uuid.uuid4()
    ids = sorted(uuid.uuid4() for _ in range(4))
    payloads = ['"s"', "[1, 2]", "null", '{"n": 1.5}']
    # (priority, run_at) of each held job; the statement returns them unordered.
    order = [(5, base + 2), (0, base + 9), (0, base + 1), (5, base + 2)]
    rows = [_round_row(claimed=False, id=applied_id)]
    for i, ((priority, run_at), payload) in enumerate(zip(order, payloads, strict=True)):
        rows.append(
            _round_row(
                claimed=True,
                held=True,
                id=ids[i],
                name="n",
                payload=payload,
                attempt=1,
                max_attempts=1,
                priority=priority,
                run_at=run_at,
                created_at=base,
                started_at=base,
                lock_token=uuid.uuid4(),
            )
        )
    now, ahead, applied = round_result(rows, worker)  # type: ignore[arg-type]  # a Record unpacks the same
    assert now == [] and applied == {applied_id}
    assert [j.id for j in ahead] == [ids[2], ids[1], ids[0], ids[3]]
    assert [j.payload for j in ahead] == [None, [1, 2], "s", {"n": 1.5}]
    assert {j.created_at for j in ahead} == {datetime(2026, 1, 1, tzinfo=UTC)}


@pytest.mark.parametrize(
    "markers",
    [(), ((True, 0.5),), ((False, None),), ((True, 0.001), (False, None), (True, 2.0))],
)
def test_round_signals_read_in_one_pass_what_the_three_readers_say(
    markers: tuple[tuple[bool, float | None], ...],
) -> None:
    rows = [_round_row(claimed=False, id=uuid.uuid4()) for _ in range(3)]
    rows += [
        _round_row(claimed=True, held=False, id=uuid.uuid4(), name="n", payload="1")
        for _ in range(2)
    ]
    for i, (held, wait) in enumerate(markers):  # flow control's rows, anywhere
        rows.insert(2 * i, _round_row(claimed=False, held=held, run_at=wait))
    assert round_signals(rows) == (claimed_count(rows), flow_pace(rows), flow_active(rows))  # type: ignore[arg-type]  # a Record unpacks the same
    assert round_signals(rows)[0] == 2  # type: ignore[arg-type]


def test_times_outside_what_a_datetime_holds_read_as_the_driver_reads_them() -> None:
    rows = [
        _round_row(
            claimed=True, held=False, id=uuid.uuid4(), name="n", payload="1", attempt=1,
            max_attempts=1, priority=0, run_at=float("-inf"), created_at=float("inf"),
            started_at=0.0, lock_token=uuid.uuid4(),
        )
    ]  # fmt: skip
    (job,), _, _ = round_result(rows, uuid.uuid4())  # type: ignore[arg-type]  # a Record unpacks the same
    assert job.run_at == datetime.min.replace(tzinfo=UTC)
    assert job.created_at == datetime.max.replace(tzinfo=UTC)
    assert job.started_at == datetime(1970, 1, 1, tzinfo=UTC)


def test_make_job_builds_the_same_job_as_the_dataclass() -> None:
    values = [object() for _ in fields(Job)]
    made = make_job(*values)
    assert made == Job(*values)  # type: ignore[arg-type]  # any values: only their places matter
    with pytest.raises(TypeError):
        make_job(*values[:-1])
