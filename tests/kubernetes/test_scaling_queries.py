"""The keda-postgres triggers' queries, taken from the rendered manifest, on real data.

Each query runs against a migrated database seeded through pgfleet's own Queue with
a backlog whose answer is known (due jobs over several priorities, jobs scheduled
later, running, finished and dead ones), and must return exactly that. Then the
same queries are explained on a table holding a million finished jobs: they must
read only the partial indexes, a handful of pages, whatever the history retained.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from pgfleet import EnqueueOptions, Queue
from pgfleet.db.types import Connection
from tests.helpers import put_in_state
from tests.kubernetes.support import ROOT, find, render, trigger

#: Partial indexes of pgfleet.jobs that hold no finished job (0001_init.sql).
LIVE_INDEXES = {
    "jobs_runnable",
    "jobs_running_worker",
    "jobs_queue_running",
    "jobs_queue_head",
    "jobs_free",
}
FINISHED_ROWS = 1_000_000


def queries() -> dict[str, str]:
    scaled = find(render("overlays/keda-postgres"), "ScaledObject", "pgfleet-worker")
    return {
        name: trigger(scaled, name)["metadata"]["query"]
        for name in ("running-and-due", "oldest-due-age")
    }


async def run(conn: Connection, query: str) -> tuple[datetime, Any]:
    """The query's single value, and the transaction's now() it was computed at."""
    async with conn.transaction():
        now = await conn.fetchval("SELECT now()")
        rows = await conn.fetch(query)
    assert len(rows) == 1 and len(rows[0]) == 1, f"KEDA needs one value, got {rows}"
    return now, rows[0][0]


async def seed_backlog(pool: asyncpg.Pool) -> tuple[int, int, datetime]:
    """A backlog with a known answer: (running, due, oldest due run_at)."""
    queue = Queue(pool)
    now: datetime = await pool.fetchval("SELECT now()")

    async def at(name: str, seconds_ago: float, priority: int = 0) -> uuid.UUID:
        run_at = now - timedelta(seconds=seconds_ago)
        return await queue.enqueue(
            name, {}, options=EnqueueOptions(run_at=run_at, priority=priority)
        )

    # Due: priority 0 (10..60 s old), the oldest at priority 3, a fresh one at 10.
    due = [await at("noop", s) for s in (10, 20, 30, 40, 50, 60)]
    oldest = now - timedelta(seconds=125.5)
    due.append(await at("sleep", 125.5, priority=3))
    due.append(await at("cpu", 5, priority=10))
    # Not due: scheduled later, including the head of a priority of its own.
    later = await at("noop", -600, priority=-5)
    await at("noop", -30)
    await at("sleep", -3600, priority=3)
    # Running (claimed by workers): count as busy slots, never as waiting.
    running = [await at("sleep", 900), await at("noop", 800, priority=-5)]
    for job in running:
        await put_in_state(pool, job, "running")
    # Held ahead by a worker (prefetch: claimed, not started): needs no slot of its
    # own and is not waiting either.
    held = await at("noop", 700)
    await put_in_state(pool, held, "running")
    await pool.execute("UPDATE pgfleet.jobs SET started_at = NULL WHERE id = $1", held)
    # Waiting on a parent that has not run (workflows): never due, however old its
    # run_at, so neither a slot nor the oldest age, until the parent succeeds.
    for name in ("noop", "send_email"):
        await queue.enqueue(
            name,
            {},
            options=EnqueueOptions(run_at=now - timedelta(hours=1), after=[later]),
        )
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE status = 'waiting'") == 2
    # Finished and dead: neither.
    for status in ("succeeded", "failed", "cancelled"):
        await put_in_state(pool, await at("noop", 7200), status)
    return len(running), len(due), oldest


async def test_trigger_queries_return_the_known_backlog(pool: asyncpg.Pool) -> None:
    q = queries()
    async with pool.acquire() as conn:
        # An empty queue: zero, not NULL (KEDA cannot scale on NULL).
        assert (await run(conn, q["running-and-due"]))[1] == 0
        assert (await run(conn, q["oldest-due-age"]))[1] == 0

        running, due, oldest = await seed_backlog(pool)
        _, slots = await run(conn, q["running-and-due"])
        assert slots == running + due == 10
        now, age = await run(conn, q["oldest-due-age"])
        assert age == math.ceil((now - oldest).total_seconds())
        assert 126 <= age < 126 + 60

        # The oldest job is claimed: the next oldest due one (60 s) takes over.
        (oldest_id,) = await conn.fetch("SELECT id FROM pgfleet.jobs WHERE run_at = $1", oldest)
        await put_in_state(pool, oldest_id["id"], "running")
        now, age = await run(conn, q["oldest-due-age"])
        expected = await conn.fetchval(
            "SELECT ceil(extract(epoch FROM $1::timestamptz - min(run_at)))::bigint"
            " FROM pgfleet.jobs WHERE status = 'queued' AND run_at <= $1",
            now,
        )
        assert age == expected and 60 <= age < 120
        assert (await run(conn, q["running-and-due"]))[1] == 10


ROLE_SQL = ROOT / "deploy" / "kubernetes" / "overlays" / "keda-postgres" / "keda-role.sql"


async def test_the_triggers_run_as_the_read_only_keda_role(pool: asyncpg.Pool) -> None:
    """keda-role.sql's role answers both queries and can change nothing. Roles are the
    server's, not the database's: this one has a name of its own and is dropped."""
    role = f"pgfleet_keda_t{uuid.uuid4().hex[:10]}"
    script = ROLE_SQL.read_text().replace("pgfleet_keda", role)
    running, due, _ = await seed_backlog(pool)
    q = queries()
    async with pool.acquire() as conn:
        try:
            await conn.execute(script)
            async with conn.transaction():
                await conn.execute(f"SET LOCAL ROLE {role}")
                assert (await conn.fetchval(q["running-and-due"])) == running + due
                assert (await conn.fetchval(q["oldest-due-age"])) > 0
            for statement in (
                "UPDATE pgfleet.jobs SET priority = 1",
                "DELETE FROM pgfleet.jobs",
                "SELECT count(*) FROM pgfleet.workers",
                "SELECT count(*) FROM pgfleet.console_sessions",
            ):
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL ROLE {role}")
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await conn.execute(statement)
            settings = await conn.fetchval(
                "SELECT setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
                "WHERE r.rolname = $1",
                role,
            )
            assert "default_transaction_read_only=on" in settings
        finally:
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE IF EXISTS {role}")


def for_kinds(query: str, kinds: list[str]) -> str:
    """docs/operations/kubernetes.md's edit for a Deployment serving only some kinds: after every
    status condition, AND name = ANY ('{...}'::text[])."""
    literal = "'{" + ",".join(kinds) + "}'::text[]"
    edited, n = re.subn(
        r"(status = '(?:queued|running)')", rf"\1 AND name = ANY ({literal})", query
    )
    assert n >= 2, query
    return edited


async def test_trigger_queries_restricted_to_some_kinds(pool: asyncpg.Pool) -> None:
    q = queries()
    running, due, _ = await seed_backlog(pool)
    async with pool.acquire() as conn:
        # noop: six due (10..60 s old) and one running; sleep: one due, one running.
        _, slots = await run(conn, for_kinds(q["running-and-due"], ["noop"]))
        assert slots == 7
        _, age = await run(conn, for_kinds(q["oldest-due-age"], ["noop"]))
        assert 60 <= age < 120
        _, slots = await run(conn, for_kinds(q["running-and-due"], ["noop", "sleep", "cpu"]))
        assert slots == running + due
        _, age = await run(conn, for_kinds(q["oldest-due-age"], ["sleep"]))
        assert 126 <= age < 186
        _, slots = await run(conn, for_kinds(q["running-and-due"], ["send_email"]))
        assert slots == 0
        _, age = await run(conn, for_kinds(q["oldest-due-age"], ["send_email"]))
        assert age == 0


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


async def _fill_history(conn: Connection) -> None:
    # Time-ordered ids, as the UUIDv7 producers generate; a day of history.
    await conn.execute(
        """
        INSERT INTO pgfleet.jobs (id, name, payload, status, attempt, max_attempts,
                                  run_at, created_at, started_at, finished_at)
        SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
               (ARRAY['noop', 'sleep', 'cpu', 'send_email'])[1 + g % 4], '{}'::jsonb,
               (CASE WHEN g % 100 = 0 THEN 'failed' ELSE 'succeeded' END)::pgfleet.job_status,
               1, 25, t, t, t, t + interval '50 ms'
        FROM generate_series(1, $1::int) AS g,
             LATERAL (SELECT now() - interval '1 day' + g * interval '80 ms' AS t) AS ts
        """,
        FINISHED_ROWS,
    )
    await conn.execute("VACUUM (ANALYZE) pgfleet.jobs")


@pytest.mark.timeout(600)
async def test_trigger_queries_read_only_live_rows_of_a_million_finished(
    pool: asyncpg.Pool,
) -> None:
    q = queries()
    async with pool.acquire() as conn:
        await _fill_history(conn)
        await seed_backlog(pool)
        assert await conn.fetchval("SELECT count(*) FROM pgfleet.jobs") > FINISHED_ROWS
        live = await conn.fetchval(
            "SELECT count(*) FROM pgfleet.jobs WHERE status IN ('queued', 'running')"
        )
        report = []
        for name, query in q.items():
            raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}")
            doc = json.loads(raw)[0] if isinstance(raw, str) else raw[0]
            plan = doc["Plan"]
            nodes = _plan_nodes(plan)
            scans = [n for n in nodes if n["Node Type"].endswith("Scan") and n.get("Relation Name")]
            assert scans, name
            for node in scans:
                assert node["Relation Name"] == "jobs"
                assert node["Node Type"] in ("Index Only Scan", "Index Scan"), (name, node)
                assert node["Index Name"] in LIVE_INDEXES, (name, node["Index Name"])
                # Heap visits, if any, only for queued or running rows.
                assert node.get("Heap Fetches", 0) <= live, (name, node)
            pages = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
            # A million finished rows are some 20000 pages of heap: a few dozen at most.
            assert pages < 50, (name, pages)
            # The planner's own estimate, against the plan it would have without the
            # partial indexes (reading the whole table).
            async with conn.transaction():
                for setting in ("enable_indexscan", "enable_indexonlyscan", "enable_bitmapscan"):
                    await conn.execute(f"SET LOCAL {setting} = off")
                raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {query}")
            full = (json.loads(raw)[0] if isinstance(raw, str) else raw[0])["Plan"]["Total Cost"]
            assert plan["Total Cost"] * 20 < full, (name, plan["Total Cost"], full)
            text = "\n".join(
                r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, COSTS) {query}")
            )
            report.append(
                f"-- {name}: estimated cost {plan['Total Cost']} (without the partial "
                f"indexes {full}), {pages} pages, {doc['Execution Time']} ms\n{text}"
            )
        print("\n\n".join(report))
