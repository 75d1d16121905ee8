"""The workflow triggers of migration 0014: no AFTER UPDATE row trigger on
pgfleet.jobs (Postgres would fetch the old version of every row every UPDATE
writes), a statement trigger that settles the parents each statement finished,
and a DELETE trigger that drops a child's edges. Each path that finishes a parent
is run for real, and the migration on a database of the version before it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, JobStatus, Queue, migrate, migrations
from pgfleet.db.migrate import MIGRATION_LOCK_KEY
from pgfleet.db.store import Store
from pgfleet.testing import drain
from tests import pgharness
from tests.helpers import put_in_state
from tests.integration.test_workflows import Log, after, status, step
from tools.devkit import postgres as kit

#: This migration's number (renumbered at a merge: read it, never write it).
TRIGGERS_VERSION = next(m.version for m in migrations() if m.name == "workflow_triggers")

ROW, BEFORE, INSERT, DELETE, UPDATE, INSTEAD = 1, 2, 4, 8, 16, 64


async def edges_of(pool: asyncpg.Pool, child: uuid.UUID) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM pgfleet.job_dependencies WHERE child_id = $1", child
        )
    )


async def test_no_update_row_trigger_is_left_on_the_jobs_table(pool: asyncpg.Pool) -> None:
    """Any AFTER (or BEFORE) UPDATE row trigger, a foreign key's included, makes
    every UPDATE of pgfleet.jobs fetch each row's old version (PostgreSQL 15)."""
    rows = await pool.fetch(
        "SELECT tgname, tgtype FROM pg_trigger WHERE tgrelid = 'pgfleet.jobs'::regclass"
    )
    on_update = [r["tgname"] for r in rows if r["tgtype"] & ROW and r["tgtype"] & UPDATE]
    assert on_update == []
    referencing = await pool.fetchval(
        "SELECT count(*) FROM pg_constraint WHERE confrelid = 'pgfleet.jobs'::regclass"
    )
    assert referencing == 0
    # The one row trigger on DELETE fires for jobs with parents only.
    deletes = [r["tgname"] for r in rows if r["tgtype"] & ROW and r["tgtype"] & DELETE]
    assert deletes == ["jobs_child_deleted"]


