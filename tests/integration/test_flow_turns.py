"""Keys take turns by number (migration 0017), against a real Postgres: the turns
enqueues give, the front claims advance, the order claim_flow takes, and the
numbering of jobs queued before the migration."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import asyncpg

from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    Job,
    JobKeyMode,
    Queue,
    Registry,
    WorkerConfig,
    migrations,
)
from tests.integration.conftest import FAST, Recorder, running_worker
from tools.devkit import until

CLAIM = (
    "SELECT id, limit_key, priority, turn FROM pgfleet.claim_flow(gen_random_uuid(),"
    " ARRAY[$1::text], NULL, $2, $2, '{}'::uuid[])"
)


def _keyed(name: str, key: str | None, **options: Any) -> EnqueueRequest:
    return EnqueueRequest(name, {}, EnqueueOptions(limit_key=key, **options))


async def _turns(pool: asyncpg.Pool, ids: list[uuid.UUID]) -> list[int | None]:
    rows = await pool.fetch("SELECT id, turn FROM pgfleet.jobs WHERE id = ANY ($1::uuid[])", ids)
    by_id = {r["id"]: r["turn"] for r in rows}
    return [by_id[i] for i in ids]


async def test_a_batch_numbers_each_keys_jobs_from_the_keys_next_turn(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many([_keyed("export", k) for k in ("a", "b", "a", "b", "a")])
    assert await _turns(pool, ids) == [0, 0, 1, 1, 2]
    # A later enqueue of a key goes on after its queued jobs; a new key and each
    # priority start at 0 (nothing claimed yet: the front is 0).
    later = await queue.enqueue_many(
        [_keyed("export", "a"), _keyed("export", "c"), _keyed("export", "a", priority=-1)]
    )
    assert await _turns(pool, later) == [3, 0, 0]
    single = await queue.enqueue("export", {}, options=EnqueueOptions(limit_key="b"))
    assert await _turns(pool, [single]) == [2]


async def test_a_limited_names_jobs_without_a_key_are_one_key_and_others_get_no_turn(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    await queue.set_limits("sms", concurrency=3)
    plain = await queue.enqueue_many([EnqueueRequest("sms", {}) for _ in range(3)])
    keyed = await queue.enqueue_many([_keyed("sms", "x"), EnqueueRequest("sms", {})])
    single = await queue.enqueue("sms", {})
    free = await queue.enqueue_many([EnqueueRequest("free", {}) for _ in range(2)])
    assert await _turns(pool, plain) == [0, 1, 2]
    assert await _turns(pool, keyed) == [0, 3]
    assert await _turns(pool, [single]) == [4]
    assert await _turns(pool, free) == [None, None]


async def test_rows_inserted_by_hand_are_numbered_by_the_trigger(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    first = await queue.enqueue("export", {}, options=EnqueueOptions(limit_key="a"))
    ids = [uuid.uuid4() for _ in range(3)]
    # One statement: the trigger sees the rows inserted before each one.
    await pool.execute(
        "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, limit_key, limited)"
        " SELECT i, 'export', '{}', 3, 'a', true FROM unnest($1::uuid[]) AS i",
        ids,
    )
    assert await _turns(pool, [first, *ids]) == [0, 1, 2, 3]


async def test_claims_take_keys_in_turn_and_priority_first(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    # One key's backlog first, then another's: the claim alternates between them.
    big = await queue.enqueue_many([_keyed("export", "big") for _ in range(6)])
    small = await queue.enqueue_many([_keyed("export", "small") for _ in range(2)])
    urgent = await queue.enqueue("export", {}, options=EnqueueOptions(limit_key="big", priority=-1))
    # Claims of one job, then two, then two (a claim returns its jobs unordered).
    assert {r["id"] for r in await pool.fetch(CLAIM, "export", 1)} == {urgent}
    assert {r["id"] for r in await pool.fetch(CLAIM, "export", 2)} == {big[0], small[0]}
    assert {r["id"] for r in await pool.fetch(CLAIM, "export", 2)} == {big[1], small[1]}
    assert {r["id"] for r in await pool.fetch(CLAIM, "export", 9)} == set(big[2:])


async def test_a_key_with_nothing_queued_starts_at_the_front(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.enqueue_many([_keyed("export", "big") for _ in range(10)])
    # Four of big's turns (0-3) are claimed: the front of priority 0 is 3.
    assert len(await pool.fetch(CLAIM, "export", 4)) == 4
    assert (
        await pool.fetchval(
            "SELECT turn FROM pgfleet.flow_fronts WHERE name = 'export' AND priority = 0"
        )
        == 3
    )
    # A new key starts at the front, not at 0 (it would take every turn until it
    # caught up) nor after big's backlog: it is next.
    late = await queue.enqueue_many([_keyed("export", "late") for _ in range(3)])
    assert await _turns(pool, late) == [3, 4, 5]
    rows = await pool.fetch(CLAIM, "export", 4)
    assert sorted((r["turn"], r["limit_key"]) for r in rows) == [
        (3, "late"),
        (4, "big"),
        (4, "late"),
        (5, "big"),
    ]
    rows = sorted(rows, key=lambda r: (r["turn"], r["limit_key"]))
    # The front only moves forward: a claim of an earlier turn leaves it.
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'queued', locked_by = NULL, lock_token = NULL,"
        " turn = 0 WHERE id = $1",
        rows[0]["id"],
    )
    assert [r["turn"] for r in await pool.fetch(CLAIM, "export", 1)] == [0]
    assert (
        await pool.fetchval(
            "SELECT turn FROM pgfleet.flow_fronts WHERE name = 'export' AND priority = 0"
        )
        == 5
    )


async def test_the_migration_numbers_the_queued_flagged_jobs_by_key_in_run_at_order(
    database: str,
) -> None:
    conn = await asyncpg.connect(database)
    try:
        await conn.execute("DROP SCHEMA pgfleet CASCADE; CREATE SCHEMA pgfleet")
        turns = next(m for m in migrations() if m.name == "flow_turn_numbers")
        for m in migrations():
            if m.version < turns.version:
                await conn.execute(m.sql)
        await conn.execute("INSERT INTO pgfleet.limits (name, concurrency) VALUES ('sms', 2)")
        rows: list[tuple[Any, ...]] = [
            # (name, limit_key, priority, seconds ago, status, limited)
            ("export", "a", 0, 10, "queued", True),
            ("export", "a", 0, 30, "queued", True),
            ("export", "b", 0, 20, "queued", True),
            ("export", "a", -1, 5, "queued", True),
            ("export", "a", 0, 40, "running", True),
            ("sms", None, 0, 1, "queued", True),
            ("sms", None, 0, 2, "queued", True),
            ("free", None, 0, 3, "queued", False),
        ]
        ids = [uuid.uuid4() for _ in rows]
        for job_id, (name, key, priority, ago, status, limited) in zip(ids, rows, strict=True):
            await conn.execute(
                "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, limit_key,"
                " priority, run_at, status, limited, locked_by, lock_token)"
                " VALUES ($1, $2, '{}', 3, $3, $4, now() - make_interval(secs => $5::float8),"
                " $6::text::pgfleet.job_status, $7,"
                " CASE WHEN $6::text = 'running' THEN gen_random_uuid() END,"
                " CASE WHEN $6::text = 'running' THEN gen_random_uuid() END)",
                job_id,
                name,
                key,
                priority,
                ago,
                status,
                limited,
            )
        await conn.execute(turns.sql)
        got = {r["id"]: r["turn"] for r in await conn.fetch("SELECT id, turn FROM pgfleet.jobs")}
        assert [got[i] for i in ids] == [1, 0, 0, 0, None, 1, 0, None]
    finally:
        await conn.close()


async def test_a_job_waiting_out_a_delay_has_no_turn_and_goes_first_when_due(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    now = await pool.fetchval("SELECT now()")
    backlog = await queue.enqueue_many([_keyed("export", "big") for _ in range(3)])
    # Scheduled: by delay, by run_at, in a batch and alone; none takes a turn.
    later = await queue.enqueue_many(
        [_keyed("export", "late", delay=3600), _keyed("export", "big", delay=3600)]
    )
    alone = await queue.enqueue(
        "export", {}, options=EnqueueOptions(limit_key="x", run_at=now + dt.timedelta(hours=1))
    )
    assert await _turns(pool, [*later, alone]) == [None, None, None]
    # Their time comes: the first claim takes them before the keys' turns.
    await pool.execute(
        "UPDATE pgfleet.jobs SET run_at = now() - interval '1 s' WHERE id = ANY ($1::uuid[])",
        [*later, alone],
    )
    first = {r["id"] for r in await pool.fetch(CLAIM, "export", 3)}
    assert first == {*later, alone}
    assert {r["id"] for r in await pool.fetch(CLAIM, "export", 9)} == set(backlog)


async def test_a_job_moved_later_gives_up_its_turn(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many([_keyed("export", "a") for _ in range(2)])
    await queue.reschedule(ids[0], delay=3600)
    await queue.reschedule(ids[1], delay=0)
    assert await _turns(pool, ids) == [None, 1]


async def test_a_retried_job_gives_up_its_turn_until_due(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("flaky", {}, options=EnqueueOptions(limit_key="a"))
    assert await _turns(pool, [job_id]) == [0]
    registry = Registry()

    @registry.job("flaky")
    async def flaky(job: Job) -> None:
        raise RuntimeError("the provider is down")

    config = WorkerConfig(backoff_base=3600, backoff_jitter=0, **FAST)
    async with running_worker(pool, registry, config, Recorder()):

        async def retried() -> bool | None:
            row = await pool.fetchrow(
                "SELECT status::text, attempt, turn FROM pgfleet.jobs WHERE id = $1", job_id
            )
            return True if row and row["status"] == "queued" and row["attempt"] == 1 else None

        await until(retried, 30, "the first attempt's retry")
    assert await _turns(pool, [job_id]) == [None]


async def test_a_replaced_keyed_job_takes_its_new_run_ats_turn(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)

    def options(**more: Any) -> EnqueueOptions:
        return EnqueueOptions(
            limit_key="a", job_key="digest", job_key_mode=JobKeyMode.REPLACE, **more
        )

    first = await queue.enqueue("export", {}, options=options())
    await queue.enqueue("export", {}, options=EnqueueOptions(limit_key="a"))
    assert await _turns(pool, [first]) == [0]
    # Debounced to later: no turn until due.
    assert await queue.enqueue("export", {}, options=options(delay=3600)) == first
    assert await _turns(pool, [first]) == [None]
    # Due again: the key's next turn, after its other queued job.
    assert await queue.enqueue("export", {}, options=options()) == first
    assert await _turns(pool, [first]) == [2]


async def _index_reads(pool: asyncpg.Pool, index: str) -> int:
    value = await pool.fetchval(
        "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE schemaname = 'pgfleet'"
        " AND indexrelname = $1",
        index,
    )
    return int(value)


async def test_a_limited_names_claim_reads_none_of_the_other_queued_jobs(
    pool: asyncpg.Pool,
) -> None:
    # A limited backlog beside as many unflagged jobs, analyzed as the leader's
    # VACUUM (ANALYZE) would: most queued jobs have no turn, which made a plan read
    # the runnable index (every queued job) to find the limited name's due jobs
    # without one (0018).
    queue = Queue(pool)
    await queue.set_limits("export", concurrency=1000)
    await queue.enqueue_many([EnqueueRequest("export", {}) for _ in range(2000)])
    await queue.enqueue_many([EnqueueRequest("free", {}) for _ in range(2000)])
    await pool.execute("ANALYZE pgfleet.jobs")
    async with pool.acquire() as conn:
        before = await _index_reads(pool, "jobs_runnable")
        # Past plpgsql's first five custom plans, to its generic one.
        for _ in range(8):
            assert len(await conn.fetch(CLAIM, "export", 10)) == 10
        # Pending statistics reach shared memory as this backend goes idle.
        await conn.execute("SELECT pg_stat_force_next_flush()")
    after = await _index_reads(pool, "jobs_runnable")
    # Without the claim-order index: 8 claims x 4,000 entries.
    assert after - before < 500
