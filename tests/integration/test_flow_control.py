"""Flow control against a real Postgres: limits and pauses as the library stores
them, and what in-process workers claim under them (real processes, many slots
and the rate windows: tests/acceptance/test_flow_processes.py)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import uuid
from typing import Any

import asyncpg
import pytest

from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    InvalidName,
    InvalidOptions,
    Job,
    Queue,
    Registry,
    WorkerConfig,
)
from tests.integration.conftest import FAST, Recorder, running_worker
from tools.devkit import until


def _registry(*names: str, **limits: Any) -> Registry:
    registry = Registry()

    async def handler(job: Job, payload: Any) -> None:
        await asyncio.sleep(0)

    for name in names:
        registry.register(name, handler, **(limits if name == names[0] else {}))
    return registry


async def _status_counts(pool: asyncpg.Pool, name: str) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT status::text, count(*) FROM pgfleet.jobs WHERE name = $1 GROUP BY 1", name
    )
    return {r[0]: r[1] for r in rows}


# ---------------------------------------------------------------- storing limits


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": 0},
        {"concurrency": -1},
        {"concurrency": 1.5},
        {"concurrency": True},
        {"rate": 0},
        {"rate": -5},
        {"rate": 10, "per": 0},
        {"rate": 10, "per": -1},
        {"rate": 10, "per": math.inf},
        {"rate": 10, "per": math.nan},
        {"rate": 10, "per": 10**9},
        {"rate": 10, "per": "1s"},
        {"concurrency": 10_000_000},
        {},
        {"concurrency": 2, "per_key": "yes"},
    ],
)
async def test_bad_limits_are_refused_and_write_nothing(
    pool: asyncpg.Pool, bad: dict[str, Any]
) -> None:
    queue = Queue(pool)
    with pytest.raises(InvalidOptions):
        await queue.set_limits("charge_card", **bad)
    assert await queue.limits() == []


async def test_an_invalid_job_name_is_refused_everywhere(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    for call in (
        queue.set_limits("no spaces", concurrency=1),
        queue.clear_limits("no spaces"),
        queue.pause("bad/name"),
        queue.pause(queue_name="bad name"),
        queue.resume("x" * 129),
    ):
        with pytest.raises(InvalidName):
            await call
    with pytest.raises(InvalidOptions):
        await queue.pause()
    with pytest.raises(InvalidOptions):
        await queue.pause("a", queue_name="b")
    assert await queue.limits() == [] and await queue.paused() == []


async def test_limits_are_set_read_back_and_cleared(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    stored = await queue.set_limits("send_sms", rate=100, per=dt.timedelta(minutes=1))
    assert (stored.name, stored.concurrency, stored.rate, stored.per) == ("send_sms", None, 100, 60)
    assert stored.source == "operator" and not stored.paused
    await queue.set_limits("export", concurrency=2, per_key=True)
    assert [(lim.name, lim.concurrency, lim.per_key) for lim in await queue.limits()] == [
        ("export", 2, True),
        ("send_sms", None, False),
    ]
    assert await queue.clear_limits("send_sms") is True
    assert await queue.clear_limits("send_sms") is False
    assert [lim.name for lim in await queue.limits()] == ["export"]


async def test_clearing_the_limits_of_a_paused_name_keeps_the_pause(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.set_limits("export", concurrency=3)
    await queue.pause("export")
    assert await queue.clear_limits("export") is True
    (row,) = await queue.limits()
    assert (row.concurrency, row.rate, row.paused) == (None, None, True)
    assert await queue.resume("export") is True
    assert await queue.limits() == []


async def test_a_code_default_is_in_the_database_before_the_first_claim(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    await queue.enqueue("charge_card", {})
    seen: list[Any] = []
    registry = Registry()

    @registry.job("charge_card", concurrency=5, rate=20, per=2)
    async def charge_card(job: Job, payload: Any) -> None:
        seen.extend(await queue.limits())  # the first claim's job reads them

    recorder = Recorder()
    async with running_worker(pool, registry, WorkerConfig(**FAST), recorder):
        await recorder.until(lambda: len(recorder.finished) == 1)
    (limit,) = seen
    assert (limit.concurrency, limit.rate, limit.per, limit.source) == (5, 20, 2.0, "code")


async def test_an_operator_value_wins_over_the_code_default(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.set_limits("charge_card", concurrency=9)
    registry = _registry("charge_card", concurrency=5)
    async with running_worker(pool, registry, WorkerConfig(**FAST)) as (worker, _):
        await worker.wait_started()
    (limit,) = await queue.limits()
    assert (limit.concurrency, limit.source) == (9, "operator")


# ---------------------------------------------------------------- pause


async def test_a_paused_name_starts_nothing_and_its_enqueues_are_kept(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.pause("report")
    await queue.enqueue_many([EnqueueRequest("report", {"i": i}) for i in range(10)])
    await queue.enqueue_many([EnqueueRequest("other", {"i": i}) for i in range(10)])
    recorder = Recorder()
    registry = _registry("report", "other")
    async with running_worker(pool, registry, WorkerConfig(**FAST), recorder):
        await recorder.until(lambda: len(recorder.outcomes("succeeded")) == 10)
        # Rounds that claimed the other name have seen the pause: nothing of it ran.
        assert await _status_counts(pool, "report") == {"queued": 10}
        assert {j.name for j in recorder.outcomes("succeeded")} == {"other"}
        assert [(p.kind, p.name) for p in await queue.paused()] == [("name", "report")]
        assert await queue.resume("report") is True
        await recorder.until(lambda: len(recorder.outcomes("succeeded")) == 20)
    assert await _status_counts(pool, "report") == {"succeeded": 10}
    assert await queue.paused() == []


async def test_pausing_a_running_fleet_stops_new_starts_within_one_round(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    gate = asyncio.Event()
    registry = Registry()
    started: list[int] = []

    @registry.job("step")
    async def step(job: Job, payload: dict[str, int]) -> None:
        started.append(payload["i"])
        await gate.wait()

    await queue.enqueue_many([EnqueueRequest("step", {"i": i}) for i in range(20)])
    config = WorkerConfig(concurrency=2, prefetch=0, **FAST)
    recorder = Recorder()
    async with running_worker(pool, registry, config, recorder):
        await recorder.until(lambda: len(started) == 2)
        await queue.pause("step")
        gate.set()  # the two running jobs finish; their slots come free
        await recorder.until(lambda: len(recorder.finished) == 2)
        # Each finish was written by a claim round that also claimed: none started.
        await until(lambda: _status_equals(pool, {"queued": 18, "succeeded": 2}))
        assert len(started) == 2
        await queue.resume("step")
        await recorder.until(lambda: len(recorder.finished) == 20)


async def _status_equals(pool: asyncpg.Pool, want: dict[str, int]) -> bool:
    return await _status_counts(pool, "step") == want


async def test_a_paused_named_queue_starts_nothing_while_other_queues_run(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    await queue.pause(queue_name="tenant-a")
    for i in range(5):
        await queue.enqueue("job", {"i": i}, options=EnqueueOptions(queue_name="tenant-a"))
        await queue.enqueue("job", {"i": i}, options=EnqueueOptions(queue_name="tenant-b"))
    recorder = Recorder()
    async with running_worker(pool, _registry("job"), WorkerConfig(**FAST), recorder):
        await recorder.until(lambda: len(recorder.finished) == 5)
        assert {j.queue_name for j, _ in recorder.finished} == {"tenant-b"}
        assert [(p.kind, p.name) for p in await queue.paused()] == [("queue", "tenant-a")]
        assert await queue.resume(queue_name="tenant-a") is True
        await recorder.until(lambda: len(recorder.finished) == 10)


# ---------------------------------------------------------------- limits in process


async def test_a_concurrency_limit_holds_across_two_workers(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.set_limits("limited", concurrency=3)
    running = 0
    peak = 0
    registry = Registry()

    @registry.job("limited")
    async def limited(job: Job, payload: Any) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.02)
        running -= 1

    await queue.enqueue_many([EnqueueRequest("limited", {"i": i}) for i in range(60)])
    recorder = Recorder()
    config = WorkerConfig(concurrency=8, **FAST)
    async with (
        running_worker(pool, registry, config, recorder),
        running_worker(pool, registry, config, recorder),
    ):
        await recorder.until(lambda: len(recorder.finished) == 60)
    assert peak == 3


async def test_keys_take_turns_that_carry_across_small_rounds(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    # One key's backlog first, then three other keys with two jobs each.
    await queue.enqueue_many(
        [EnqueueRequest("export", {"k": "big"}, EnqueueOptions(limit_key="big")) for _ in range(30)]
    )
    for key in ("a", "b", "c"):
        await queue.enqueue_many(
            [EnqueueRequest("export", {"k": key}, EnqueueOptions(limit_key=key)) for _ in range(2)]
        )
    order: list[str] = []
    registry = Registry()

    @registry.job("export")
    async def export(job: Job, payload: dict[str, str]) -> None:
        order.append(payload["k"])

    recorder = Recorder()
    config = WorkerConfig(concurrency=1, prefetch=0, **FAST)  # one job per round
    async with running_worker(pool, registry, config, recorder):
        await recorder.until(lambda: len(recorder.finished) == 36)
    # Rounds of one job each still go round the keys: every key's first job is
    # among the first four, and the small keys are done within eight.
    assert set(order[:4]) == {"big", "a", "b", "c"}
    assert order[:8].count("big") == 2 and set(order[8:]) == {"big"}


async def test_a_per_key_limit_bounds_each_key(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.set_limits("sync", concurrency=2, per_key=True)
    running: dict[str, int] = {}
    peaks: dict[str, int] = {}
    registry = Registry()

    @registry.job("sync")
    async def sync(job: Job, payload: dict[str, str]) -> None:
        key = payload["k"]
        running[key] = running.get(key, 0) + 1
        peaks[key] = max(peaks.get(key, 0), running[key])
        await asyncio.sleep(0.02)
        running[key] -= 1

    for key in ("a", "b", "c"):
        await queue.enqueue_many(
            [EnqueueRequest("sync", {"k": key}, EnqueueOptions(limit_key=key)) for _ in range(12)]
        )
    recorder = Recorder()
    async with running_worker(pool, registry, WorkerConfig(concurrency=16, **FAST), recorder):
        await recorder.until(lambda: len(recorder.finished) == 36)
    assert peaks == {"a": 2, "b": 2, "c": 2}


async def test_jobs_waiting_on_a_limit_are_counted_by_reason(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("held", {}) for _ in range(4)])
    await queue.enqueue_many([EnqueueRequest("free", {}) for _ in range(3)])
    await queue.pause("held")
    assert await queue.waiting_on_limits() == [("held", "paused", 4)]
    await queue.resume("held")
    await queue.set_limits("held", concurrency=1)
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'running', limited = true, lock_token = gen_random_uuid()"
        " WHERE id = (SELECT id FROM pgfleet.jobs WHERE name = 'held' LIMIT 1)"
    )
    assert await queue.waiting_on_limits() == [("held", "concurrency", 3)]


async def test_the_metrics_show_jobs_waiting_on_a_pause_and_how_long_it_lasts(
    pool: asyncpg.Pool,
) -> None:
    from pgfleet.service.metrics import QueueStats  # the service extra

    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("held", {}) for _ in range(4)])
    await queue.pause("held")
    await queue.pause(queue_name="ledger")
    stats = QueueStats(pool)
    await stats.refresh()
    families = {f.name: f for f in stats.collect()}
    waiting = {
        (s.labels["kind"], s.labels["reason"]): s.value
        for s in families["pgfleet_jobs_waiting_on_limit"].samples
    }
    assert waiting == {("held", "paused"): 4}
    paused = {
        (s.labels["target"], s.labels["name"]) for s in families["pgfleet_paused_seconds"].samples
    }
    assert paused == {("job_name", "held"), ("queue", "ledger")}


async def test_a_jobs_limit_key_is_on_the_job_its_handler_gets_and_on_queue_get(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    keyed = await queue.enqueue("report", {}, options=EnqueueOptions(limit_key="acme"))
    plain = await queue.enqueue("report", {})
    assert (await queue.get(keyed)).limit_key == "acme"  # type: ignore[union-attr]
    assert (await queue.get(plain)).limit_key is None  # type: ignore[union-attr]
    seen: dict[Any, str | None] = {}
    registry = Registry()

    @registry.job("report")
    async def report(job: Job) -> None:
        seen[job.id] = job.limit_key

    recorder = Recorder()
    async with running_worker(pool, registry, WorkerConfig(concurrency=4, **FAST), recorder):
        await recorder.until(lambda: len(recorder.finished) == 2)
    assert seen == {keyed: "acme", plain: None}
    done = await queue.get(keyed)
    assert done is not None and done.limit_key == "acme"


# ---------------------------------------------------------------- named queues (0009)


async def test_a_named_queue_runs_one_job_at_a_time_across_names_and_workers(
    pool: asyncpg.Pool,
) -> None:
    """A named queue's jobs of two names, each name served by its own worker: the
    queue hands over between the workers, in order, one job at a time."""
    queue = Queue(pool)
    ids = [
        await queue.enqueue(
            "qa" if n % 2 == 0 else "qb", {}, options=EnqueueOptions(queue_name="tenant:7")
        )
        for n in range(16)
    ]
    flags = await pool.fetchval(
        "SELECT bool_and(limited) FROM pgfleet.jobs WHERE queue_name = 'tenant:7'"
    )
    assert flags  # under flow control: off the fast path's index
    order: list[Any] = []
    ran_by: dict[Any, str] = {}
    running = 0
    peak = 0

    def registry_for(name: str) -> Registry:
        registry = Registry()

        async def handler(job: Job) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            order.append(job.id)
            ran_by[job.id] = name
            await asyncio.sleep(0.005)
            running -= 1

        registry.register(name, handler)
        return registry

    recorder = Recorder()
    config = WorkerConfig(concurrency=4, **FAST)
    async with (
        running_worker(pool, registry_for("qa"), config, recorder),
        running_worker(pool, registry_for("qb"), config, recorder),
    ):
        await recorder.until(lambda: len(recorder.finished) == 16)
    assert peak == 1
    assert order == ids
    assert {ran_by[i] for i in ids} == {"qa", "qb"}


async def test_a_claim_of_a_named_queue_skips_it_while_another_claim_of_it_is_open(
    pool: asyncpg.Pool,
) -> None:
    """The queue's lock: a claim whose snapshot shows a new head but not another
    worker's uncommitted claim of the queue claims nothing of it (the unique index
    used to refuse the second job; now the claim keeps the rule)."""
    queue = Queue(pool)
    second = await queue.enqueue("qb", {}, options=EnqueueOptions(queue_name="tenant:8"))
    one, other = await pool.acquire(), await pool.acquire()
    try:
        async with one.transaction():
            got = await one.fetch(
                "SELECT id FROM pgfleet.claim_flow(gen_random_uuid(), '{qb}', NULL, 4, 4)"
            )
            assert [r["id"] for r in got] == [second]
            # A job that goes ahead of it, committed while that claim is open.
            await queue.enqueue(
                "qa", {}, options=EnqueueOptions(queue_name="tenant:8", priority=-1)
            )
            taken = await other.fetch(
                "SELECT id FROM pgfleet.claim_flow(gen_random_uuid(), '{qa}', NULL, 4, 4)"
            )
            assert taken == []
        running = await pool.fetchval(
            "SELECT count(*) FROM pgfleet.jobs WHERE queue_name = 'tenant:8' AND status = 'running'"
        )
        assert running == 1
    finally:
        await pool.release(one)
        await pool.release(other)


async def test_a_job_written_with_a_queue_name_by_hand_is_flagged(pool: asyncpg.Pool) -> None:
    """Producers of the previous version (and SQL by hand) leave the flag unset: the
    trigger sets it, so the fast path never claims a named queue's job."""
    flagged = await pool.fetchval(
        "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, queue_name) "
        "VALUES (gen_random_uuid(), 'old', '{}', 3, 'tenant:9') RETURNING limited"
    )
    assert flagged is True
    plain = await pool.fetchval(
        "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts) "
        "VALUES (gen_random_uuid(), 'old', '{}', 3) RETURNING limited"
    )
    assert plain is False