async def test_deleting_or_pruning_a_child_drops_its_edges_and_only_its(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    parent, other = await queue.enqueue_many([step("p"), step("o")])
    pruned, deleted, kept = await queue.enqueue_many(
        [step("c1", after(parent)), step("c2", after(parent, other)), step("c3", after(other))]
    )
    await queue.complete(parent)
    assert await status(queue, pruned) is JobStatus.QUEUED
    await put_in_state(pool, pruned, "succeeded", finished_ago_s=7200)
    assert await queue.prune_finished(3600) == 1  # the child; its parent is recent
    assert await edges_of(pool, pruned) == 0
    await pool.execute("DELETE FROM pgfleet.jobs WHERE id = $1", deleted)
    assert await edges_of(pool, deleted) == 0
    # A deleted parent leaves its children's edges (their outcome is recorded there).
    await pool.execute("DELETE FROM pgfleet.jobs WHERE id = $1", other)
    assert await edges_of(pool, kept) == 1
    # TRUNCATE of the jobs takes the edges with it (the key's CASCADE did).
    await pool.execute("TRUNCATE pgfleet.jobs")
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.job_dependencies") == 0


async def test_a_parent_released_or_cancelled_through_each_path_that_finishes_it(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    store = Store(pool)
    parents = await queue.enqueue_many(
        [step(tag, EnqueueOptions(max_attempts=1)) for tag in "abcdefg"]
    )
    children = await queue.enqueue_many([step(f"{i}", after(p)) for i, p in enumerate(parents)])
    completed, cancelled, failed, rescued, cancel_running, by_sql, two_updates = parents

    await store.job_complete(id=completed)  # the API's and Queue.complete's
    await queue.cancel(cancelled)  # a queued parent: cancelled at once
    await store.job_permanently_fail(id=failed, reason="operator")
    # A dead worker's job on its last attempt: the leader's rescue buries it.
    await put_in_state(pool, rescued, "running", attempt=1)
    assert {r.job_id for r in await store.job_rescue(limit=100) if r.job_id} == {rescued}
    # A running job someone asked to cancel: the rescue ends it cancelled.
    await put_in_state(pool, cancel_running, "running", attempt=1)
    await queue.cancel(cancel_running)
    assert {r.job_id for r in await store.job_rescue(limit=100) if r.job_id} == {cancel_running}
    # SQL by hand.
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'failed', finished_at = now() WHERE id = $1", by_sql
    )
    # A statement whose last UPDATE of the table sets no status: Postgres keeps one
    # AFTER STATEMENT event per table and statement, the last one queued.
    await pool.execute(
        "WITH done AS (UPDATE pgfleet.jobs SET status = 'succeeded', finished_at = now()"
        "              WHERE id = $1 RETURNING id)"
        " UPDATE pgfleet.jobs SET awaited = true WHERE id = $2",
        two_updates,
        children[0],
    )
    expected = [
        JobStatus.QUEUED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.QUEUED,
    ]
    assert [await status(queue, c) for c in children] == expected
    reasons = [(await queue.get(c)).last_error for c in children[1:6]]  # type: ignore[union-attr]
    assert reasons == [
        f"cancelled: parent job {cancelled} cancelled",
        f"cancelled: parent job {failed} failed",
        f"cancelled: parent job {rescued} failed",
        f"cancelled: parent job {cancel_running} cancelled",
        f"cancelled: parent job {by_sql} failed",
    ]
    # Every parent is marked settled; none is left for the trigger's index.
    marks = await pool.fetch(
        "SELECT has_children FROM pgfleet.jobs WHERE id = ANY($1::uuid[])", parents
    )
    assert [m["has_children"] for m in marks] == [False] * len(parents)


async def test_a_parent_finished_while_another_session_holds_key_share_is_settled(
    pool: asyncpg.Pool,
) -> None:
    """A foreign key's check (or any FOR KEY SHARE) on the parent's row does not
    conflict with the UPDATE that finishes it, so it must not make the trigger skip
    the parent: a skipped parent commits finished and unsettled, and its children
    wait for ever once it moves to history."""
    queue = Queue(pool)
    (parent,) = await queue.enqueue_many([step("p")])
    (child,) = await queue.enqueue_many([step("c", after(parent))])
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM pgfleet.jobs WHERE id = $1 FOR KEY SHARE", parent)
        await Store(pool).job_complete(id=parent)
        assert await status(queue, child) == JobStatus.QUEUED
    marked = await pool.fetchval("SELECT has_children FROM pgfleet.jobs WHERE id = $1", parent)
    assert marked is False


async def test_workers_finish_parents_in_their_rounds_removing_or_not(pool: asyncpg.Pool) -> None:
    """The worker's completion (inside its claim statement), a failure on the last
    attempt, and removal at completion, which never removes a parent."""
    queue = Queue(pool)
    ok, bad, plain = await queue.enqueue_many(
        [step("ok"), EnqueueRequest("fail", {"tag": "bad"}), step("plain")]
    )
    child, doomed = await queue.enqueue_many([step("child", after(ok)), step("d", after(bad))])
    log = Log()
    stats = await drain(pool, log.registry, remove_succeeded_jobs=True)
    assert log.ran == ["ok", "bad", "plain", "child"] and stats.succeeded == 3
    # Kept: a parent, and a child (its edges stay readable); removed: the rest.
    assert await status(queue, ok) is JobStatus.SUCCEEDED
    assert await status(queue, child) is JobStatus.SUCCEEDED
    assert await queue.get(plain) is None
    assert await status(queue, doomed) is JobStatus.CANCELLED


async def test_one_transaction_finishing_many_parents_releases_every_child(
    pool: asyncpg.Pool,
) -> None:
    """300 parents finished in one UPDATE: the deferred trigger fires once per edge,
    the first call applies them all and the others skip (pgfleet.edges_pending)."""
    queue = Queue(pool)
    parents = await queue.enqueue_many([step(f"p{i}") for i in range(300)])
    children = await queue.enqueue_many([step(f"c{i}", after(p)) for i, p in enumerate(parents)])
    # And one child of all of them: 300 edges to settle for one child.
    (joined,) = await queue.enqueue_many([step("joined", after(*parents))])
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'succeeded', finished_at = now()"
        " WHERE id = ANY($1::uuid[])",
        parents,
    )
    rows = await pool.fetch(
        "SELECT status::text AS s, count(*) AS n FROM pgfleet.jobs"
        " WHERE id = ANY($1::uuid[]) GROUP BY 1",
        [*children, joined],
    )
    assert {r["s"]: r["n"] for r in rows} == {"queued": 301}
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.job_dependencies WHERE pending") == 0


