"""Finished jobs in day partitions of pgfleet.jobs_history (migration 0010): the
leader prepares days ahead, moves finished jobs in batches, drops whole days past
the retention; every read sees a job wherever it lives."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    JobStatus,
    Queue,
    Worker,
    WorkerConfig,
    migrate,
    migrations,
)
from pgfleet._runtime.maintenance import HISTORY_ROUND_BATCHES
from pgfleet.db.store import Store
from pgfleet.service.console.data import ConsoleData, JobFilter
from tests.apps import runtime_app
from tests.helpers import put_in_state
from tests.integration.conftest import FAST
from tools.devkit import until

DAY = 86400.0
#: The history migration's number (renumbered at a merge: read it, never write it).
HISTORY_VERSION = next(m.version for m in migrations() if m.name == "history_partitions")


def leader(pool: asyncpg.Pool, **config: object) -> Worker:
    cfg: dict[str, object] = {"history_move_after": 60.0, "prune_batch_size": 100, **FAST}
    cfg.update(config)
    return Worker(pool, runtime_app.registry, WorkerConfig(**cfg))  # type: ignore[arg-type]


async def partitions(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = 'pgfleet.jobs_history'::regclass ORDER BY 1"
    )
    return [r["relname"] for r in rows]


async def where(pool: asyncpg.Pool, job_id: uuid.UUID) -> list[str]:
    """The tables (partitions) that hold the job."""
    rows = await pool.fetch(
        "SELECT 'jobs' AS t FROM ONLY pgfleet.jobs WHERE id = $1"
        " UNION ALL SELECT tableoid::regclass::text FROM pgfleet.jobs_history WHERE id = $1",
        job_id,
    )
    return [r["t"].removeprefix("pgfleet.") for r in rows]


def day_name(moment: datetime) -> str:
    return "jobs_history_" + moment.astimezone(UTC).strftime("%Y%m%d")


async def test_the_leader_creates_day_partitions_ahead(pool: asyncpg.Pool) -> None:
    worker = leader(pool)
    assert worker.historian is not None
    assert await worker.historian.prepare() == 8  # today and 7 days ahead
    today = await pool.fetchval("SELECT now()")
    expected = [day_name(today + timedelta(days=d)) for d in range(8)]
    assert await partitions(pool) == sorted([*expected, "jobs_history_default"])
    assert await worker.historian.prepare() == 0  # idempotent


async def test_after_a_week_offline_the_days_of_waiting_jobs_are_created(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    old = await queue.enqueue("record", {})
    await put_in_state(pool, old, "succeeded", finished_ago_s=7 * DAY)
    worker = leader(pool)
    assert worker.historian is not None
    assert await worker.historian.prepare() == 15  # 7 days back, today, 7 ahead
    assert await worker.historian.move() == 1
    finished = await pool.fetchval("SELECT finished_at FROM pgfleet.jobs_all WHERE id = $1", old)
    assert await where(pool, old) == [day_name(finished)]


async def test_finished_jobs_move_and_every_read_still_finds_them(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many([EnqueueRequest("record", {"i": i}) for i in range(250)])
    fresh, running, queued = [await queue.enqueue("record", {}) for _ in range(3)]
    for i, job_id in enumerate(ids):
        await put_in_state(
            pool, job_id, "failed" if i % 5 == 0 else "succeeded", finished_ago_s=600
        )
    await put_in_state(pool, fresh, "succeeded", finished_ago_s=1)
    await put_in_state(pool, running, "running")
    before = {job_id: await queue.get(job_id) for job_id in [*ids, fresh, running, queued]}
    counts = await queue.counts()
    recent = await queue.recent(limit=50)
    stats = [(k.name, k.queued, k.running, k.dead) for k in await Store(pool).queue_stats()]
    data = ConsoleData(pool, queue)
    pages = [
        [dict(r) for r in (await data.jobs(f, None, 100)).rows]
        for f in (JobFilter(), JobFilter(status=JobStatus.FAILED, name="record"))
    ]
    worker = leader(pool)
    assert worker.historian is not None
    await worker.historian.prepare()
    assert await worker.historian.move() == 250  # three batches of 100
    assert await worker.historian.move() == 0
    assert await pool.fetchval("SELECT count(*) FROM ONLY pgfleet.jobs") == 3
    for job_id in ids:
        assert (await where(pool, job_id))[0].startswith("jobs_history_2")
    for job_id in (fresh, running, queued):
        assert await where(pool, job_id) == ["jobs"]
    # Each job reads back exactly as it did, one by one, many at once, in lists.
    assert {job_id: await queue.get(job_id) for job_id in before} == before
    assert await queue.statuses(before) == {k: v.status for k, v in before.items() if v}
    assert await queue.counts() == counts
    assert await queue.recent(limit=50) == recent
    after = [(k.name, k.queued, k.running, k.dead) for k in await Store(pool).queue_stats()]
    assert after == stats  # the dead gauge counts history
    assert await data.dead_count("record") == 50
    assert [
        [dict(r) for r in (await data.jobs(f, None, 100)).rows]
        for f in (JobFilter(), JobFilter(status=JobStatus.FAILED, name="record"))
    ] == pages
    assert len(pages[1]) == 50


async def test_a_reader_never_misses_a_job_while_it_moves(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(2000)])
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'succeeded', attempt = 1, started_at = now(),"
        " finished_at = now() - interval '1 hour'"
    )
    worker = leader(pool, prune_batch_size=50)
    assert worker.historian is not None
    await worker.historian.prepare()
    store = Store(pool)
    seen: list[int] = []

    async def read() -> None:
        while worker.historian is not None and worker.historian.moved < 2000:
            seen.append(len(await store.job_get_many(ids=ids)))

    reader = asyncio.create_task(read())
    await worker.historian.move()
    await reader
    assert seen and set(seen) == {2000}


async def test_a_job_finishing_at_midnight_belongs_to_the_day_it_opens(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    at_midnight, just_before = await queue.enqueue("record", {}), await queue.enqueue("record", {})
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'succeeded', attempt = 1, started_at = $2,"
        " finished_at = CASE WHEN id = $1 THEN $2::timestamptz"
        "                   ELSE $2::timestamptz - interval '1 microsecond' END",
        at_midnight,
        midnight,
    )
    worker = leader(pool)
    assert worker.historian is not None
    await worker.historian.prepare()
    assert await worker.historian.move() == 2
    assert await where(pool, at_midnight) == [day_name(midnight)]
    assert await where(pool, just_before) == [day_name(midnight - timedelta(days=1))]


async def test_retention_drops_whole_days_and_lookups_of_pruned_jobs_miss(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    old, kept = await queue.enqueue("record", {}), await queue.enqueue("record", {})
    await put_in_state(pool, old, "succeeded", finished_ago_s=3 * DAY)
    await put_in_state(pool, kept, "failed", finished_ago_s=600)
    worker = leader(pool, finished_job_retention=DAY)
    assert worker.historian is not None
    # Days from five days back: as a fleet whose retention was longer has them.
    await pool.execute("SELECT pgfleet.jobs_history_prepare(current_date - 5, 7)")
    await worker.historian.move()
    old_day = (await where(pool, old))[0]
    assert old_day.startswith("jobs_history_2")
    deletes_before = await pool.fetchval(
        "SELECT n_tup_del FROM pg_stat_xact_user_tables WHERE relname = $1", old_day
    )
    dropped = await worker.historian.drop()
    assert old_day in dropped and "jobs_history_default" not in dropped
    assert old_day not in await partitions(pool)
    assert deletes_before in (None, 0)
    assert await queue.get(old) is None
    assert await queue.statuses([old, kept]) == {kept: "failed"}
    got = await queue.get(kept)
    assert got is not None and got.status == "failed"
    assert await worker.historian.drop() == []


async def test_retention_deletes_the_default_partitions_old_rows(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    stray = await queue.enqueue("record", {})
    await put_in_state(pool, stray, "succeeded", finished_ago_s=40 * DAY)
    # No day partition covers it (retention keeps 30 days): the DEFAULT takes it.
    worker = leader(pool, finished_job_retention=30 * DAY)
    assert worker.historian is not None
    await worker.historian.prepare()
    await worker.historian.move()
    assert await where(pool, stray) == ["jobs_history_default"]
    assert await worker.historian.drop() == ["jobs_history_default"]
    assert await queue.get(stray) is None


async def test_a_day_created_later_takes_its_rows_from_the_default(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ahead = await queue.enqueue("record", {})
    await put_in_state(pool, ahead, "succeeded", finished_ago_s=-20 * DAY)  # a clock ahead
    await pool.execute(
        "UPDATE pgfleet.jobs SET finished_at = now() - interval '1 hour' WHERE id = $1", ahead
    )
    worker = leader(pool)
    assert worker.historian is not None
    await worker.historian.prepare()
    await worker.historian.move()
    far = datetime.now(UTC) + timedelta(days=20)
    await pool.execute("UPDATE pgfleet.jobs_history SET finished_at = $2 WHERE id = $1", ahead, far)
    assert await where(pool, ahead) == ["jobs_history_default"]
    assert await pool.fetchval("SELECT pgfleet.jobs_history_prepare(NULL, 21)") == 14
    assert await where(pool, ahead) == [day_name(far)]


async def test_retry_of_a_moved_dead_job_brings_it_back(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    dead, dead2, dead3 = [await queue.enqueue("record", {}) for _ in range(3)]
    for job_id in (dead, dead2, dead3):
        await put_in_state(pool, job_id, "failed", finished_ago_s=600)
    worker = leader(pool)
    assert worker.historian is not None
    await worker.historian.prepare()
    assert await worker.historian.move() == 3
    retried = await queue.retry(dead)
    assert retried.status == "queued" and retried.id == dead
    assert await where(pool, dead) == ["jobs"]
    data = ConsoleData(pool, queue)
    assert await data.retry_dead("record") == (2, 0)
    assert await where(pool, dead2) == ["jobs"]
    assert (await queue.get(dead2)).status == "queued"  # type: ignore[union-attr]
    await put_in_state(pool, dead3, "failed", finished_ago_s=600)
    assert await worker.historian.move() == 1
    assert await data.cancel_dead("record") == 1
    assert (await queue.get(dead3)).status == "cancelled"  # type: ignore[union-attr]


async def test_a_moved_parent_keeps_its_children_and_edges(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    parent = await queue.enqueue("record", {})
    child = await queue.enqueue("record", {}, options=EnqueueOptions(after=[parent]))
    await put_in_state(pool, parent, "succeeded", finished_ago_s=600)
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'succeeded', attempt = 1, started_at = now(),"
        " finished_at = now() - interval '10 minutes' WHERE id = $1",
        child,
    )
    worker = leader(pool)
    assert worker.historian is not None
    await worker.historian.prepare()
    assert await worker.historian.move() == 1  # the parent; the child keeps its edge
    assert (await where(pool, parent))[0].startswith("jobs_history_2")
    assert await where(pool, child) == ["jobs"]
    parents = await queue.parents(child)
    assert [(p.id, p.status) for p in parents] == [(parent, "succeeded")]
    assert [c.id for c in await queue.children(parent)] == [child]


async def test_a_child_enqueued_after_a_parent_in_history_is_settled(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    done, dead = await queue.enqueue("record", {}), await queue.enqueue("record", {})
    await put_in_state(pool, done, "succeeded", finished_ago_s=600)
    await put_in_state(pool, dead, "failed", finished_ago_s=600)
    worker = leader(pool)
    assert worker.historian is not None
    await worker.historian.prepare()
    assert await worker.historian.move() == 2
    runs = await queue.enqueue("record", {}, options=EnqueueOptions(after=[done]))
    cancelled = await queue.enqueue("record", {}, options=EnqueueOptions(after=[dead]))
    assert (await queue.get(runs)).status == "queued"  # type: ignore[union-attr]
    assert (await queue.get(cancelled)).status == "cancelled"  # type: ignore[union-attr]


async def test_waiting_for_a_job_in_history_returns_it(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("record", {})
    await put_in_state(pool, job_id, "succeeded", finished_ago_s=600)
    worker = leader(pool)
    assert worker.historian is not None
    await worker.historian.prepare()
    assert await worker.historian.move() == 1
    job = await queue.wait(job_id, timeout=10)
    assert job.id == job_id and job.status == "succeeded"


async def test_queue_prune_finished_reaches_history(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(5)])
    for job_id in ids[:3]:
        await put_in_state(pool, job_id, "succeeded", finished_ago_s=3 * DAY)
    for job_id in ids[3:]:
        await put_in_state(pool, job_id, "succeeded", finished_ago_s=2 * 3600)
    worker = leader(pool)
    assert worker.historian is not None
    await worker.historian.prepare()
    assert await worker.historian.move() == 5
    assert await queue.prune_finished(3600) == 5
    assert sum((await queue.counts()).values()) == 0


async def test_migration_on_a_populated_jobs_table(pool: asyncpg.Pool) -> None:
    """0010 on a table of 300,000 finished jobs: catalog only, no row moves; then
    the leader moves them in batches and every one reads back."""
    await pool.execute(
        "DROP VIEW pgfleet.jobs_all; DROP TABLE pgfleet.jobs_history;"
        " DROP FUNCTION pgfleet.jobs_history_drop, pgfleet.jobs_history_prepare,"
        " pgfleet.job_status_now, pgfleet.jobs_history_add_day"
    )
    await pool.execute("DELETE FROM pgfleet.schema_migrations WHERE version = $1", HISTORY_VERSION)
    await pool.execute(
        "INSERT INTO pgfleet.jobs (id, name, payload, status, attempt, max_attempts,"
        " started_at, finished_at)"
        " SELECT gen_random_uuid(), 'record', '{}', 'succeeded', 1, 3, now(),"
        "        now() - make_interval(secs => g % 86400)"
        " FROM generate_series(1, 300000) g"
    )
    # A worker's transaction in flight (ROW EXCLUSIVE on pgfleet.jobs, as a claim or
    # completion holds): the migration takes only ACCESS SHARE, so it does not wait.
    busy = await pool.acquire()
    busy_tx = busy.transaction()
    await busy_tx.start()
    await busy.execute(
        "UPDATE pgfleet.jobs SET attempt = 2 WHERE id = (SELECT id FROM pgfleet.jobs LIMIT 1)"
    )
    started = time.perf_counter()
    try:
        assert await asyncio.wait_for(migrate(pool), 10) == [HISTORY_VERSION]
    finally:
        await busy_tx.rollback()
        await pool.release(busy)
    elapsed = time.perf_counter() - started
    print(f"migration 0010 on 300,000 rows: {elapsed * 1000:.1f} ms")
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs_history") == 0
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs_all") == 300000
    worker = leader(pool, prune_batch_size=10000)
    assert worker.historian is not None
    await worker.historian.prepare()
    assert await worker.historian.move() == 300000 - await pool.fetchval(
        "SELECT count(*) FROM ONLY pgfleet.jobs"
    )
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs_all") == 300000


async def test_a_historian_behind_starts_its_next_round_at_once(pool: asyncpg.Pool) -> None:
    """More finished jobs than a round moves (HISTORY_ROUND_BATCHES batches): the
    next round runs at once, not a prune_interval later, or a busy queue's claim
    table would grow by the difference every interval."""
    total = HISTORY_ROUND_BATCHES + 5
    await Queue(pool).enqueue_many([EnqueueRequest("record", {}) for _ in range(total)])
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'succeeded', attempt = 1, started_at = now(),"
        " finished_at = now() - interval '10 minutes'"
    )
    worker = leader(pool, prune_batch_size=1, prune_interval=3600.0)
    await worker.heartbeat.run_once()
    historian = worker.historian
    assert worker.is_leader and historian is not None

    async def all_moved() -> bool:
        return historian.moved == total

    historian.start()
    try:
        await until(all_moved, timeout=60, what="every job moved")
    finally:
        await historian.stop()
    assert not historian.behind
    assert await pool.fetchval("SELECT count(*) FROM ONLY pgfleet.jobs") == 0
    await worker.heartbeat.deregister()
