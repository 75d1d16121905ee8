"""Job control against a real Postgres, with workers running in this process:
error history, results and waiting for them, snoozes, retry policies per handler,
cancelling running jobs, and scheduled jobs starting on time."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import statistics
import threading
import uuid
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

import pgfleet
from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    InvalidJobState,
    Job,
    JobNotFound,
    JobStatus,
    PermanentError,
    Queue,
    Registry,
    RetryPolicy,
    Snooze,
    Worker,
    WorkerConfig,
)
from pgfleet._runtime.waiting import waiting_now
from pgfleet.db.store import Store
from pgfleet.service.metrics import ProcessMetrics, render
from tests.helpers import put_in_state, register_worker
from tests.integration.conftest import FAST, Recorder, running_worker

#: Retries come back at once: the tests wait on outcomes, not on backoff.
QUICK = WorkerConfig(backoff_base=0.001, backoff_cap=0.001, backoff_jitter=0, **FAST)


def failing_registry() -> Registry:
    registry = Registry()

    @registry.job("always_fails")
    async def always_fails(job: Job) -> None:
        raise RuntimeError(f"attempt {job.attempt} went wrong")

    return registry


# ------------------------------------------------------------------ error history


async def test_every_failed_attempts_error_is_kept_with_its_time_and_worker(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    async with running_worker(pool, failing_registry(), QUICK) as (worker, _):
        job_id = await queue.enqueue("always_fails", None, options=EnqueueOptions(max_attempts=3))
        job = await queue.wait(job_id, timeout=30)
    assert job.status is JobStatus.FAILED and job.attempt == 3
    assert [e.attempt for e in job.errors] == [1, 2, 3]
    assert [e.error for e in job.errors] == [
        f"RuntimeError: attempt {n} went wrong" for n in (1, 2, 3)
    ]
    assert all(e.worker_id == worker.id for e in job.errors)
    assert job.finished_at is not None
    assert job.errors[0].at <= job.errors[1].at <= job.errors[2].at <= job.finished_at
    assert job.errors_omitted == 0 and job.last_error == job.errors[-1].error


async def test_the_error_history_keeps_the_last_ten_and_counts_the_rest(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    async with running_worker(pool, failing_registry(), QUICK):
        job_id = await queue.enqueue("always_fails", None, options=EnqueueOptions(max_attempts=13))
        job = await queue.wait(job_id, timeout=30)
    assert [e.attempt for e in job.errors] == list(range(4, 14))
    assert job.errors_omitted == 3


# ------------------------------------------------------------------ results


def result_registry() -> Registry:
    registry = Registry()

    @registry.job("report")
    async def report(job: Job, payload: dict[str, Any]) -> dict[str, Any]:
        return {"rows": payload["n"], "title": "ok"}

    @registry.job("sync_report")
    def sync_report(job: Job) -> list[int]:
        return [1, 2, 3]

    @registry.job("huge")
    async def huge(job: Job) -> str:
        return "x" * (300 * 1024)

    @registry.job("opaque")
    async def opaque(job: Job) -> object:
        return object()

    return registry


async def test_a_handlers_return_value_round_trips_through_wait(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    async with running_worker(pool, result_registry(), QUICK):
        a = await queue.enqueue("report", {"n": 7})
        b = await queue.enqueue("sync_report", None)
        first, second = await asyncio.gather(queue.wait(a, timeout=30), queue.wait(b, timeout=30))
    assert first.status is JobStatus.SUCCEEDED and first.result == {"rows": 7, "title": "ok"}
    assert second.result == [1, 2, 3]
    stored = await queue.get(a)
    assert stored is not None and stored.result == first.result


async def test_a_result_is_stored_as_json_and_one_written_before_0013_still_reads(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    async with running_worker(pool, result_registry(), QUICK):
        job_id = await queue.enqueue("report", {"n": 2})
        await queue.wait(job_id, timeout=30)
    row = await pool.fetchrow(
        "SELECT result, result_json::text AS stored FROM pgfleet.jobs WHERE id = $1", job_id
    )
    assert row is not None and row["result"] is None
    assert row["stored"] == '{"rows":2,"title":"ok"}'
    # A worker of the previous version wrote the jsonb column.
    await pool.execute(
        """UPDATE pgfleet.jobs SET result = '{"old": true}', result_json = NULL WHERE id = $1""",
        job_id,
    )
    job = await queue.get(job_id)
    assert job is not None and job.result == {"old": True}


async def test_an_oversized_or_unencodable_result_fails_the_job_for_good_saying_why(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    async with running_worker(pool, result_registry(), QUICK):
        big = await queue.enqueue("huge", None)
        odd = await queue.enqueue("opaque", None)
        too_big, unencodable = await asyncio.gather(
            queue.wait(big, timeout=30), queue.wait(odd, timeout=30)
        )
    for job, reason in ((too_big, "over the limit of 262144 bytes"), (unencodable, "JSON")):
        assert job.status is JobStatus.FAILED and job.attempt == 1 and job.result is None
        assert job.last_error is not None
        assert f"handler {job.name!r}" in job.last_error and reason in job.last_error


# ------------------------------------------------------------------ waiting


async def test_waiting_for_a_missing_job_raises_and_a_slow_one_times_out(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    with pytest.raises(JobNotFound):
        await queue.wait(uuid.uuid4(), timeout=10)
    job_id = await queue.enqueue("nobody_serves_this", None)
    with pytest.raises(TimeoutError):
        await queue.wait(job_id, timeout=0.2)


async def test_a_waiter_returns_by_polling_when_no_notification_comes(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("nobody_serves_this", None)
    waiter = asyncio.ensure_future(queue.wait(job_id, timeout=30))
    await asyncio.sleep(0)
    assert queue.waiters is not None
    queue.waiters.poll_interval = 0.1
    # Once the waiter has registered and found it unfinished, the job is finished
    # behind pgfleet's back: no statement of it notifies.
    while queue.waiters.rounds < 1:
        await asyncio.sleep(0.01)
    assert await pool.fetchval("SELECT awaited FROM pgfleet.jobs WHERE id = $1", job_id)
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'succeeded', finished_at = now() WHERE id = $1", job_id
    )
    job = await waiter
    assert job.status is JobStatus.SUCCEEDED and queue.waiters.polls >= 1


async def test_marking_jobs_waited_for_skips_a_locked_row_instead_of_deadlocking(
    pool: asyncpg.Pool,
) -> None:
    """A claim round holds a job's row and then updates another (its held jobs
    marked started): a mark of both that waited for the first while holding the
    second would deadlock with it. The mark skips the locked row and says so."""
    queue = Queue(pool)
    first, second = sorted(await queue.enqueue_many([EnqueueRequest("nobody", None)] * 2))
    async with pool.acquire() as round_conn:
        round_tx = round_conn.transaction()
        await round_tx.start()
        await round_conn.execute("SELECT 1 FROM pgfleet.jobs WHERE id = $1 FOR UPDATE", second)
        skipped = await asyncio.wait_for(Store(pool).job_await(ids=[first, second]), 30)
        assert skipped == [second]
        # The round goes on to a row the mark took: nothing stands in its way.
        await asyncio.wait_for(
            round_conn.execute("UPDATE pgfleet.jobs SET priority = 1 WHERE id = $1", first), 30
        )
        await round_tx.commit()
    marked = await pool.fetch(
        "SELECT id, awaited FROM pgfleet.jobs WHERE id = ANY($1::uuid[]) ORDER BY id",
        [first, second],
    )
    assert [(r["id"], r["awaited"]) for r in marked] == [(first, True), (second, None)]
    assert await Store(pool).job_await(ids=[first, second]) == []


async def test_a_waiter_marks_a_job_found_locked_again_and_is_told_of_its_end(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    registry = Registry()

    @registry.job("echo")
    async def echo(job: Job, payload: int) -> int:
        return payload

    job_id = await queue.enqueue("echo", 7)
    async with pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        await holder.execute("SELECT 1 FROM pgfleet.jobs WHERE id = $1 FOR UPDATE", job_id)
        waiter = asyncio.ensure_future(queue.wait(job_id, timeout=120))
        await asyncio.sleep(0)
        waiters = queue.waiters
        assert waiters is not None
        # No poll in this test: only the mark made again tells the waiter.
        waiters.poll_interval = 600
        while waiters.remarks < 2:
            await asyncio.sleep(0.01)
        assert not await pool.fetchval("SELECT awaited FROM pgfleet.jobs WHERE id = $1", job_id)
        await tx.commit()
    while not await pool.fetchval("SELECT awaited FROM pgfleet.jobs WHERE id = $1", job_id):
        await asyncio.sleep(0.01)
    async with running_worker(pool, registry, WorkerConfig(concurrency=2, **FAST)):
        job = await waiter
    assert job.result == 7 and waiters.polls == 0


async def test_five_thousand_waiters_share_one_listening_connection(
    pool: asyncpg.Pool, database: str
) -> None:
    queue = Queue(pool)
    registry = Registry()

    @registry.job("echo")
    async def echo(job: Job, payload: int) -> int:
        return payload

    ids = await queue.enqueue_many([EnqueueRequest("echo", i) for i in range(5000)])
    waiters = [asyncio.ensure_future(queue.wait(i, timeout=120)) for i in ids]
    await asyncio.sleep(0)
    assert queue.waiters is not None
    listener = None
    while listener is None or not listener.connected.is_set():
        await asyncio.sleep(0.01)
        listener = queue.waiters.listener
    listening = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'LISTEN \"pgfleet_done\"%'"
    )
    assert listening == 1
    async with running_worker(pool, registry, WorkerConfig(concurrency=32, **FAST)):
        jobs = await asyncio.gather(*waiters)
    assert [j.result for j in jobs] == list(range(5000))
    assert listener.connections == 1


LISTENING_FOR_DONE = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND query LIKE 'LISTEN \"pgfleet_done\"%'"
)


async def test_queues_on_one_pool_share_one_listener_and_one_closing_leaves_the_rest(
    pool: asyncpg.Pool,
) -> None:
    queues = [Queue(pool) for _ in range(3)]
    registry = Registry()

    @registry.job("echo")
    async def echo(job: Job, payload: int) -> int:
        return payload

    prom = CollectorRegistry()
    ProcessMetrics(prom, worker=False)
    ids = await queues[0].enqueue_many([EnqueueRequest("echo", i) for i in range(3000)])
    waits = [
        [asyncio.ensure_future(q.wait(i, timeout=120)) for i in ids[n * 1000 : (n + 1) * 1000]]
        for n, q in enumerate(queues)
    ]
    await asyncio.sleep(0)
    hub = queues[0].waiters
    assert hub is not None and all(q.waiters is hub for q in queues)
    while hub.listener is None or not hub.listener.connected.is_set():
        await asyncio.sleep(0.01)
    listener = hub.listener
    assert await pool.fetchval(LISTENING_FOR_DONE) == 1
    assert waiting_now() == 3000
    assert "pgfleet_job_waiters 3000.0" in render(prom).decode()
    # The first queue goes away: its callers give up, the queue is dropped.
    for w in waits[0]:
        w.cancel()
    await asyncio.gather(*waits[0], return_exceptions=True)
    del queues[0]
    gc.collect()
    assert waiting_now() == 2000 and queues[0].waiters is hub
    async with running_worker(pool, registry, WorkerConfig(concurrency=32, **FAST)):
        jobs = await asyncio.gather(*waits[1], *waits[2])
    assert [j.result for j in jobs] == list(range(1000, 3000))
    assert listener.connections == 1 and waiting_now() == 0
    assert "pgfleet_job_waiters 0.0" in render(prom).decode()
    # With the last waiter gone the listener's connection goes back to the pool.
    while await pool.fetchval(LISTENING_FOR_DONE) != 0 or queues[0].waiters is not None:
        await asyncio.sleep(0.05)


async def test_queues_on_different_pools_listen_apart(pool: asyncpg.Pool, database: str) -> None:
    other = await asyncpg.create_pool(database, min_size=1, max_size=2)
    try:
        a, b = Queue(pool), Queue(other)
        job_id = await a.enqueue("nobody_serves_this", None)
        waits = [asyncio.ensure_future(q.wait(job_id, timeout=30)) for q in (a, b)]
        await asyncio.sleep(0)
        assert a.waiters is not None and b.waiters is not None and a.waiters is not b.waiters
        while await pool.fetchval(LISTENING_FOR_DONE) != 2:
            await asyncio.sleep(0.02)
        await a.complete(job_id)
        done = await asyncio.gather(*waits)
        assert [j.status for j in done] == [JobStatus.SUCCEEDED] * 2
    finally:
        await other.close()


# ------------------------------------------------------------------ snooze


def snoozing_registry(times: int, policy: RetryPolicy | None = None) -> Registry:
    registry = Registry()

    @registry.job("snoozer", retry=policy)
    async def snoozer(job: Job) -> int:
        if job.snoozes < times:
            raise Snooze(0.05)
        return job.snoozes

    return registry


async def test_snoozing_three_times_uses_no_attempt(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    rec = Recorder()
    async with running_worker(pool, snoozing_registry(3), QUICK, rec):
        job_id = await queue.enqueue("snoozer", None, options=EnqueueOptions(max_attempts=1))
        job = await queue.wait(job_id, timeout=30)
    assert job.status is JobStatus.SUCCEEDED and job.result == 3
    assert job.attempt == 1 and job.snoozes == 3 and job.errors == ()
    assert len(rec.outcomes("snoozed")) == 3


async def test_a_job_that_snoozes_past_its_cap_fails(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    registry = snoozing_registry(1000, RetryPolicy(max_snoozes=2))
    async with running_worker(pool, registry, QUICK):
        job = await queue.wait(await queue.enqueue("snoozer", None), timeout=30)
    assert job.status is JobStatus.FAILED and job.snoozes == 2
    assert job.last_error is not None and "snoozed 2 times" in job.last_error


# ------------------------------------------------------------------ retry policies


def policy_registry() -> Registry:
    registry = Registry()

    def raising(exc: type[BaseException]) -> Any:
        async def handler(job: Job) -> None:
            raise exc(f"attempt {job.attempt}")

        return handler

    timeouts = RetryPolicy(max_attempts=3, retry_on=(TimeoutError,))
    registry.register("retry_on_timeout", raising(TimeoutError), retry=timeouts)
    registry.register("retry_on_but_value_error", raising(ValueError), retry=timeouts)
    registry.register(
        "gives_up_on_value_error",
        raising(ValueError),
        retry=RetryPolicy(give_up_on=(ValueError,), retry_on=(ValueError,)),
    )
    registry.register(
        "permanent_despite_retry_on",
        raising(PermanentError),
        retry=RetryPolicy(retry_on=(Exception,)),
    )
    registry.register("generous_policy", raising(RuntimeError), retry=RetryPolicy(max_attempts=9))
    registry.register(
        "hour_backoff", raising(RuntimeError), retry=RetryPolicy(backoff=lambda n: 3600.0 * n)
    )
    return registry


@pytest.mark.parametrize(
    ("name", "max_attempts", "attempts"),
    [
        ("retry_on_timeout", None, 3),  # the policy's limit, below the job's 25
        ("retry_on_but_value_error", None, 1),  # not in retry_on: no retry
        ("gives_up_on_value_error", None, 1),  # give_up_on beats retry_on
        ("permanent_despite_retry_on", None, 1),  # PermanentError beats the policy
        ("generous_policy", 2, 2),  # the job's own limit is the stricter one
    ],
)
async def test_each_retry_policy_branch_decides_as_documented(
    pool: asyncpg.Pool, name: str, max_attempts: int | None, attempts: int
) -> None:
    queue = Queue(pool)
    async with running_worker(pool, policy_registry(), QUICK):
        options = EnqueueOptions(max_attempts=max_attempts)
        job = await queue.wait(await queue.enqueue(name, None, options=options), timeout=30)
    assert job.status is JobStatus.FAILED
    assert job.attempt == attempts and len(job.errors) == attempts


async def test_a_policys_backoff_sets_the_retry_delay(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    rec = Recorder()
    async with running_worker(pool, policy_registry(), QUICK, rec):
        job_id = await queue.enqueue("hour_backoff", None)
        await rec.until(lambda: len(rec.outcomes("retried")) == 1)
    job = await queue.get(job_id)
    assert job is not None and job.status is JobStatus.QUEUED
    assert 3590 < (job.run_at - job.errors[0].at).total_seconds() < 3610


def test_retry_policies_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="retry_on"):
        RetryPolicy(retry_on=("TimeoutError",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_snoozes"):
        RetryPolicy(max_snoozes=-1)
    with pytest.raises(ValueError, match="Snooze delay"):
        Snooze(-1)


# ------------------------------------------------------------------ cancelling running jobs


def cancellable_registry() -> tuple[Registry, threading.Event]:
    registry = Registry()
    sync_started = threading.Event()

    @registry.job("forever")
    async def forever(job: Job) -> None:
        await asyncio.get_running_loop().create_future()

    @registry.job("polite")
    def polite(job: Job) -> None:
        sync_started.set()
        while not pgfleet.cancel_requested():
            threading.Event().wait(0.01)
        raise RuntimeError("stopping as asked")

    @registry.job("quick")
    async def quick(job: Job) -> str:
        return "done"

    return registry, sync_started


async def cancel_when_started(queue: Queue, rec: Recorder, name: str) -> Job:
    job_id = await queue.enqueue(name, None)
    await rec.until(lambda: any(j.id == job_id for j in rec.started))
    asked = await queue.cancel(job_id, by="operator ann")
    assert asked.status is JobStatus.RUNNING and asked.cancel_requested_at is not None
    return await queue.wait(job_id, timeout=30)


async def test_a_running_async_job_cancelled_ends_cancelled_and_frees_its_slot(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    registry, _ = cancellable_registry()
    rec = Recorder()
    config = WorkerConfig(concurrency=1, cancel_grace_period=0.05, **FAST)
    async with running_worker(pool, registry, config, rec) as (worker, _):
        job = await cancel_when_started(queue, rec, "forever")
        after = await queue.wait(await queue.enqueue("quick", None), timeout=30)
    assert job.status is JobStatus.CANCELLED and job.cancelled_by == "operator ann"
    assert job.attempt == 1 and job.errors == ()
    assert worker.cancel_watcher.requested == 1
    assert after.status is JobStatus.SUCCEEDED  # the slot took new work


async def test_a_sync_handler_that_stops_when_asked_ends_cancelled(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    registry, _ = cancellable_registry()
    rec = Recorder()
    async with running_worker(pool, registry, QUICK, rec):
        job = await cancel_when_started(queue, rec, "polite")
    assert job.status is JobStatus.CANCELLED and job.attempt == 1


async def test_without_notifications_the_heartbeat_delivers_the_cancel(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    registry, _ = cancellable_registry()
    rec = Recorder()
    config = WorkerConfig(listen=False, cancel_grace_period=0.05, **FAST)
    async with running_worker(pool, registry, config, rec) as (worker, _):
        assert worker.listener is None
        beats = worker.heartbeat.beats
        job = await cancel_when_started(queue, rec, "forever")
        # At most a beat or two after the request, never a rescue.
        assert worker.heartbeat.beats - beats <= 4
    assert job.status is JobStatus.CANCELLED


async def test_a_finished_job_cannot_be_cancelled(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    registry, _ = cancellable_registry()
    async with running_worker(pool, registry, QUICK):
        job_id = await queue.enqueue("quick", None)
        await queue.wait(job_id, timeout=30)
    with pytest.raises(InvalidJobState, match="queued, waiting or running"):
        await queue.cancel(job_id)


async def test_a_cancel_racing_completion_ends_in_exactly_one_outcome(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    registry = Registry()
    ran: dict[uuid.UUID, int] = {}

    @registry.job("racer")
    async def racer(job: Job) -> str:
        ran[job.id] = ran.get(job.id, 0) + 1
        for _ in range(random.randrange(3)):
            await asyncio.sleep(0)
        return "finished"

    rng = random.Random(26)
    rec = Recorder()
    trials = 1000
    outcomes: dict[str, int] = {}

    async def trial() -> None:
        job_id = await queue.enqueue("racer", None)
        for _ in range(rng.randrange(40)):
            await asyncio.sleep(0)
        with contextlib.suppress(InvalidJobState):  # it finished first
            await queue.cancel(job_id, by="racer")
        job = await queue.wait(job_id, timeout=60)
        assert job.status in (JobStatus.SUCCEEDED, JobStatus.CANCELLED)
        if job.status is JobStatus.SUCCEEDED:
            assert job.result == "finished" and job.cancelled_by is None
            assert ran[job.id] == 1
        else:
            assert job.result is None and job.cancelled_by == "racer"
            assert ran.get(job.id, 0) <= 1
        outcomes[job.status.value] = outcomes.get(job.status.value, 0) + 1

    config = WorkerConfig(concurrency=16, cancel_grace_period=0.01, **FAST)
    async with running_worker(pool, registry, config, rec):
        for _ in range(trials // 50):
            await asyncio.gather(*(trial() for _ in range(50)))
    assert sum(outcomes.values()) == trials
    finished = [job.id for job, _ in rec.finished]
    assert len(finished) == len(set(finished))  # one outcome per started attempt
    counts = await pool.fetch("SELECT status::text, count(*) FROM pgfleet.jobs GROUP BY 1")
    assert sum(r[1] for r in counts) == trials
    assert {r[0] for r in counts} <= {"succeeded", "cancelled"}


# ------------------------------------------------------------------ on time


async def test_delayed_jobs_start_on_time_with_the_default_poll_interval(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    registry = Registry()

    @registry.job("later")
    async def later(job: Job) -> None:
        return None

    rng = random.Random(5)
    requests = [
        EnqueueRequest("later", None, EnqueueOptions(delay=1 + 4 * rng.random()))
        for _ in range(200)
    ]
    config = WorkerConfig(concurrency=16)  # poll_interval stays 2 s
    async with running_worker(pool, registry, config):
        ids = await queue.enqueue_many(requests)
        jobs = await asyncio.gather(*(queue.wait(i, timeout=60) for i in ids))
    late = sorted((j.started_at - j.run_at).total_seconds() * 1000 for j in jobs if j.started_at)
    assert len(late) == 200
    quantiles = statistics.quantiles(late, n=20)
    print(
        f"lateness ms over 200 delayed jobs: min {late[0]:.1f} median {statistics.median(late):.1f} "
        f"p90 {quantiles[17]:.1f} p95 {quantiles[18]:.1f} max {late[-1]:.1f}"
    )
    assert statistics.median(late) < 50


# ------------------------------------------------------------------ dead workers


async def test_a_rescued_attempt_joins_the_history_and_a_cancelled_one_ends_cancelled(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    dead_worker = uuid.uuid4()
    await register_worker(pool, dead_worker, alive=False)
    lost = await queue.enqueue("record", {})
    asked = await queue.enqueue("record", {})
    for job_id in (lost, asked):
        await put_in_state(pool, job_id, "running", worker_id=dead_worker, attempt=1)
    await queue.cancel(asked, by="ops")
    leader = Worker(pool, Registry(), WorkerConfig(**FAST))
    await leader.heartbeat.run_once()
    assert await leader.rescuer.rescue() == 2
    requeued, cancelled = await queue.get(lost), await queue.get(asked)
    assert requeued is not None and requeued.status is JobStatus.QUEUED
    (entry,) = requeued.errors
    assert entry.attempt == 1 and entry.worker_id == dead_worker
    assert "stopped heartbeating during attempt 1" in entry.error
    assert cancelled is not None and cancelled.status is JobStatus.CANCELLED
    assert cancelled.cancelled_by == "ops" and cancelled.finished_at is not None
    await leader.heartbeat.deregister()