async def test_a_cancellation_cascades_two_levels_within_one_commit(pool: asyncpg.Pool) -> None:
    """The settling cancels a child that has children: their edges are marked pending
    by the settling itself, after the call that did the work, and still applied
    before the commit ends, among many edges that are not."""
    queue = Queue(pool)
    root, *others = await queue.enqueue_many([step(f"p{i}") for i in range(50)])
    (child,) = await queue.enqueue_many([step("child", after(root))])
    (grandchild,) = await queue.enqueue_many([step("grandchild", after(child))])
    great, spared = await queue.enqueue_many(
        [step("great", after(grandchild)), step("spared", after(grandchild, run_anyway=True))]
    )
    released = await queue.enqueue_many([step(f"r{i}", after(p)) for i, p in enumerate(others)])
    await pool.execute(
        "UPDATE pgfleet.jobs SET finished_at = now(),"
        " status = CASE WHEN id = $1 THEN 'failed' ELSE 'succeeded' END::pgfleet.job_status"
        " WHERE id = $1 OR id = ANY($2::uuid[])",
        root,
        others,
    )
    assert [await status(queue, j) for j in (child, grandchild, great, spared)] == [
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        JobStatus.QUEUED,
    ]
    reasons = [(await queue.get(j)).last_error for j in (child, grandchild, great)]  # type: ignore[union-attr]
    assert reasons == [
        f"cancelled: parent job {root} failed",
        f"cancelled: parent job {child} cancelled",
        f"cancelled: parent job {grandchild} cancelled",
    ]
    assert {await status(queue, j) for j in released} == {JobStatus.QUEUED}


async def test_a_settling_rolled_back_with_its_savepoint_is_done_again_at_commit(
    pool: asyncpg.Pool,
) -> None:
    """The transaction's flag is undone with the savepoint, as the edges are: edges
    marked before it and applied inside it are pending again, and applied at commit;
    a parent finished inside a savepoint rolled back releases nothing."""
    queue = Queue(pool)
    kept, undone = await queue.enqueue_many([step("kept"), step("undone")])
    kept_child, undone_child = await queue.enqueue_many(
        [step("kc", after(kept)), step("uc", after(undone))]
    )
    finish = "UPDATE pgfleet.jobs SET status = 'succeeded', finished_at = now() WHERE id = $1"
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(finish, kept)
        await conn.execute("SAVEPOINT settled")
        assert await conn.fetchval("SELECT pgfleet.job_settle_pending()") == 1
        await conn.execute(finish, undone)
        await conn.execute("ROLLBACK TO SAVEPOINT settled")
        assert (
            await conn.fetchval("SELECT status::text FROM pgfleet.jobs WHERE id = $1", kept_child)
            == "waiting"
        )
    assert await status(queue, kept_child) is JobStatus.QUEUED
    assert await status(queue, undone_child) is JobStatus.WAITING


