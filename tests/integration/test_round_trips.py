"""What the hot paths cost the database: statements per enqueue, and the shape of
the claim loop's one plan (issue 13). Counts and plan shapes, never wall time."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import asyncpg

from pgfleet import EnqueueRequest, Queue, Registry, Worker, WorkerConfig
from pgfleet.db import Q
from pgfleet.db.deadlines import AppPool
from pgfleet.db.translate import ROUND_COLUMNS
from pgfleet.queue import create_pool
from tests.helpers import job_count, listening, notifications_before_marker


class CountingPool:
    """An asyncpg pool seen through the two calls Queue.enqueue makes on it, counting
    the statements sent and how many notifying ones were in flight at once. Not a
    whole pool: :meth:`as_app_pool` hands it to Queue, which needs no more."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.statements: list[str] = []
        self.notifying_in_flight = 0
        self.most_notifying_in_flight = 0

    async def execute(self, sql: str, *args: Any) -> str:
        self.statements.append(sql)
        notifies = "pg_notify" in sql
        if notifies:
            self.notifying_in_flight += 1
            self.most_notifying_in_flight = max(
                self.most_notifying_in_flight, self.notifying_in_flight
            )
        try:
            return str(await self.pool.execute(sql, *args))
        finally:
            if notifies:
                self.notifying_in_flight -= 1

    def acquire(self) -> Any:
        return self.pool.acquire()

    def as_app_pool(self) -> AppPool:
        return cast(AppPool, self)


async def test_a_lone_enqueue_is_one_statement_that_carries_its_wakeup(
    pool: asyncpg.Pool, database: str
) -> None:
    counting = CountingPool(pool)
    queue = Queue(counting.as_app_pool())  # default: NotifyMode.COALESCED
    async with listening(database) as listener:
        for _ in range(3):
            await queue.enqueue("lone", {"n": 1})
            await queue.flush_notifications()
        assert await notifications_before_marker(listener, pool) == 3
    assert len(counting.statements) == 3
    assert all("pg_notify" in sql and "INSERT" in sql for sql in counting.statements)
    assert await job_count(pool) == 3
    # The job-carrying commit stays synchronous (only the standalone wakeup is not).
    assert await pool.fetchval("SHOW synchronous_commit") == "on"


async def test_concurrent_enqueues_keep_one_notifying_statement_in_flight(
    pool: asyncpg.Pool, database: str
) -> None:
    counting = CountingPool(pool)
    queue = Queue(counting.as_app_pool())
    async with listening(database) as listener:
        await asyncio.gather(*(queue.enqueue("burst", {"n": i}) for i in range(64)))
        await queue.flush_notifications()
        seen = await notifications_before_marker(listener, pool)
    assert await job_count(pool) == 64
    # Postgres serialises the commits of notifying transactions: never more than one
    # of ours queues there, and a wakeup still follows the last commit.
    assert counting.most_notifying_in_flight == 1
    assert 1 <= seen < 64
    notifying = [sql for sql in counting.statements if "pg_notify" in sql]
    assert len(notifying) == seen
    # One insert per job, each its own commit; wakeups add a statement only per burst.
    assert sum("INSERT" in sql for sql in counting.statements) == 64


# ------------------------------------------------------------------ the claim plan


async def _claim_plan(conn: asyncpg.Connection, query: Any = None) -> dict[str, Any]:
    """The plan the claim loop's session executes for job_complete_and_claim (or
    ``query``, its lean form): the session settings of claim_session_begin, the
    statement prepared once, run five times (when Postgres would otherwise settle on
    custom plans), then explained."""
    await conn.execute(Q.claim_session_begin.sql)
    name = "claim_lean" if query is Q.job_complete_and_claim_lean else "claim"
    await conn.execute(
        f"PREPARE {name}(uuid[], uuid[], text[], float8[], text[], uuid, text[], text[], int, int, "
        "uuid[], float8[], text) AS " + (query or Q.job_complete_and_claim).sql
    )
    args = (
        "'{}', '{}', '{}', '{}', '{}', gen_random_uuid(), '{noop}', NULL, 16, 4, '{}', '{}', NULL"
    )
    for _ in range(5):
        await conn.execute(f"BEGIN; EXECUTE {name}({args}); ROLLBACK")
    raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE {name}({args})")
    counts = await conn.fetchrow(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1", name
    )
    assert counts is not None
    await conn.execute(f"DEALLOCATE {name}")
    await conn.execute(Q.claim_session_end.sql)
    plan: dict[str, Any] = json.loads(raw)[0]
    plan["counts"] = dict(counts)
    return plan


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    found = [node]
    for child in node.get("Plans", []):
        found.extend(_nodes(child))
    return found


