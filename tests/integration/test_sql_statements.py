"""pgfleet.sql: Queue's enqueue statements for a driver of one's own (loadtest's
psycopg under gevent). Run here on a bare asyncpg connection: what they insert is
what Queue would have, and a worker runs it."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, InvalidName, InvalidOptions, Queue
from pgfleet.db.types import Connection
from pgfleet.sql import enqueue_statements, wakeup
from tests.helpers import listening, notifications_before_marker


async def _run(conn: Connection, requests: list[EnqueueRequest], notify: bool) -> list[uuid.UUID]:
    plan = enqueue_statements(requests, notify=notify)
    async with conn.transaction():
        for statement in plan.statements:
            await conn.execute(statement.sql, *statement.args)
    return plan.ids


@pytest.mark.parametrize("size", [1, 3])
@pytest.mark.parametrize("notify", [False, True])
async def test_the_statements_enqueue_what_queue_would(
    pool: asyncpg.Pool, database: str, size: int, notify: bool
) -> None:
    requests = [EnqueueRequest("email", {"n": i}) for i in range(size)]
    async with listening(database) as listener, pool.acquire() as conn:
        ids = await _run(conn, requests, notify)
        assert await notifications_before_marker(listener, pool) == (1 if notify else 0)
    queue = Queue(pool)
    jobs = [await queue.get(job_id) for job_id in ids]
    assert [(j.name, j.payload, j.status.value) for j in jobs if j] == [
        ("email", {"n": i}, "queued") for i in range(size)
    ]
    reference = await queue.get(await queue.enqueue("email", {"n": 0}))
    assert reference is not None and jobs[0] is not None
    assert jobs[0].max_attempts == reference.max_attempts
    assert jobs[0].priority == reference.priority


async def test_an_empty_batch_has_no_statements() -> None:
    assert enqueue_statements([]).statements == []


def test_only_default_options_and_valid_names() -> None:
    with pytest.raises(InvalidOptions):
        enqueue_statements([EnqueueRequest("x", None, EnqueueOptions(priority=1))])
    with pytest.raises(InvalidName):
        enqueue_statements([EnqueueRequest("bad name", None)])
    assert wakeup().args == ()