@pytest.fixture
async def database_before(pg_server: pgharness.Server) -> AsyncIterator[str]:
    """A database migrated to the version before this migration."""
    name = pg_server.next_name()
    dsn = await kit.create_database(pg_server.admin_dsn, name, template="template0")
    try:
        conn = await asyncpg.connect(dsn)
        try:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
                await conn.execute(
                    "CREATE SCHEMA pgfleet; CREATE TABLE pgfleet.schema_migrations ("
                    " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                for m in migrations():
                    if m.version >= TRIGGERS_VERSION:
                        break
                    await conn.execute(m.sql)
                    await conn.execute(
                        "INSERT INTO pgfleet.schema_migrations (version, name, checksum)"
                        " VALUES ($1, $2, $3)",
                        m.version,
                        m.name,
                        m.checksum,
                    )
        finally:
            await conn.close()
        yield dsn
    finally:
        await pgharness.drop_database(pg_server, name)


async def test_migration_on_a_populated_table_keeps_unsettled_edges_working(
    database_before: str,
) -> None:
    """The version before: a child with one parent finished (its edge settled by
    0007's row trigger) and one not, a child its failed parent cancelled, and
    100,000 other jobs. Migrated, the unfinished parent releases its child when it
    finishes, and deleting a child drops its edges."""
    p1, p2, p3, c1, c2 = (uuid.uuid4() for _ in range(5))
    pool = await asyncpg.create_pool(database_before, min_size=1, max_size=4)
    try:
        await pool.execute(
            "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, status, finished_at)"
            " SELECT gen_random_uuid(), 'record', '{}', 3,"
            "        CASE WHEN g % 2 = 0 THEN 'queued' ELSE 'succeeded' END::pgfleet.job_status,"
            "        CASE WHEN g % 2 = 1 THEN now() END"
            " FROM generate_series(1, 100000) g"
        )
        # As 0007's enqueue left them: parents marked, children waiting, edges.
        await pool.execute(
            "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, has_children)"
            " SELECT unnest($1::uuid[]), 'step', '{}', 1, true",
            [p1, p2, p3],
        )
        await pool.execute(
            "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, status, waiting_on)"
            " VALUES ($1, 'step', '{}', 1, 'waiting', 2), ($2, 'step', '{}', 1, 'waiting', 1)",
            c1,
            c2,
        )
        await pool.execute(
            "INSERT INTO pgfleet.job_dependencies (child_id, parent_id)"
            " VALUES ($1, $2), ($1, $3), ($4, $5)",
            c1,
            p1,
            p3,
            c2,
            p2,
        )
        await pool.execute(
            "UPDATE pgfleet.jobs SET status = 'succeeded', finished_at = now() WHERE id = $1", p3
        )
        await pool.execute(
            "UPDATE pgfleet.jobs SET status = 'failed', finished_at = now() WHERE id = $1", p2
        )
        row = await pool.fetchrow(
            "SELECT status::text, waiting_on FROM pgfleet.jobs WHERE id = $1", c1
        )
        assert row is not None and (row["status"], row["waiting_on"]) == ("waiting", 1)

        assert (await migrate(pool))[0] == TRIGGERS_VERSION

        marks = await pool.fetch(
            "SELECT id, has_children FROM pgfleet.jobs WHERE id = ANY($1::uuid[])", [p1, p2, p3]
        )
        assert {m["id"]: m["has_children"] for m in marks} == {p1: True, p2: False, p3: False}
        queue = Queue(pool)
        assert await status(queue, c2) is JobStatus.CANCELLED
        assert await status(queue, c1) is JobStatus.WAITING
        await Store(pool).job_complete(id=p1)
        assert await status(queue, c1) is JobStatus.QUEUED
        await pool.execute("DELETE FROM pgfleet.jobs WHERE id = ANY($1::uuid[])", [c1, c2])
        assert await pool.fetchval("SELECT count(*) FROM pgfleet.job_dependencies") == 0
    finally:
        await pool.close()