async def _stale_statistics_after_truncate(conn: asyncpg.Connection) -> None:
    """The state that once defeated the generic plan: statistics analysed over a
    deep backlog, then TRUNCATE, then a table of retained history and a few jobs."""
    await conn.execute(
        "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts) "
        "SELECT gen_random_uuid(), 'noop', '{}', 25 FROM generate_series(1, 150000)"
    )
    await conn.execute("ANALYZE pgfleet.jobs")
    await conn.execute("TRUNCATE pgfleet.jobs, pgfleet.job_dependencies")
    await conn.execute(
        "INSERT INTO pgfleet.jobs (id, name, payload, status, attempt, max_attempts, "
        "started_at, finished_at) SELECT gen_random_uuid(), 'noop', '{}', 'succeeded', 1, 25, "
        "now(), now() FROM generate_series(1, 150000)"
    )
    await conn.execute(
        "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, queue_name) "
        "SELECT gen_random_uuid(), 'noop', '{}', 25, CASE WHEN g % 2 = 0 THEN 'q' END "
        "FROM generate_series(1, 40) AS g"
    )


async def test_the_claim_plan_after_truncate_with_stale_statistics(database: str) -> None:
    conn = await asyncpg.connect(database)
    try:
        await _stale_statistics_after_truncate(conn)
        # A threshold the stale plan's cost is well over (the default, 100000, is
        # close to it: a column more or less moves the estimate across it; since
        # 0009 the fast path has no named-queue probes and costs far less).
        await conn.execute("SET jit_above_cost = 500")
        for query in (Q.job_complete_and_claim_lean, Q.job_complete_and_claim):
            await _check_claim_plan(conn, query)
    finally:
        await conn.close()


async def _check_claim_plan(conn: asyncpg.Connection, query: Any) -> None:
    plan = await _claim_plan(conn, query)
    # Planned once: the cached generic plan, not a fresh custom plan per round.
    assert plan["counts"]["custom_plans"] == 0
    assert plan["counts"]["generic_plans"] >= 5
    # The statistics make the plan look expensive, yet it is never JIT-compiled
    # (that compilation, every round, was the 80-130 ms pickup tail).
    assert plan["Plan"]["Total Cost"] > 500
    assert "JIT" not in plan
    nodes = _nodes(plan["Plan"])
    scans = {(n["Node Type"], n.get("Index Name")) for n in nodes if "Relation Name" in n}
    # The pick walks the runnable index in claim order (the one without the jobs
    # under flow control); the updates find rows by primary key; nothing scans
    # the table or its retained history.
    assert ("Index Scan", "jobs_free") in scans
    assert ("Index Scan", "jobs_pkey") in scans
    bad = [
        (n["Node Type"], n.get("Relation Name"))
        for n in nodes
        if n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan", "Sort")
    ]
    assert not bad, bad
    # A hash join of the round's own rows, read from jobs by id (the completion's
    # outcomes), is bounded by the round; a join over the table is not.
    for join in (n for n in nodes if n["Node Type"] in ("Hash Join", "Merge Join")):
        unbounded = [
            (n["Node Type"], n.get("Index Name"))
            for n in _nodes(join)
            if n.get("Relation Name") == "jobs" and "Index Cond" not in n
        ]
        assert not unbounded, unbounded
    # The named-queue checks are per-candidate probes, never a hashed scan.
    assert not any(n.get("Subplan Name", "").startswith("hashed") for n in nodes)
    # The claim loop's session hands its connection back with default settings.
    assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
    assert await conn.fetchval("SHOW jit") == "on"