async def test_no_update_of_the_jobs_table_pays_a_row_trigger_lock(pool: asyncpg.Pool) -> None:
    """A BEFORE UPDATE row trigger makes Postgres lock every row an UPDATE writes
    (one more WAL record per completed job): the flag is set on insert only (0012).
    A completion writes its heap update and index entries, and no tuple lock."""
    before_update = await pool.fetchval(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'pgfleet.jobs'::regclass"
        " AND NOT tgisinternal AND (tgtype & 1) = 1 AND (tgtype & 2) = 2 AND (tgtype & 16) = 16"
    )
    assert before_update == 0
    jobs = await pool.fetch(
        "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, status, lock_token)"
        " SELECT gen_random_uuid(), 'walled', '{}', 3, 'running', gen_random_uuid()"
        " FROM generate_series(1, 2) RETURNING id"
    )
    async with pool.acquire() as conn:
        for row in jobs:  # the first one also builds the indexes' first pages
            plan = await conn.fetchval(
                "EXPLAIN (ANALYZE, WAL, FORMAT JSON) UPDATE pgfleet.jobs"
                " SET status = 'succeeded', finished_at = now(), lock_token = NULL WHERE id = $1",
                row["id"],
            )
    # heap update, primary key and jobs_finished entries: 3 records (4 with a lock).
    assert json.loads(plan)[0]["Plan"]["WAL Records"] <= 3


