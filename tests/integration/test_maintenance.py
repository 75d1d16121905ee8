"""Leader-only maintenance (pruning, vacuum, rescue) and per-job tracing."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, Job, Queue, Registry, Worker, WorkerConfig
from pgfleet._runtime.maintenance import AUTOVACUUM_BEHIND
from pgfleet.testing import drain
from tests.apps import runtime_app
from tests.helpers import put_in_state, register_worker
from tests.integration.conftest import FAST, Recorder, running_worker
from tools.devkit import until


async def test_the_leader_prunes_old_finished_jobs_in_batches(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    old = await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(25)])
    fresh = await queue.enqueue("record", {})
    running = await queue.enqueue("record", {})
    for job_id in old:
        await put_in_state(pool, job_id, "succeeded", finished_ago_s=7200)
    await put_in_state(pool, fresh, "failed", finished_ago_s=10)
    await put_in_state(pool, running, "running")
    worker = Worker(
        pool,
        runtime_app.registry,
        WorkerConfig(finished_job_retention=3600, prune_batch_size=10, **FAST),
    )
    await worker.heartbeat.run_once()  # registers and, alone, takes the leadership
    assert worker.is_leader
    assert await prune(worker) == 25
    left = {r["id"] for r in await pool.fetch("SELECT id FROM pgfleet.jobs")}
    assert left == {fresh, running}
    await worker.heartbeat.deregister()


async def prune(worker: Worker) -> int:
    assert worker.pruner is not None  # retention is set
    return await worker.pruner.prune()


async def test_only_one_worker_leads(pool: asyncpg.Pool) -> None:
    workers = [Worker(pool, runtime_app.registry, WorkerConfig(**FAST)) for _ in range(3)]
    for w in workers:
        await w.heartbeat.run_once()
    assert [w.is_leader for w in workers] == [True, False, False]
    # A follower does nothing in maintenance, even if asked.
    follower = workers[1]
    for chore in (follower.rescuer, follower.pruner, follower.vacuumer):
        assert chore is not None
        await chore.run_once()
    assert follower.rescuer.rescued == 0
    # The leader resigns when it deregisters; the next heartbeat elects another.
    await workers[0].heartbeat.deregister()
    await workers[1].heartbeat.run_once()
    assert workers[1].is_leader
    for w in workers[1:]:
        await w.heartbeat.deregister()


async def test_rescue_requeues_or_buries_jobs_of_expired_workers(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    dead_worker = uuid.uuid4()
    await register_worker(pool, dead_worker, alive=False)
    again = await queue.enqueue("record", {})
    buried = await queue.enqueue("record", {}, options=EnqueueOptions(max_attempts=1))
    await put_in_state(pool, again, "running", worker_id=dead_worker, attempt=1)
    await put_in_state(pool, buried, "running", worker_id=dead_worker, attempt=1)
    rec = Recorder()
    leader = Worker(pool, runtime_app.registry, WorkerConfig(**FAST), events=rec)
    await leader.heartbeat.run_once()
    assert await leader.rescuer.rescue() == 2
    a, b = await queue.get(again), await queue.get(buried)
    assert a is not None and a.status.value == "queued" and a.attempt == 1
    assert a.last_error is not None and "stopped heartbeating during attempt 1" in a.last_error
    assert b is not None and b.status.value == "failed"
    assert rec.rescued == 2
    assert [w.id for w in await queue.workers()] == [leader.id]  # the dead one is gone
    await leader.heartbeat.deregister()


async def drain_on_own_pool(dsn: str, registry: Registry) -> None:
    """``drain`` on connections that close afterwards (their backends report their
    statistics as they exit)."""
    own = await asyncpg.create_pool(dsn, min_size=1, max_size=5)
    try:
        await drain(own, registry)
    finally:
        await own.close()


async def dead_tuples_reported(pool: asyncpg.Pool, at_least: int) -> None:
    """Wait until the statistics show the drain's dead tuples, which the vacuumer
    decides from. A backend reports its counts when it exits, or when idle at most
    once a second and up to 10 s later on a busy server: the drains below run on a
    pool of their own, closed before this wait, so it is short."""

    async def reported() -> bool:
        dead = await pool.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgfleet.jobs'::regclass"
        )
        return bool(dead is not None and dead >= at_least)

    await until(reported, timeout=30, what=f"{at_least} dead tuples in pg_stat_user_tables")


@pytest.mark.parametrize("mode", ["always", "never"])
async def test_the_leader_vacuums_the_jobs_table(
    pool: asyncpg.Pool, database: str, mode: str
) -> None:
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(300)])
    await drain_on_own_pool(database, runtime_app.registry)
    await dead_tuples_reported(pool, 300)
    worker = Worker(
        pool,
        runtime_app.registry,
        WorkerConfig(vacuum=mode, vacuum_min_dead_tuples=0, **FAST),
    )
    await worker.heartbeat.run_once()
    before = await pool.fetchval(
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'pgfleet.jobs'::regclass"
    )
    await worker.vacuumer.run_once()
    after = await pool.fetchval(
        "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'pgfleet.jobs'::regclass"
    )
    assert worker.vacuumer.vacuums == (1 if mode == "always" else 0)
    assert after - before == worker.vacuumer.vacuums
    await worker.heartbeat.deregister()


async def dead_tuples(pool: asyncpg.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgfleet.jobs'::regclass"
        )
    )


async def vacuum_count(pool: asyncpg.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = 'pgfleet.jobs'::regclass"
        )
    )


async def test_vacuum_auto_leaves_tables_that_autovacuum_covers_until_it_falls_behind(
    pool: asyncpg.Pool, database: str
) -> None:
    await pool.execute("ALTER TABLE pgfleet.jobs SET (autovacuum_enabled = true)")
    autovacuum_on = await pool.fetchval("SELECT current_setting('autovacuum')::boolean")
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(300)])
    await drain_on_own_pool(database, runtime_app.registry)
    await dead_tuples_reported(pool, 300)
    # Past the leader's own threshold, short of the one for a table autovacuum covers.
    threshold = await dead_tuples(pool) // 2
    worker = Worker(
        pool, runtime_app.registry, WorkerConfig(vacuum_min_dead_tuples=threshold, **FAST)
    )
    await worker.heartbeat.run_once()
    vacuumed = await worker.vacuumer.vacuum_if_needed()
    # Vacuumed exactly when the server's autovacuum is off (as on this test machine).
    assert vacuumed is (not autovacuum_on)
    # Autovacuum is behind once the dead tuples reach AUTOVACUUM_BEHIND times it.
    assert worker.vacuumer.threshold(0, autovacuum=True) == AUTOVACUUM_BEHIND * threshold
    assert worker.vacuumer.threshold(0, autovacuum=False) == threshold
    assert worker.vacuumer.threshold(threshold * 10, autovacuum=False) == threshold * 2
    await worker.heartbeat.deregister()


async def test_the_vacuumer_waits_for_its_threshold_of_dead_tuples(
    pool: asyncpg.Pool, database: str
) -> None:
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(300)])
    await drain_on_own_pool(database, runtime_app.registry)
    await dead_tuples_reported(pool, 300)
    dead = await dead_tuples(pool)
    below = Worker(
        pool, runtime_app.registry, WorkerConfig(vacuum_min_dead_tuples=dead + 1, **FAST)
    )
    at = Worker(pool, runtime_app.registry, WorkerConfig(vacuum_min_dead_tuples=dead, **FAST))
    before = await vacuum_count(pool)
    assert not await below.vacuumer.vacuum_if_needed()
    assert await vacuum_count(pool) == before
    assert await at.vacuumer.vacuum_if_needed()
    assert await vacuum_count(pool) == before + 1
    assert at.vacuumer.last_dead_tuples == dead


async def analyze_count(pool: asyncpg.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relid = 'pgfleet.jobs'::regclass"
        )
    )


async def test_the_vacuumer_analyzes_a_table_that_outgrew_its_statistics(
    pool: asyncpg.Pool,
) -> None:
    """A backlog on a table analyzed while empty (a fresh install, a truncate) is
    claimed with plans made for the empty table until new statistics replan them:
    the Vacuumer analyzes once the live rows pass twice the analyzed ones, without
    dead tuples to vacuum."""
    await pool.execute("ANALYZE pgfleet.jobs")
    assert (
        await pool.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'pgfleet.jobs'::regclass")
        <= 0
    )
    await Queue(pool).enqueue_many([EnqueueRequest("record", {}) for _ in range(400)])

    async def live_reported() -> bool:
        live = await pool.fetchval(
            "SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = 'pgfleet.jobs'::regclass"
        )
        return bool(live is not None and live >= 400)

    await until(live_reported, timeout=30, what="400 live tuples in pg_stat_user_tables")
    never = Worker(
        pool,
        runtime_app.registry,
        WorkerConfig(vacuum="never", vacuum_min_dead_tuples=300, **FAST),
    )
    worker = Worker(pool, runtime_app.registry, WorkerConfig(vacuum_min_dead_tuples=300, **FAST))
    before, vacuums = await analyze_count(pool), await vacuum_count(pool)
    assert not await never.vacuumer.vacuum_if_needed()
    assert await analyze_count(pool) == before
    # No dead tuples: no vacuum, but the statistics are renewed.
    assert not await worker.vacuumer.vacuum_if_needed()
    assert worker.vacuumer.analyzes == 1
    assert await analyze_count(pool) == before + 1
    assert await vacuum_count(pool) == vacuums
    assert (
        await pool.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'pgfleet.jobs'::regclass")
        == 400
    )
    # Statistics taken on 400 rows: the next analyze waits for 800.
    assert not await worker.vacuumer.vacuum_if_needed()
    assert worker.vacuumer.analyzes == 1
    assert worker.vacuumer.outgrew_statistics(800, 400)
    assert not worker.vacuumer.outgrew_statistics(799, 400)
    assert not worker.vacuumer.outgrew_statistics(299, 0)  # below vacuum_min_dead_tuples


async def test_the_historian_vacuums_between_its_batches(pool: asyncpg.Pool, database: str) -> None:
    """A round of the Historian that moves many batches leaves as many dead tuples:
    the table is vacuumed as they pass the threshold, not after the round (nor on
    the Vacuumer's period)."""
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(300)])
    await drain_on_own_pool(database, runtime_app.registry)
    await dead_tuples_reported(pool, 300)
    worker = Worker(
        pool,
        runtime_app.registry,
        WorkerConfig(
            history_move_after=0.001,
            prune_batch_size=100,
            vacuum_min_dead_tuples=await dead_tuples(pool),
            **FAST,
        ),
    )
    await worker.heartbeat.run_once()
    assert worker.is_leader and worker.historian is not None
    before = await vacuum_count(pool)
    await worker.historian.run_once()  # prepares, moves three batches of 100, drops
    assert worker.historian.moved == 300
    assert worker.vacuumer.vacuums >= 1
    assert await vacuum_count(pool) - before == worker.vacuumer.vacuums
    await worker.heartbeat.deregister()


