"""Workflows against a real Postgres: jobs that wait for other jobs, batches with a
callback, chains. Postgres decides every rule here (the trigger that settles a
finished parent's children, the row locks of parents finishing at once), so the
tests run real statements and real workers, never a stand-in."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from functools import partial
from typing import Any

import asyncpg
import pytest

from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    InvalidDependency,
    InvalidOptions,
    Job,
    JobStatus,
    PermanentError,
    Queue,
    Registry,
)
from pgfleet.db.store import Store
from pgfleet.testing import drain
from tools.devkit import until


def after(*parents: uuid.UUID | int, run_anyway: bool = False) -> EnqueueOptions:
    return EnqueueOptions(after=parents, run_anyway=run_anyway)


class Log:
    """A registry whose handlers note the order they ran in; ``fail`` fails for good."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.payloads: dict[str, Any] = {}
        self.registry = Registry()

        @self.registry.job("step")
        async def step(job: Job, payload: dict[str, Any]) -> None:
            self.ran.append(payload["tag"])
            self.payloads[payload["tag"]] = payload

        @self.registry.job("fail")
        async def fail(job: Job, payload: dict[str, Any]) -> None:
            self.ran.append(payload["tag"])
            raise PermanentError("no")


def step(tag: str, options: EnqueueOptions | None = None) -> EnqueueRequest:
    return EnqueueRequest("step", {"tag": tag}, options or EnqueueOptions())


async def waits_on_a_lock(pool: asyncpg.Pool, conn: Any) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
            conn.get_server_pid(),
        )
    )


async def status(queue: Queue, job_id: uuid.UUID) -> JobStatus:
    job = await queue.get(job_id)
    assert job is not None
    return job.status


# ------------------------------------------------------------------ dependencies