async def test_an_unflagged_live_job_of_a_named_queue_is_refused(pool: asyncpg.Pool) -> None:
    """Only inserts are flagged by the trigger; the check refuses any other write
    that would leave a queued, running or waiting job of a named queue on the fast
    path (SQL by hand), and lets finished jobs be."""
    job = await pool.fetchval(
        "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts)"
        " VALUES (gen_random_uuid(), 'old', '{}', 3) RETURNING id"
    )
    with pytest.raises(asyncpg.CheckViolationError, match="jobs_named_queue_flagged"):
        await pool.execute("UPDATE pgfleet.jobs SET queue_name = 'tenant:3' WHERE id = $1", job)
    await pool.execute(
        "UPDATE pgfleet.jobs SET queue_name = 'tenant:3', limited = true WHERE id = $1", job
    )


async def test_a_retried_job_goes_under_flow_control_like_an_enqueue(pool: asyncpg.Pool) -> None:
    """A job that finished before its name got a limit (or, with a queue name,
    before 0009 flagged named queues) is queued again under flow control."""
    queue = Queue(pool)
    plain = await queue.enqueue("later_limited", {})
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'failed', finished_at = now() WHERE id = $1", plain
    )
    # Finished before 0009: a queue name, unflagged (finished jobs may be).
    old = await pool.fetchval(
        "INSERT INTO pgfleet.jobs (id, name, payload, max_attempts, status, finished_at)"
        " VALUES (gen_random_uuid(), 'serial', '{}', 3, 'failed', now()) RETURNING id"
    )
    await pool.execute(
        "UPDATE pgfleet.jobs SET queue_name = 'tenant:4', limited = false WHERE id = $1", old
    )
    await queue.set_limits("later_limited", concurrency=2)
    await queue.retry(plain)
    await queue.retry(old)
    flags = await pool.fetch(
        "SELECT id, status::text, limited FROM pgfleet.jobs WHERE id = ANY($1::uuid[])",
        [plain, old],
    )
    assert {(r["id"], r["status"], r["limited"]) for r in flags} == {
        (plain, "queued", True),
        (old, "queued", True),
    }