async def test_the_leaders_vacuum_keeps_the_claim_tables_pages(pool: asyncpg.Pool) -> None:
    """Empty pages at the table's end stay the table's (0011, TRUNCATE false): giving
    them back takes an ACCESS EXCLUSIVE lock that claims queue behind, and a busy
    queue refills them within seconds."""
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("record", {"i": i}) for i in range(2000)])
    size = await pool.fetchval("SELECT pg_relation_size('pgfleet.jobs')")
    await pool.execute("DELETE FROM pgfleet.jobs")
    await dead_tuples_reported(pool, 2000)
    worker = Worker(
        pool,
        runtime_app.registry,
        WorkerConfig(vacuum="always", vacuum_min_dead_tuples=0, **FAST),
    )
    assert await worker.vacuumer.vacuum_if_needed()
    assert await pool.fetchval("SELECT pg_relation_size('pgfleet.jobs')") == size > 0
    # Space reused: as many jobs again take no new page.
    await queue.enqueue_many([EnqueueRequest("record", {"i": i}) for i in range(2000)])
    assert await pool.fetchval("SELECT pg_relation_size('pgfleet.jobs')") == size


def test_bad_vacuum_settings() -> None:
    from pgfleet import InvalidOptions

    with pytest.raises(InvalidOptions, match="vacuum must be 'auto', 'always' or 'never'"):
        WorkerConfig(vacuum="sometimes")
    with pytest.raises(InvalidOptions, match="vacuum_min_dead_tuples"):
        WorkerConfig(vacuum_min_dead_tuples=-1)


