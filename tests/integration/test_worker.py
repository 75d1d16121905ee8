"""The worker runtime against a real Postgres, with workers running in this process.

Synchronisation is by runtime events and database state, never by sleeping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import itertools
import logging
import uuid
from typing import Any

import asyncpg
import pytest

import pgfleet
from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    InvalidName,
    InvalidOptions,
    Job,
    JobStatus,
    NotifyMode,
    PermanentError,
    Queue,
    Registry,
    Worker,
    WorkerConfig,
)
from pgfleet.testing import drain, run_job
from tests.apps import runtime_app
from tests.integration.conftest import FAST, Recorder, running_worker


async def executions(pool: asyncpg.Pool, name: str | None = None) -> list[asyncpg.Record]:
    await runtime_app.ensure_schema(pool)
    rows: list[asyncpg.Record] = await pool.fetch(
        "SELECT * FROM public.executions WHERE $1::text IS NULL OR name = $1 ORDER BY seq", name
    )
    return rows


async def status_counts(pool: asyncpg.Pool) -> dict[str, int]:
    rows = await pool.fetch("SELECT status::text, count(*) FROM pgfleet.jobs GROUP BY 1")
    return {r[0]: r[1] for r in rows}


# ------------------------------------------------------------------ running jobs


async def test_drain_runs_every_job_exactly_once(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many([EnqueueRequest("record", {"i": i}) for i in range(300)])
    stats = await drain(pool, runtime_app.registry, concurrency=8)
    assert stats.succeeded == 300 and stats.claimed == 300
    rows = await executions(pool)
    assert sorted(r["job_id"] for r in rows) == sorted(ids)
    assert await status_counts(pool) == {"succeeded": 300}
    job = await queue.get(ids[0])
    assert job is not None and job.attempt == 1 and job.finished_at is not None
    assert job.worker_id is None  # the lock is released


async def test_sync_handlers_run_in_threads(pool: asyncpg.Pool) -> None:
    await Queue(pool).enqueue_many([EnqueueRequest("sync_record", {}) for _ in range(20)])
    stats = await drain(pool, runtime_app.registry, concurrency=4)
    assert stats.succeeded == 20
    assert len(await executions(pool, "sync_record")) == 20


async def test_priority_then_run_at_order(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    order = [5, -1, 3, 0, -1]
    ids = [await queue.enqueue("record", {}, options=EnqueueOptions(priority=p)) for p in order]
    await drain(pool, runtime_app.registry, concurrency=1)
    ran = [r["job_id"] for r in await executions(pool)]
    expected = [ids[1], ids[4], ids[3], ids[2], ids[0]]  # by priority, ties by run_at
    assert ran == expected


async def test_unserved_names_stay_queued(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    served = await queue.enqueue("record", {})
    other = await queue.enqueue("serial", {})  # registered, but not served by this worker
    orphan = await queue.enqueue("no_such_handler", {})
    stats = await drain(pool, runtime_app.registry, job_names={"record"})
    assert stats.succeeded == 1
    for job_id, status in ((served, "succeeded"), (other, "queued"), (orphan, "queued")):
        job = await queue.get(job_id)
        assert (
            job is not None
            and job.status.value == status
            and (job.attempt > 0) == (status == "succeeded")
        )


async def test_future_jobs_are_not_claimed(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    later = await queue.enqueue("record", {}, options=EnqueueOptions(delay=3600))
    stats = await drain(pool, runtime_app.registry)
    assert stats.claimed == 0
    job = await queue.get(later)
    assert job is not None and job.status is JobStatus.QUEUED and job.attempt == 0


async def test_delayed_job_runs_no_earlier_than_run_at(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    rec = Recorder()
    async with running_worker(pool, runtime_app.registry, WorkerConfig(**FAST), rec):
        job_id = await queue.enqueue("record", {}, options=EnqueueOptions(delay=0.6))
        await rec.until(lambda: len(rec.outcomes("succeeded")) == 1)
    job = await queue.get(job_id)
    (row,) = await executions(pool)
    assert job is not None and row["started_at"] >= job.run_at


# ------------------------------------------------------------------ outcomes


async def test_retry_delays_grow_as_configured(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("flaky", {"failures": 3}, options=EnqueueOptions(max_attempts=5))
    config = WorkerConfig(backoff_base=10, backoff_cap=1000, backoff_jitter=0)
    delays = []
    for attempt in (1, 2, 3):
        stats = await drain(pool, runtime_app.registry, config)
        assert stats.retried == 1
        row = await pool.fetchrow(
            "SELECT status::text, attempt, last_error, "
            "extract(epoch FROM run_at - started_at) AS delay FROM pgfleet.jobs WHERE id = $1",
            job_id,
        )
        assert row is not None
        assert row["status"] == "queued" and row["attempt"] == attempt
        assert row["last_error"] == f"RuntimeError: transient failure on attempt {attempt}"
        delays.append(float(row["delay"]))
        await pool.execute("UPDATE pgfleet.jobs SET run_at = now() WHERE id = $1", job_id)
    # Each delay is the configured one (plus the handler's own run time, far below a second).
    for got, want in zip(delays, (10, 20, 40), strict=True):
        assert want <= got < want + 1, delays
    stats = await drain(pool, runtime_app.registry, config)
    assert stats.succeeded == 1
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.attempt == 4


async def test_permanent_error_fails_on_the_first_attempt(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("fail", {}, options=EnqueueOptions(max_attempts=10))
    stats = await drain(pool, runtime_app.registry)
    assert stats.failed == 1
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.FAILED and job.attempt == 1
    assert job.last_error == "PermanentError: this job always fails"
    assert job.finished_at is not None


async def test_last_attempt_fails_with_its_error_kept(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("flaky", {"failures": 9}, options=EnqueueOptions(max_attempts=2))
    await drain(pool, runtime_app.registry)
    await pool.execute("UPDATE pgfleet.jobs SET run_at = now() WHERE id = $1", job_id)
    stats = await drain(pool, runtime_app.registry)
    assert stats.failed == 1
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.FAILED and job.attempt == 2
    assert job.last_error == "RuntimeError: transient failure on attempt 2"


async def test_a_timed_out_handler_counts_as_an_attempt(pool: asyncpg.Pool) -> None:
    registry = Registry()

    @registry.job("hang", timeout=0.05)
    async def hang(job: Job) -> None:
        await asyncio.Event().wait()

    queue = Queue(pool)
    job_id = await queue.enqueue("hang", None, options=EnqueueOptions(max_attempts=3))
    stats = await drain(pool, registry)
    assert stats.retried == 1
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.QUEUED and job.attempt == 1
    assert job.last_error == "TimeoutError: handler ran longer than its timeout of 0.05s"


async def test_default_timeout_applies_to_sync_handlers(pool: asyncpg.Pool) -> None:
    import threading

    release = threading.Event()
    registry = Registry()

    @registry.job("blocking")
    def blocking(job: Job) -> None:
        release.wait(30)

    queue = Queue(pool)
    job_id = await queue.enqueue("blocking", None, options=EnqueueOptions(max_attempts=1))
    try:
        stats = await drain(pool, registry, default_timeout=0.05)
    finally:
        release.set()
    assert stats.failed == 1
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.FAILED
    assert job.last_error is not None and "longer than its timeout of 0.05s" in job.last_error


@dataclasses.dataclass
class Typed:
    n: int


async def test_typed_payloads_are_decoded_and_bad_ones_fail_permanently(
    pool: asyncpg.Pool,
) -> None:
    seen: list[Typed] = []
    registry = Registry()

    @registry.job("typed")
    async def typed(job: Job, payload: Typed) -> None:
        seen.append(payload)

    queue = Queue(pool)
    await queue.enqueue("typed", Typed(n=3))
    bad = await queue.enqueue("typed", {"n": "three"}, options=EnqueueOptions(max_attempts=5))
    stats = await drain(pool, registry)
    assert seen == [Typed(3)]
    assert stats.failed == 1
    job = await queue.get(bad)
    assert job is not None and job.status is JobStatus.FAILED and job.attempt == 1
    assert job.last_error == "PayloadDecodeError: payload.n: expected integer, got str"


async def test_infallible_handlers_are_recorded_as_succeeded(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @registry.job("chore", infallible=True)
    async def chore(job: Job) -> None:
        raise RuntimeError("upstream down")

    job_id = await Queue(pool).enqueue("chore", None)
    stats = await drain(pool, registry)
    assert stats.succeeded == 1
    job = await Queue(pool).get(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert "infallible job chore" in caplog.text and "upstream down" in caplog.text


# ------------------------------------------------------------------ locks


def gated_registry() -> tuple[Registry, dict[int, asyncio.Event]]:
    """A handler whose first attempt blocks until released and then fails."""
    gates: dict[int, asyncio.Event] = {}
    registry = Registry()

    @registry.job("gated")
    async def gated(job: Job) -> None:
        if job.attempt == 1:
            gate = gates.setdefault(1, asyncio.Event())
            await gate.wait()
            raise RuntimeError("late failure of the first attempt")

    return registry, gates


async def test_operator_complete_discards_the_running_handlers_outcome(pool: asyncpg.Pool) -> None:
    registry, gates = gated_registry()
    queue = Queue(pool)
    rec = Recorder()
    async with running_worker(pool, registry, WorkerConfig(**FAST), rec):
        job_id = await queue.enqueue("gated", None)
        await rec.until(lambda: len(rec.started) == 1)
        await queue.complete(job_id)
        gates.setdefault(1, asyncio.Event()).set()
        await rec.until(lambda: len(rec.finished) == 1)
    assert rec.finished[0][1] == "cancelled"
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.last_error is None


async def test_a_rescued_jobs_late_outcome_cannot_overwrite_the_new_one(
    pool: asyncpg.Pool,
) -> None:
    registry, gates = gated_registry()
    queue = Queue(pool)
    first, second = Recorder(), Recorder()
    # The first worker has one slot, held by the gated attempt: only the second
    # worker can pick the job up again.
    async with running_worker(pool, registry, WorkerConfig(concurrency=1, **FAST), first) as (
        w1,
        _,
    ):
        job_id = await queue.enqueue("gated", None)
        await first.until(lambda: len(first.started) == 1)
        # The first worker is declared gone: its job goes back to the queue ...
        assert (await queue.force_unlock_worker(w1.id))["requeued"] == 1
        # ... and another worker runs it to success.
        async with running_worker(pool, registry, WorkerConfig(**FAST), second):
            await second.until(lambda: len(second.outcomes("succeeded")) == 1)
        # Now the first handler fails, late: that outcome must not be written.
        gates[1].set()
        await first.until(lambda: len(first.finished) == 1)
    assert first.finished[0][1] == "cancelled"
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED and job.attempt == 2


async def test_named_queue_jobs_never_overlap_and_run_in_order(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    serial_ids = [
        await queue.enqueue("serial", {"ms": 2}, options=EnqueueOptions(queue_name="tenant:1"))
        for _ in range(30)
    ]
    await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(30)])
    recorders = [Recorder() for _ in range(3)]
    config = WorkerConfig(concurrency=4, **FAST)
    async with (
        running_worker(pool, runtime_app.registry, config, recorders[0]),
        running_worker(pool, runtime_app.registry, config, recorders[1]),
        running_worker(pool, runtime_app.registry, config, recorders[2]),
    ):
        await recorders[0].until(lambda: sum(len(r.outcomes("succeeded")) for r in recorders) == 60)
    rows = await executions(pool, "serial")
    assert [r["job_id"] for r in rows] == serial_ids  # in order
    for before, after in itertools.pairwise(rows):
        assert before["finished_at"] <= after["started_at"]  # never overlapping
    assert len({r["worker_id"] for r in rows}) >= 2  # and really spread over workers


# ------------------------------------------------------------------ shutdown


async def test_shutdown_lets_short_jobs_finish_and_requeues_long_ones(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    rec = Recorder()
    config = WorkerConfig(shutdown_grace_period=0.5, **FAST)
    async with running_worker(pool, runtime_app.registry, config, rec) as (_worker, task):
        short = await queue.enqueue("long", {"s": 0.05})
        long = await queue.enqueue("long", {"s": 120}, options=EnqueueOptions(max_attempts=1))
        await rec.until(lambda: len(rec.started) == 2)
    stats = task.result()
    assert (stats.succeeded, stats.aborted) == (1, 1)
    short_job, long_job = await queue.get(short), await queue.get(long)
    assert short_job is not None and short_job.status is JobStatus.SUCCEEDED
    # Aborted at shutdown: back in the queue, the interrupted attempt not counted, so
    # even a single-attempt job runs again.
    assert long_job is not None and long_job.status is JobStatus.QUEUED
    assert long_job.attempt == 0 and long_job.worker_id is None
    # ... and keeps its place in line: its run_at is the one it was enqueued with.
    enqueued_run_at = await pool.fetchval("SELECT created_at FROM pgfleet.jobs WHERE id = $1", long)
    assert long_job.run_at == enqueued_run_at
    assert (await status_counts(pool)).get("running", 0) == 0
    assert await queue.workers() == []  # deregistered


async def test_shutdown_aware_handlers_wind_down(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    rec = Recorder()
    config = WorkerConfig(shutdown_grace_period=30, **FAST)
    async with running_worker(pool, runtime_app.registry, config, rec):
        job_id = await queue.enqueue("long", {"s": 120, "polite": True})
        await rec.until(lambda: len(rec.started) == 1)
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.SUCCEEDED
    assert rec.finished[0][1] == "succeeded"


async def test_shutdown_helpers_inside_and_outside_jobs(pool: asyncpg.Pool) -> None:
    assert pgfleet.is_shutting_down() is False
    assert pgfleet.worker_started_at() is None
    assert pgfleet.current_job() is None
    seen: dict[str, Any] = {}
    registry = Registry()

    @registry.job("look")
    async def look(job: Job) -> None:
        seen["shutting"] = pgfleet.is_shutting_down()
        seen["started"] = pgfleet.worker_started_at()
        seen["job"] = pgfleet.current_job()

    @registry.job("look_sync")
    def look_sync(job: Job) -> None:
        seen["sync_shutting"] = pgfleet.is_shutting_down()
        seen["sync_job"] = pgfleet.current_job()

    queue = Queue(pool)
    job_id = await queue.enqueue("look", None)
    await queue.enqueue("look_sync", None)
    await drain(pool, registry)
    assert seen["shutting"] is False and seen["sync_shutting"] is False
    assert isinstance(seen["started"], dt.datetime)
    assert seen["job"].id == job_id and seen["sync_job"].name == "look_sync"


# ------------------------------------------------------------------ wakeups


async def test_polling_alone_runs_jobs(pool: asyncpg.Pool) -> None:
    queue = Queue(pool, notify=NotifyMode.OFF)
    rec = Recorder()
    config = WorkerConfig(listen=False, **FAST)
    async with running_worker(pool, runtime_app.registry, config, rec):
        # Once the loop has found the queue empty and polled, it is idle ...
        await rec.until(lambda: "poll" in rec.wakeups)
        await queue.enqueue("record", {})
        # ... and with no listener and no notification, only a poll can find the job.
        await rec.until(lambda: len(rec.outcomes("succeeded")) == 1)
    assert "notify" not in rec.wakeups


async def test_listener_comes_back_after_its_backend_is_terminated(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    rec = Recorder()
    # Polling is effectively off: within this test only a notification can wake the loop.
    config = WorkerConfig(poll_interval=3600, heartbeat_interval=0.5, dead_worker_timeout=2.0)
    async with running_worker(pool, runtime_app.registry, config, rec) as (worker, _):
        await worker.wait_started()
        listener = worker.listener
        assert listener is not None
        await asyncio.wait_for(listener.connected.wait(), 30)
        reconnected = asyncio.Event()
        listener.on_connect.append(lambda n: reconnected.set())
        victim = listener.backend_pid
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", victim)
        await asyncio.wait_for(reconnected.wait(), 30)
        assert listener.backend_pid != victim
        await queue.enqueue("record", {})
        await rec.until(lambda: len(rec.outcomes("succeeded")) == 1)
    assert "reconnect" in rec.wakeups
    assert rec.wakeups[-1] in ("notify", "completion")
    assert "notify" in rec.wakeups


async def test_terminating_connections_mid_run_loses_nothing(
    pool: asyncpg.Pool, database: str
) -> None:
    queue = Queue(pool)
    ids = await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(1500)])
    db_name = database.rsplit("/", 1)[1]
    recs = [Recorder(), Recorder()]
    config = WorkerConfig(concurrency=8, backoff_base=0.01, backoff_jitter=0, **FAST)
    chaos_rounds = 0

    async def chaos() -> None:
        nonlocal chaos_rounds
        async with pool.acquire() as admin:
            me = admin.get_server_pid()
            while True:
                await admin.fetch(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = $1 AND pid <> $2 AND backend_type = 'client backend'",
                    db_name,
                    me,
                )
                chaos_rounds += 1
                await asyncio.sleep(0.15)  # chaos pacing, not synchronisation

    # The workers get their own pool: the chaos terminates every other connection.
    workers_pool = await pgfleet.create_pool(database, min_size=0, max_size=30)
    try:
        async with (
            running_worker(workers_pool, runtime_app.registry, config, recs[0]) as (w1, _),
            running_worker(workers_pool, runtime_app.registry, config, recs[1]) as (w2, _),
        ):
            await w1.wait_started()
            await w2.wait_started()
            killer = asyncio.create_task(chaos())
            try:
                await recs[0].until(
                    lambda: len({j.id for r in recs for j in r.outcomes("succeeded")}) >= 1500,
                    timeout=110,
                )
            finally:
                killer.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await killer
    finally:
        await workers_pool.close()
    assert chaos_rounds >= 3
    rows = await pool.fetch("SELECT id, status::text AS status FROM pgfleet.jobs")
    assert {r["id"] for r in rows} == set(ids)
    assert {r["status"] for r in rows} == {"succeeded"}
    ran = {r["job_id"] for r in await executions(pool)}
    assert ran == set(ids)  # every job ran (at least once: delivery is at-least-once)


# ------------------------------------------------------------------ logging, helpers, config


async def test_log_records_inside_handlers_carry_the_job(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @registry.job("chatty")
    async def chatty(job: Job, payload: dict[str, str]) -> None:
        logging.getLogger("app").warning("working")

    caplog.set_level(logging.INFO)
    job_id = await Queue(pool).enqueue("chatty", {"secret": "hunter2"})
    await drain(pool, registry)
    (record,) = [r for r in caplog.records if r.name == "app"]
    assert record.pgfleet_job_name == "chatty"  # type: ignore[attr-defined]
    assert record.pgfleet_job_id == str(job_id)  # type: ignore[attr-defined]
    assert record.pgfleet_job_attempt == 1  # type: ignore[attr-defined]
    messages = [r.getMessage() for r in caplog.records if r.name == "pgfleet"]
    assert any(m.startswith("job started: chatty") for m in messages)
    assert any(m.startswith("job succeeded: chatty") and " ms" in m for m in messages)
    assert "hunter2" not in caplog.text  # payloads are never logged


async def test_run_job_calls_a_handler_directly() -> None:
    registry = Registry()

    @registry.job("double")
    async def double(job: Job, payload: Typed) -> int:
        return payload.n * 2

    @registry.job("sync_double")
    def sync_double(job: Job, payload: Typed) -> int:
        return payload.n * 2

    assert await run_job(registry, "double", Typed(4)) == 8
    assert await run_job(registry, "sync_double", {"n": 5}) == 10
    with pytest.raises(pgfleet.PayloadDecodeError):
        await run_job(registry, "double", {"n": "x"})
    with pytest.raises(pgfleet.UnknownJobName):
        await run_job(registry, "nope")


def test_registry_refuses_bad_handlers() -> None:
    registry = Registry()

    @registry.job("ok")
    async def ok(job: Job) -> None: ...

    with pytest.raises(InvalidName, match="already registered"):
        registry.register("ok", ok)
    with pytest.raises(InvalidName, match="invalid job name"):
        registry.register("bad name", ok)
    with pytest.raises(InvalidOptions, match=r"must take \(job\) or \(job, payload\)"):
        registry.register("three", lambda a, b, c: None)
    with pytest.raises(InvalidOptions, match="timeout for 't' must be a positive number"):
        registry.register("t", ok, timeout=0)
    with pytest.raises(InvalidOptions, match="must be callable"):
        registry.register("c", "not callable")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"concurrency": 0}, "concurrency must be an integer from 1 to 10000"),
        ({"poll_interval": 0}, "poll_interval must be positive"),
        ({"poll_interval": "2"}, "poll_interval must be a number of seconds"),
        ({"heartbeat_interval": 10, "dead_worker_timeout": 15}, "at least twice"),
        ({"backoff_jitter": 2}, "backoff_jitter must be between 0 and 1"),
        ({"backoff_base": 10, "backoff_cap": 1}, "backoff_cap must be at least backoff_base"),
        ({"job_names": "record"}, "job_names must be a collection"),
        ({"queue_names": ["bad name"]}, "invalid queue name"),
        ({"finished_job_retention": -1}, "finished_job_retention must be positive"),
        ({"prefetch": -1}, "prefetch must be an integer from 0 to 100000"),
        ({"prefetch": 1.5}, "prefetch must be an integer"),
        ({"prefetch_window": 0}, "prefetch_window must be positive"),
    ],
)
def test_worker_config_refuses_bad_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(pgfleet.ValidationError, match=message):
        WorkerConfig(**kwargs)


def test_worker_config_accepts_timedeltas() -> None:
    config = WorkerConfig(poll_interval=dt.timedelta(milliseconds=500), finished_job_retention=None)
    assert config.poll_interval == 0.5 and config.finished_job_retention is None


async def test_worker_refuses_job_names_without_handlers(pool: asyncpg.Pool) -> None:
    with pytest.raises(InvalidOptions, match=r"job_names \['ghost'\] have no handler"):
        Worker(pool, runtime_app.registry, WorkerConfig(job_names={"ghost"}))


async def test_worker_refuses_an_unmigrated_database(pool: asyncpg.Pool) -> None:
    await pool.execute("DROP SCHEMA pgfleet CASCADE")
    with pytest.raises(pgfleet.SchemaNotReady, match="run pgfleet.migrate"):
        await Worker(pool, runtime_app.registry).run(burst=True)


async def test_stats_by_name(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.enqueue("record", {})
    await queue.enqueue("fail", {})
    stats = await drain(pool, runtime_app.registry)
    assert stats.by_name == {"record": {"succeeded": 1}, "fail": {"failed": 1}}


async def test_permanent_error_is_exported() -> None:
    assert issubclass(pgfleet.PayloadDecodeError, PermanentError)
    assert uuid.UUID(int=0).version is None