# ---------------------------------------------------------------- per-key rate pace


async def _round(pool: asyncpg.Pool, name: str, limit: int) -> list[Any]:
    """One full claim round of a worker serving ``name`` (nothing else claims)."""
    from pgfleet.db.store import Store

    async with pool.acquire() as conn:
        return await Store(conn).job_complete_and_claim(
            ids=[], tokens=[], actions=[], delays=[], errors=[], ran=[], results=[],
            worker_id=uuid.uuid4(), job_names=[name], queue_names=None,
            limit=limit, start=limit, started=[],
        )  # fmt: skip


async def test_a_per_key_rate_paces_the_loop_to_the_first_full_key_that_reopens(
    pool: asyncpg.Pool,
) -> None:
    from pgfleet.db.translate import claimed_count, flow_pace

    queue = Queue(pool)
    await queue.set_limits("sms", rate=1, per=30, per_key=True)
    for key in ("a", "c", "d"):
        await queue.enqueue("sms", {}, options=EnqueueOptions(limit_key=key))
    rows = await _round(pool, "sms", 8)
    assert claimed_count(rows) == 3  # one start per key fills each key's window
    await queue.enqueue("sms", {}, options=EnqueueOptions(limit_key="a"))
    await queue.enqueue("sms", {}, options=EnqueueOptions(limit_key="c"))
    # Their starts, moved back: "a" reopens in 10 s, "c" in 25 s; "d" in 1 s, but
    # it has no due job left, so it is not waited for.
    await pool.execute(
        "UPDATE pgfleet.limit_starts SET started_at = now() - make_interval(secs => CASE "
        "limit_key WHEN 'a' THEN 20 WHEN 'c' THEN 5 ELSE 29 END)"
    )
    rows = await _round(pool, "sms", 8)
    assert claimed_count(rows) == 0
    pace = flow_pace(rows)
    assert pace is not None and 8.0 < pace <= 10.0  # not a fiftieth of the window (0.6 s)
    # No full key with due jobs: a fiftieth of the window, as for a rate per name.
    await pool.execute("DELETE FROM pgfleet.limit_starts WHERE limit_key <> 'd'")
    await pool.execute(
        "UPDATE pgfleet.jobs SET run_at = now() + interval '1 hour' WHERE status = 'queued'"
    )
    await queue.enqueue("sms", {}, options=EnqueueOptions(limit_key="e"))
    rows = await _round(pool, "sms", 0)
    assert flow_pace(rows) == pytest.approx(0.6)