async def test_each_job_runs_in_a_span_without_its_payload(pool: asyncpg.Pool) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = Registry()
    inside: list[object] = []

    @registry.job("traced")
    async def traced(job: Job, payload: dict[str, str]) -> None:
        inside.append(trace.get_current_span().get_span_context().span_id)

    from pgfleet._runtime import tracing

    original = tracing._tracer
    tracing._tracer = lambda: provider.get_tracer("pgfleet")
    try:
        job_id = await Queue(pool).enqueue("traced", {"secret": "hunter2"})
        await drain(pool, registry)
    finally:
        tracing._tracer = original
    enqueued, span = exporter.get_finished_spans()
    assert enqueued.name == "pgfleet.enqueue traced"
    assert span.name == "pgfleet.job traced"
    # The job's span continues the enqueue's trace (see pgfleet/_runtime/tracing.py).
    assert span.parent is not None and span.parent.span_id == enqueued.context.span_id
    assert span.context.trace_id == enqueued.context.trace_id
    assert span.attributes is not None
    assert span.attributes["pgfleet.job.id"] == str(job_id)
    assert span.attributes["pgfleet.job.attempt"] == 1
    assert "hunter2" not in repr(dict(span.attributes))
    assert inside == [span.context.span_id]  # the handler ran inside the span


async def test_a_worker_running_as_leader_rescues_in_the_background(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    dead_worker = uuid.uuid4()
    await register_worker(pool, dead_worker, alive=False)
    job_id = await queue.enqueue("record", {})
    await put_in_state(pool, job_id, "running", worker_id=dead_worker, attempt=1)
    rec = Recorder()
    async with running_worker(pool, runtime_app.registry, WorkerConfig(**FAST), rec):
        await rec.until(lambda: len(rec.outcomes("succeeded")) == 1)
    job = await queue.get(job_id)
    assert job is not None and job.status.value == "succeeded" and job.attempt == 2
    assert rec.rescued == 1