async def test_a_worker_claims_with_one_plan(database: str) -> None:
    # The worker's own claim connection: after a drain, its prepared claim has run
    # under the generic plan only, and the connection went back without its settings.
    registry = Registry()

    @registry.job("noop")
    async def noop(job: Any) -> None:
        return None

    size = 3
    pool = await create_pool(database, min_size=size, max_size=size)
    try:
        queue = Queue(pool)
        await queue.enqueue_many([EnqueueRequest("noop", {"n": i}) for i in range(60)])
        # No prefetch: a round per pair of slots.
        config = WorkerConfig(concurrency=2, poll_interval=0.2, prefetch=0)
        stats = await Worker(pool, registry, config).run(burst=True)
        assert stats.succeeded == 60
        held = [await pool.acquire() for _ in range(size)]
        try:
            plans = []
            for conn in held:
                plans += await conn.fetch(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE '%claimed AS%' AND NOT from_sql "
                    "AND statement NOT LIKE '%pg_prepared_statements%'"
                )
                assert await conn.fetchval("SHOW plan_cache_mode") == "auto"
                assert await conn.fetchval("SHOW jit") == "on"
        finally:
            for conn in held:
                await pool.release(conn)
        # The full statement (the first round) and the lean one (the others: nothing
        # is limited), each planned once.
        assert len(plans) == 2
        assert all(p["custom_plans"] == 0 for p in plans)
        assert sum(p["generic_plans"] for p in plans) >= 30  # two slots, 60 jobs
    finally:
        await pool.close()


async def test_the_round_returns_the_columns_the_client_unpacks(database: str) -> None:
    # round_result unpacks rows by position, not by name.
    conn = await asyncpg.connect(database)
    try:
        statement = await conn.prepare(Q.job_complete_and_claim.sql)
        names = tuple(a.name for a in statement.get_attributes())
        assert names == ROUND_COLUMNS
        types = {a.name: a.type.name for a in statement.get_attributes()}
        assert (types["run_at"], types["created_at"], types["started_at"]) == ("float8",) * 3
    finally:
        await conn.close()


async def test_a_round_that_marks_nothing_scans_nothing_to_mark(database: str) -> None:
    conn = await asyncpg.connect(database)
    try:
        worker = await conn.fetchval("SELECT gen_random_uuid()")
        await conn.execute(
            "INSERT INTO pgfleet.jobs (id, name, payload, status, attempt, max_attempts, "
            "locked_by, lock_token) SELECT gen_random_uuid(), 'noop', '{}', 'running', 1, 25, "
            "$1, gen_random_uuid() FROM generate_series(1, 50)",
            worker,
        )
        held = await conn.fetchval(
            "SELECT id FROM pgfleet.jobs WHERE locked_by = $1 LIMIT 1", worker
        )
        await conn.execute(
            "PREPARE claim(uuid[], uuid[], text[], float8[], text[], uuid, text[], text[], int, "
            "int, uuid[], float8[], text) AS " + Q.job_complete_and_claim.sql
        )

        async def scans_to_mark(marks: str) -> int:
            args = f"'{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{worker}', '{{noop}}', NULL, 0, 0, {marks}, '{{}}', NULL"
            transaction = conn.transaction()
            await transaction.start()
            try:  # ANALYZE runs the updates: roll them back
                raw = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim({args})")
            finally:
                await transaction.rollback()
            marked = next(
                n
                for n in _nodes(json.loads(raw)[0]["Plan"])
                if n.get("Subplan Name") == "CTE marked"
            )
            # Every scan under the marking update, by whatever index it plans.
            return sum(n["Actual Loops"] for n in _nodes(marked) if "Scan" in n["Node Type"])

        assert await scans_to_mark("'{}'") == 0
        assert await scans_to_mark(f"ARRAY['{held}']::uuid[]") == 1
    finally:
        await conn.close()