async def test_a_per_key_rate_holds_for_each_key_in_every_window_and_over_the_run(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    await queue.set_limits("sms", rate=10, per=1, per_key=True)
    for key in ("a", "b", "c"):
        await queue.enqueue_many(
            [EnqueueRequest("sms", {}, EnqueueOptions(limit_key=key)) for _ in range(30)]
        )
    registry = _registry("sms")
    recorder = Recorder()
    async with running_worker(pool, registry, WorkerConfig(concurrency=16, **FAST), recorder):
        await recorder.until(lambda: len(recorder.finished) == 90)
    # Per key: every window of one second that opens at an attempt start holds at
    # most 10, and past the first window each start waits for the start 10 before
    # it to leave the window (the loop wakes when a key's window reopens).
    rows = await pool.fetch(
        """SELECT k.limit_key,
                  (SELECT max((SELECT count(*) FROM pgfleet.jobs j2
                               WHERE j2.limit_key = k.limit_key
                                 AND j2.started_at >= j1.started_at
                                 AND j2.started_at < j1.started_at + interval '1 second'))
                   FROM pgfleet.jobs j1 WHERE j1.limit_key = k.limit_key) AS busiest,
                  (SELECT avg(w)::float8 FROM (
                       SELECT extract(epoch FROM started_at - lag(started_at, 10)
                                      OVER (ORDER BY started_at)) AS w
                       FROM pgfleet.jobs WHERE limit_key = k.limit_key) waits) AS mean_wait
           FROM (VALUES ('a'), ('b'), ('c')) AS k(limit_key)"""
    )
    for row in rows:
        assert row["busiest"] == 10, row
        assert 9 <= 10 / row["mean_wait"] <= 11, row


# ---------------------------------------------------------------- claim_flow's cheaper paths (0015)


async def _claim_flow(
    conn: Any, name: str, n: int = 10, done: list[uuid.UUID] | None = None
) -> Any:
    return await conn.fetch(
        "SELECT id FROM pgfleet.claim_flow(gen_random_uuid(), ARRAY[$1::text], NULL, $2, $2,"
        " $3::uuid[])",
        name,
        n,
        done or [],
    )


async def test_a_named_queue_freed_in_a_round_goes_to_a_later_claim(pool: asyncpg.Pool) -> None:
    """The round that writes a named queue's outcome leaves the queue to a later
    claim (0009), also now that the freed queues are looked up only when a named
    queue has a queued job; and the next claim hands it over."""
    queue = Queue(pool)
    first = await queue.enqueue("qf", {}, options=EnqueueOptions(queue_name="tenant:9"))
    second = await queue.enqueue("qf", {}, options=EnqueueOptions(queue_name="tenant:9"))
    assert [r["id"] for r in await _claim_flow(pool, "qf")] == [first]
    async with pool.acquire() as conn, conn.transaction():
        # The claim statement's completion, then its claim, in one transaction.
        await conn.execute(
            "UPDATE pgfleet.jobs SET status = 'succeeded', finished_at = now(), locked_by = NULL,"
            " lock_token = NULL WHERE id = $1",
            first,
        )
        assert await _claim_flow(conn, "qf", done=[first]) == []
    assert [r["id"] for r in await _claim_flow(pool, "qf")] == [second]


async def test_a_keys_head_that_cannot_start_leaves_the_keys_next_job(pool: asyncpg.Pool) -> None:
    """A key's first job in claim order is claimed through the descent that found
    the key; when it cannot start (not due, locked by another transaction, a named
    queue's job whose queue is busy) the key's next job that can is claimed, as
    before, and the head stays queued."""
    queue = Queue(pool)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    not_due = await queue.enqueue(
        "kx", {}, options=EnqueueOptions(limit_key="a", priority=-1, run_at=later)
    )
    due_a = await queue.enqueue("kx", {}, options=EnqueueOptions(limit_key="a"))
    locked = await queue.enqueue("kx", {}, options=EnqueueOptions(limit_key="b", priority=-1))
    due_b = await queue.enqueue("kx", {}, options=EnqueueOptions(limit_key="b"))
    busy = await queue.enqueue("other", {}, options=EnqueueOptions(queue_name="tenant:10"))
    assert [r["id"] for r in await _claim_flow(pool, "other")] == [busy]
    waits = await queue.enqueue(
        "kx", {}, options=EnqueueOptions(limit_key="c", priority=-1, queue_name="tenant:10")
    )
    due_c = await queue.enqueue("kx", {}, options=EnqueueOptions(limit_key="c"))
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM pgfleet.jobs WHERE id = $1 FOR UPDATE", locked)
        got = {r["id"] for r in await _claim_flow(pool, "kx")}
    assert got == {due_a, due_b, due_c}
    statuses = await pool.fetch(
        "SELECT id, status::text FROM pgfleet.jobs WHERE id = ANY ($1::uuid[])",
        [not_due, locked, waits],
    )
    assert {r["status"] for r in statuses} == {"queued"}


async def test_a_keyed_claim_starts_its_first_jobs_in_turn_order(pool: asyncpg.Pool) -> None:
    """The jobs a keyed claim starts now are the first of its turn order (one per
    key, keys in order after the last one served); the rest are held ahead."""
    queue = Queue(pool)
    for key in ("a", "b", "c", "d"):
        await queue.enqueue_many(
            [EnqueueRequest("ko", {}, EnqueueOptions(limit_key=key)) for _ in range(2)]
        )
    rows = await pool.fetch(
        "SELECT limit_key, started_at IS NOT NULL AS started"
        " FROM pgfleet.claim_flow(gen_random_uuid(), '{ko}', NULL, 6, 3, '{}')"
    )
    started = sorted(r["limit_key"] for r in rows if r["started"])
    held = sorted(r["limit_key"] for r in rows if not r["started"])
    assert started == ["a", "b", "c"]
    assert held == ["a", "b", "d"]