async def test_a_child_waits_outside_the_backlog_until_its_parent_succeeded(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    parent = await queue.enqueue("step", {"tag": "parent"})
    child = await queue.enqueue("step", {"tag": "child"}, options=after(parent))
    assert await status(queue, child) is JobStatus.WAITING
    assert await queue.runnable_backlog() == 1  # the parent only
    log = Log()
    stats = await drain(pool, log.registry)
    assert log.ran == ["parent", "child"] and stats.succeeded == 2
    p, c = await queue.get(parent), await queue.get(child)
    assert p is not None and c is not None and c.started_at is not None
    assert p.finished_at is not None and c.started_at >= p.finished_at


async def test_the_last_parent_to_succeed_makes_the_child_due_in_its_own_transaction(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    first, second = await queue.enqueue_many([step("a"), step("b")])
    child = await queue.enqueue("step", {"tag": "c"}, options=after(first, second))
    await queue.complete(first)
    assert await status(queue, child) is JobStatus.WAITING
    # Rolled back with the parent's completion: still waiting.
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await Store(conn).job_complete(id=second)
        await tx.rollback()
    assert await status(queue, child) is JobStatus.WAITING
    async with pool.acquire() as conn, conn.transaction():
        await Store(conn).job_complete(id=second)
        assert await status(queue, child) is JobStatus.WAITING  # not committed yet
    assert await status(queue, child) is JobStatus.QUEUED
    job = await queue.get(child)
    assert job is not None and job.run_at <= dt.datetime.now(dt.UTC)


async def test_two_parents_finishing_at_once_release_their_child_exactly_once(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    for _ in range(10):
        first, second = await queue.enqueue_many([step("a"), step("b")])
        child = await queue.enqueue("step", {"tag": "c"}, options=after(first, second))
        one, two = await pool.acquire(), await pool.acquire()
        try:
            tx1, tx2 = one.transaction(), two.transaction()
            await tx1.start()
            await tx2.start()
            # Each transaction finished one parent; neither sees the other's.
            await Store(one).job_complete(id=first)
            await Store(two).job_complete(id=second)
            # Both commit at once: at commit each locks the child, and the second
            # to get it counts the first's parent as done.
            await asyncio.gather(tx1.commit(), tx2.commit())
        finally:
            await pool.release(one)
            await pool.release(two)
        row = await pool.fetchrow(
            "SELECT status::text, waiting_on FROM pgfleet.jobs WHERE id = $1", child
        )
        assert row is not None and (row["status"], row["waiting_on"]) == ("queued", 0)


async def test_parents_of_the_same_children_finishing_crossed_never_deadlock(
    pool: asyncpg.Pool,
) -> None:
    # X runs after A anyway but not after a failed B; Y the other way round. A and B
    # fail in two transactions committing at once: one cancels Y and counts X off,
    # the other cancels X and counts Y off, each needing both children's locks.
    queue = Queue(pool)
    for _ in range(3):
        a, b = await queue.enqueue_many([step("a"), step("b")])
        x, y = await queue.enqueue_many(
            [
                step("x", EnqueueOptions(after=(a,), run_anyway=True)),
                step("y", EnqueueOptions(after=(b,), run_anyway=True)),
            ]
        )
        await queue.enqueue_many([step("x2", after(b)), step("y2", after(a))])
        # x waits on a (anyway) and b (not anyway); y on b (anyway) and a (not).
        await pool.execute(
            "INSERT INTO pgfleet.job_dependencies (child_id, parent_id) VALUES ($1, $2), ($3, $4)",
            x,
            b,
            y,
            a,
        )
        await pool.execute(
            "UPDATE pgfleet.jobs SET waiting_on = 2 WHERE id = ANY($1::uuid[])", [x, y]
        )
        one, two, holder = await pool.acquire(), await pool.acquire(), await pool.acquire()
        try:
            tx1, tx2, held = one.transaction(), two.transaction(), holder.transaction()
            await tx1.start()
            await tx2.start()
            await Store(one).job_permanently_fail(id=a, reason="a")
            await Store(two).job_permanently_fail(id=b, reason="b")
            # x is held elsewhere while both commit: b's commit queues for it first,
            # then a's (which, locking as it goes, would already hold y).
            await held.start()
            await holder.execute("SELECT 1 FROM pgfleet.jobs WHERE id = $1 FOR UPDATE", x)
            second = asyncio.create_task(tx2.commit())
            await until(partial(waits_on_a_lock, pool, two), what="b's commit to queue for x")
            first = asyncio.create_task(tx1.commit())
            await until(partial(waits_on_a_lock, pool, one), what="a's commit to queue for x")
            await held.rollback()
            await asyncio.gather(first, second)
        finally:
            for conn in (one, two, holder):
                await pool.release(conn)
        assert await status(queue, x) is JobStatus.CANCELLED
        assert await status(queue, y) is JobStatus.CANCELLED


async def test_a_failed_parent_cancels_its_descendants_naming_it_unless_they_run_anyway(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    parent = await queue.enqueue("fail", {"tag": "parent"})
    child, grandchild, _cleanup = await queue.enqueue_many(
        [
            step("child", after(parent)),
            step("grandchild", after(0)),
            step("cleanup", after(parent, run_anyway=True)),
        ]
    )
    log = Log()
    await drain(pool, log.registry)
    assert log.ran == ["parent", "cleanup"]
    for job_id in (child, grandchild):
        job = await queue.get(job_id)
        assert job is not None and job.status is JobStatus.CANCELLED
    c, g = await queue.get(child), await queue.get(grandchild)
    assert c is not None and g is not None
    assert c.last_error == f"cancelled: parent job {parent} failed"
    assert g.last_error == f"cancelled: parent job {child} cancelled"


async def test_cancelling_a_waiting_job_cancels_its_children(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    root = await queue.enqueue("step", {"tag": "root"}, options=EnqueueOptions(delay=3600))
    middle, leaf = await queue.enqueue_many([step("m", after(root)), step("l", after(0))])
    cancelled = await queue.cancel(middle)
    assert cancelled.status is JobStatus.CANCELLED
    assert await status(queue, leaf) is JobStatus.CANCELLED


async def test_parents_in_the_same_batch_run_first_in_order(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many(
        [step("c", after(1)), step("b", after(2)), step("a"), step("d", after(0, 1))]
    )
    assert [await status(queue, i) for i in ids] == [JobStatus.WAITING] * 2 + [
        JobStatus.QUEUED,
        JobStatus.WAITING,
    ]
    log = Log()
    await drain(pool, log.registry)
    assert log.ran == ["a", "b", "c", "d"]


async def test_a_parent_enqueued_earlier_in_the_same_transaction_counts(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    async with pool.acquire() as conn, conn.transaction():
        parent = await queue.enqueue("step", {"tag": "p"}, connection=conn)
        child = await queue.enqueue("step", {"tag": "c"}, options=after(parent), connection=conn)
    log = Log()
    await drain(pool, log.registry)
    assert log.ran == ["p", "c"]
    assert await status(queue, child) is JobStatus.SUCCEEDED


async def test_a_child_of_finished_parents_is_settled_at_enqueue(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    done, failed = await queue.enqueue_many([step("x"), step("y")])
    await queue.complete(done)
    await queue.permanently_fail(failed)
    due = await queue.enqueue("step", {"tag": "due"}, options=after(done))
    stopped = await queue.enqueue("step", {"tag": "stopped"}, options=after(done, failed))
    anyway = await queue.enqueue("step", {"tag": "a"}, options=after(failed, run_anyway=True))
    assert await status(queue, due) is JobStatus.QUEUED
    assert await status(queue, stopped) is JobStatus.CANCELLED
    assert await status(queue, anyway) is JobStatus.QUEUED


async def test_unknown_parents_are_refused_and_nothing_is_written(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ghost = uuid.uuid4()
    with pytest.raises(InvalidDependency, match=str(ghost)):
        await queue.enqueue_many([step("a"), step("b", after(ghost))])
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs") == 0
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.job_dependencies") == 0


async def test_cycles_and_indexes_outside_the_batch_are_refused(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    with pytest.raises(InvalidDependency, match=r"cycle \(items 0 -> 1 -> 2 -> 0\)"):
        await queue.enqueue_many([step("a", after(1)), step("b", after(2)), step("c", after(0))])
    with pytest.raises(InvalidDependency, match="cycle"):
        await queue.enqueue("step", {"tag": "self"}, options=after(0))
    with pytest.raises(InvalidDependency, match="item 5"):
        await queue.enqueue_many([step("a", after(5))])
    with pytest.raises(InvalidOptions, match="job_key"):
        EnqueueOptions(after=(uuid.uuid4(),), job_key="k")
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs") == 0


# ------------------------------------------------------------------ batches and chains


async def test_a_batch_runs_its_callback_once_with_the_members_outcomes(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    members = [step(f"m{i}") for i in range(6)] + [EnqueueRequest("fail", {"tag": "bad"})]
    batch_id, ids = await queue.enqueue_batch(
        members, callback=EnqueueRequest("step", {"tag": "done"})
    )
    assert len(ids) == 7
    await queue.cancel(ids[0])
    progress = await queue.batch_progress(batch_id)
    assert (progress.size, progress.cancelled, progress.pending) == (7, 1, 6)
    assert progress.callback_status is JobStatus.WAITING and not progress.finished
    log = Log()
    await drain(pool, log.registry)
    assert log.ran.count("done") == 1 and log.ran[-1] == "done"
    assert log.payloads["done"]["batch"] == {
        "id": str(batch_id),
        "size": 7,
        "succeeded": 5,
        "failed": 1,
        "cancelled": 1,
    }
    progress = await queue.batch_progress(batch_id)
    assert progress.finished and progress.callback_status is JobStatus.SUCCEEDED


async def test_a_batch_callback_needs_an_object_payload_and_members(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    with pytest.raises(InvalidOptions, match="JSON object"):
        await queue.enqueue_batch([step("a")], callback=EnqueueRequest("step", [1]))
    with pytest.raises(InvalidOptions, match="at least one"):
        await queue.enqueue_batch([], callback=EnqueueRequest("step"))


async def test_a_chain_runs_in_order_and_stops_at_a_failure(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ok = await queue.enqueue_chain([step("1"), step("2"), step("3")])
    broken = await queue.enqueue_chain([step("x"), EnqueueRequest("fail", {"tag": "y"}), step("z")])
    log = Log()
    await drain(pool, log.registry, concurrency=4)
    assert [t for t in log.ran if t in "123"] == ["1", "2", "3"]
    assert [t for t in log.ran if t in "xyz"] == ["x", "y"]
    assert await status(queue, ok[2]) is JobStatus.SUCCEEDED
    assert await status(queue, broken[2]) is JobStatus.CANCELLED
    parents = await queue.parents(ok[2])
    assert [(p.id, p.status) for p in parents] == [(ok[1], JobStatus.SUCCEEDED)]
    children = await queue.children(ok[0])
    assert [c.id for c in children] == [ok[1]]
