"""When an idle claim loop wakes for the next scheduled job (job_next_due), against
a real Postgres: which jobs count, and that a backlog of due jobs the worker may
not take is not read on every idle check."""

from __future__ import annotations

import asyncpg

from pgfleet import EnqueueOptions, EnqueueRequest, Queue
from pgfleet.db.store import Store


async def _next_due(
    pool: asyncpg.Pool, names: list[str], queues: list[str] | None = None
) -> float | None:
    async with pool.acquire() as conn:
        return await Store(conn).job_next_due(job_names=names, queue_names=queues)


async def test_the_earliest_scheduled_job_of_the_served_names_and_queues_counts(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    assert await _next_due(pool, ["report"]) is None
    # Due now: not scheduled (the claim takes it).
    await queue.enqueue("report", {})
    assert await _next_due(pool, ["report"]) is None
    # The earliest across priorities, names and queues served; others ignored.
    await queue.enqueue("report", {}, options=EnqueueOptions(delay=600, priority=-5))
    await queue.enqueue("report", {}, options=EnqueueOptions(delay=300, priority=7))
    await queue.enqueue("other", {}, options=EnqueueOptions(delay=10))
    await queue.enqueue("report", {}, options=EnqueueOptions(delay=60, queue_name="serial"))
    both = await _next_due(pool, ["report"])
    assert both is not None and 50 < both <= 60
    elsewhere = await _next_due(pool, ["report"], ["serial-2"])
    assert elsewhere is None
    in_queue = await _next_due(pool, ["report"], ["serial"])
    assert in_queue is not None and 50 < in_queue <= 60
    await pool.execute("DELETE FROM pgfleet.jobs WHERE queue_name = 'serial'")
    later = await _next_due(pool, ["report"])
    assert later is not None and 290 < later <= 300
    assert (await _next_due(pool, ["other", "report"]) or 0) <= 10


async def test_an_idle_check_reads_none_of_the_due_backlog(pool: asyncpg.Pool) -> None:
    # 3,000 due jobs this worker does not take (names other workers serve, busy
    # with them), then one scheduled job of its own: it asks each time it goes
    # idle, and used to read every due entry to get past them.
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("export", {}) for _ in range(2000)])
    await queue.enqueue_many(
        [EnqueueRequest("export", {}, EnqueueOptions(priority=3)) for _ in range(1000)]
    )
    await queue.enqueue("report", {}, options=EnqueueOptions(delay=120, priority=3))
    await pool.execute("ANALYZE pgfleet.jobs")

    async def reads() -> int:
        # Index entries and rows read by scans of the queue, whichever the plan.
        value = await pool.fetchval(
            "SELECT (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes"
            "        WHERE schemaname = 'pgfleet' AND relname = 'jobs')"
            "     + (SELECT seq_tup_read FROM pg_stat_user_tables"
            "        WHERE schemaname = 'pgfleet' AND relname = 'jobs')"
        )
        return int(value)

    before = await reads()
    async with pool.acquire() as conn:
        for _ in range(5):
            due = await Store(conn).job_next_due(job_names=["report"], queue_names=None)
            assert due is not None and 110 < due <= 120
        # Pending statistics reach shared memory as this backend goes idle.
        await conn.execute("SELECT pg_stat_force_next_flush()")
    # Reading the backlog: 5 checks x 3,000 entries. Now a few descents a check.
    assert await reads() - before < 200
