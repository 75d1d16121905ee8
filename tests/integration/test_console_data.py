"""The console's queries on real Postgres: keyset pages, filters, bounded searches,
bulk actions. Every expectation is recomputed from the table itself."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from pgfleet import EnqueueOptions, JobStatus, Queue
from pgfleet.errors import InvalidName, InvalidOptions
from pgfleet.service.console.data import ConsoleData, JobFilter


async def walk(data: ConsoleData, f: JobFilter, limit: int) -> tuple[list[UUID], int]:
    """Every id the console shows for ``f``, following 'Older' and 'Search older'
    links to the end; and how many pages it took."""
    seen: list[UUID] = []
    before: UUID | None = None
    pages = 0
    while True:
        page = await data.jobs(f, before, limit)
        pages += 1
        assert len(page.rows) <= limit
        seen += [r["id"] for r in page.rows]
        before = page.older or page.searched_to
        if before is None:
            return seen, pages
        assert pages < 1000


async def ids(pool: asyncpg.Pool, where: str = "true", *args: Any) -> list[UUID]:
    rows = await pool.fetch(f"SELECT id FROM pgfleet.jobs WHERE {where} ORDER BY id DESC", *args)
    return [r["id"] for r in rows]


@pytest.fixture
async def mixed(pool: asyncpg.Pool) -> Queue:
    """130 jobs: three kinds, some in named queues, some with a limit key, some dead,
    cancelled, running."""
    queue = Queue(pool)
    for n in range(130):
        kind = "rare" if n % 20 == 0 else ("email" if n % 2 else "resize")
        opts = EnqueueOptions(
            queue_name="tenant-a" if n % 7 == 0 else None,
            limit_key="acme" if n % 4 == 0 else None,
        )
        job = await queue.enqueue(kind, {"n": n}, options=opts)
        if n % 5 == 0:
            await queue.permanently_fail(job, f"boom {n}")
        elif n % 11 == 0:
            await queue.cancel(job)
        elif n % 3 == 0:
            await queue.complete(job)
    return queue


async def test_pages_walk_every_job_newest_first_without_gaps_or_repeats(
    pool: asyncpg.Pool, mixed: Queue
) -> None:
    data = ConsoleData(pool, mixed)
    seen, pages = await walk(data, JobFilter(), 50)
    assert seen == await ids(pool)
    assert pages == 3  # 50 + 50 + 30


@pytest.mark.parametrize(
    ("f", "where", "args"),
    [
        (JobFilter(status=JobStatus.FAILED), "status = 'failed'", ()),
        (
            JobFilter(status=JobStatus.FAILED, name="email"),
            "status = 'failed' AND name = $1",
            ("email",),
        ),
        (
            JobFilter(status=JobStatus.QUEUED, queue="tenant-a"),
            "status = 'queued' AND queue_name = $1",
            ("tenant-a",),
        ),
        (JobFilter(name="rare"), "name = $1", ("rare",)),
        (JobFilter(queue="tenant-a"), "queue_name = $1", ("tenant-a",)),
        (JobFilter(key="acme"), "limit_key = $1", ("acme",)),
        (
            JobFilter(status=JobStatus.FAILED, key="acme"),
            "status = 'failed' AND limit_key = $1",
            ("acme",),
        ),
        (JobFilter(status=JobStatus.CANCELLED), "status = 'cancelled'", ()),
        (
            JobFilter(status=JobStatus.SUCCEEDED, name="resize"),
            "status = 'succeeded' AND name = $1",
            ("resize",),
        ),
    ],
)
async def test_filters_show_exactly_the_matching_jobs(
    pool: asyncpg.Pool, mixed: Queue, f: JobFilter, where: str, args: tuple[Any, ...]
) -> None:
    expected = await ids(pool, where, *args)
    assert expected, "the fixture must hold matching jobs"
    # A tiny search window: filters no index serves take several bounded searches,
    # and still find every match, in order.
    data = ConsoleData(pool, mixed, window=16)
    seen, _pages = await walk(data, f, 7)
    assert seen == expected


async def test_a_search_no_index_serves_stops_after_its_window(
    pool: asyncpg.Pool, mixed: Queue
) -> None:
    data = ConsoleData(pool, mixed, window=16)
    page = await data.jobs(JobFilter(name="rare"), None, 50)
    newest16 = (await ids(pool))[:16]
    assert [r["id"] for r in page.rows] == [
        i for i in newest16 if i in set(await ids(pool, "name = 'rare'"))
    ]
    assert page.older is None
    assert page.searched_to == newest16[-1]
    # Filters served by an index never stop short.
    dead = await data.jobs(JobFilter(status=JobStatus.FAILED), None, 50)
    assert dead.searched_to is None
    assert len(dead.rows) == len(await ids(pool, "status = 'failed'"))


async def test_time_range_filters_on_creation_time(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    early = [await queue.enqueue("email", {}) for _ in range(3)]
    cut = await pool.fetchval("SELECT max(created_at) FROM pgfleet.jobs") + timedelta(
        milliseconds=5
    )
    await pool.execute("SELECT pg_sleep(0.02)")
    late = [await queue.enqueue("email", {}) for _ in range(2)]
    data = ConsoleData(pool, queue)
    older = await data.jobs(JobFilter(until=cut), None, 50)
    newer = await data.jobs(JobFilter(since=cut), None, 50)
    assert [r["id"] for r in older.rows] == early[::-1]
    assert [r["id"] for r in newer.rows] == late[::-1]
    future = await data.jobs(JobFilter(since=datetime.now(UTC) + timedelta(days=1)), None, 50)
    assert future.rows == []


async def test_bulk_retry_skips_jobs_whose_key_is_taken_and_counts_both(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    dead = [await queue.enqueue("email", {"n": n}) for n in range(3)]
    keyed = await queue.enqueue("email", {}, options=EnqueueOptions(job_key="k1"))
    for job in [*dead, keyed]:
        await queue.permanently_fail(job, "boom")
    holder = await queue.enqueue("email", {}, options=EnqueueOptions(job_key="k1"))
    other_kind = await queue.enqueue("resize", {})
    await queue.permanently_fail(other_kind, "boom")
    data = ConsoleData(pool, queue)
    assert await data.dead_count("email") == 4
    assert await data.retry_dead("email") == (3, 1)
    rows = await pool.fetch("SELECT id, status::text FROM pgfleet.jobs")
    statuses = {row["id"]: row["status"] for row in rows}
    assert [statuses[j] for j in dead] == ["queued"] * 3
    assert statuses[keyed] == "failed" and statuses[holder] == "queued"
    assert statuses[other_kind] == "failed"
    assert await pool.fetchval("SELECT attempt FROM pgfleet.jobs WHERE id = $1", dead[0]) == 0


async def test_bulk_cancel_sets_dead_jobs_of_one_kind_aside(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    jobs = [await queue.enqueue(kind, {}) for kind in ("email", "email", "resize")]
    for job in jobs:
        await queue.permanently_fail(job, "boom")
    data = ConsoleData(pool, queue)
    assert await data.cancel_dead("email") == 2
    assert await data.dead_count("email") == 0
    assert await data.dead_count("resize") == 1
    errors = await pool.fetch("SELECT last_error FROM pgfleet.jobs WHERE name = 'email'")
    assert [r["last_error"] for r in errors] == ["boom", "boom"]


def test_filters_refuse_invalid_names() -> None:
    with pytest.raises(InvalidName, match="job name"):
        JobFilter(name="no spaces")
    with pytest.raises(InvalidName, match="queue name"):
        JobFilter(queue="x" * 200)
    with pytest.raises(InvalidOptions, match="limit_key"):
        JobFilter(key="x" * 600)


def _nodes(plan: dict[str, Any]) -> list[str]:
    found = [f"{plan['Node Type']} {plan.get('Index Name', plan.get('Relation Name', ''))}"]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


async def test_no_console_query_scans_the_jobs_table(pool: asyncpg.Pool) -> None:
    """On a table of retained history (the benchmark's mix, 50k jobs, analysed), every
    page query is served by an index: none reads pgfleet.jobs sequentially."""
    from pgfleet.db import Q
    from pgfleet.db.console import CQ
    from pgfleet.service.console.data import MAX_ID, MIN_ID
    from tools.console_bench import _SEED

    await pool.execute(_SEED, 50_000)
    await pool.execute("ANALYZE pgfleet.jobs")
    page = CQ.console_jobs_page.sql
    cases = {
        "newest": (page, None, None, None, MAX_ID, MIN_ID, 51, None),
        "dead": (page, "failed", None, None, MAX_ID, MIN_ID, 51, None),
        "dead of a kind": (page, "failed", "charge_card", None, MAX_ID, MIN_ID, 51, None),
        "dead of a limit key": (page, "failed", None, None, MAX_ID, MIN_ID, 51, "tenant-3"),
        "queued": (page, "queued", None, None, MAX_ID, MIN_ID, 51, None),
        "queued in a named queue": (page, "queued", None, "tenant-3", MAX_ID, MIN_ID, 51, None),
        "running": (page, "running", None, None, MAX_ID, MIN_ID, 51, None),
        "window end": (CQ.console_jobs_window_end.sql, MAX_ID, MIN_ID, 9_999),
        "dead count": (CQ.console_dead_count.sql, "charge_card"),
        "worker jobs": (CQ.console_worker_jobs.sql, UUID(int=1), 100),
        "overview per kind": (Q.queue_stats.sql,),
    }
    # The check itself sees a scan where there is one.
    cases["a kind's count (no index: for contrast)"] = (
        "SELECT count(*) FROM pgfleet.jobs WHERE name = $1",
        "charge_card",
    )
    async with pool.acquire() as conn:
        for what, (sql, *args) in cases.items():
            plan = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
            nodes = _nodes(json.loads(plan)[0]["Plan"])
            scans = any(n.startswith("Seq Scan jobs") for n in nodes)
            assert scans == what.endswith("(no index: for contrast)"), (what, nodes)


async def test_the_overview_shows_limits_pauses_and_the_jobs_waiting_on_them(
    pool: asyncpg.Pool,
) -> None:
    from pgfleet import EnqueueRequest
    from pgfleet.service.console.pages import Frame, overview_page

    queue = Queue(pool)
    await queue.set_limits("charge_card", concurrency=5, rate=100, per=60)
    await queue.enqueue_many([EnqueueRequest("report", {}) for _ in range(3)])
    await queue.pause("report")
    await queue.pause(queue_name="ledger")
    data = await ConsoleData(pool, queue).overview()
    assert [lim.name for lim in data.limits] == ["charge_card", "report"]
    assert data.waiting == [("report", "paused", 3)]
    page = str(overview_page(Frame(csrf=None, title="Overview", section="overview"), data, None))
    assert "Flow control" in page and "100 per 60 s" in page
    assert "3 paused" in page and "queue ledger" in page
