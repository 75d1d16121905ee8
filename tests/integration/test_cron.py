"""Cron schedules against a real Postgres.

The services' time source is the database clock; these tests pass ``now``
explicitly to ``prepare``/``run_once`` to stand for workers whose clocks differ (or
jump), and synchronise on database state, never on sleeping.
"""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import asyncpg
import pytest

from pgfleet import (
    CronJob,
    DailySchedule,
    EnqueueOptions,
    InvalidOptions,
    MonthlySchedule,
    Queue,
    Registry,
    Worker,
    WorkerConfig,
)
from pgfleet.cron.occurrences import latest_occurrence, next_occurrence
from pgfleet.cron.runner import CronService, Outcome
from pgfleet.db.deadlines import AppPool
from tests.apps import runtime_app
from tests.integration.conftest import Recorder, running_worker

MINUTE = timedelta(minutes=1)
T0 = datetime(2024, 5, 1, 12, 0, 0, 500000, tzinfo=UTC)  # half a second after a slot


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def service(pool: asyncpg.Pool, *crons: CronJob, poll: float = 1.0) -> CronService:
    return CronService(
        pool, runtime_app.registry, list(crons), WorkerConfig(cron_poll_interval=poll)
    )


async def cron_jobs(pool: asyncpg.Pool, name: str | None = None) -> list[asyncpg.Record]:
    rows: list[asyncpg.Record] = await pool.fetch(
        "SELECT id, name, job_key, run_at, status::text AS status, created_at "
        "FROM pgfleet.jobs WHERE $1::text IS NULL OR name = $1 ORDER BY run_at, id",
        name,
    )
    return rows


async def cron_row(pool: asyncpg.Pool, cron_id: str) -> asyncpg.Record:
    row = await pool.fetchrow("SELECT * FROM pgfleet.crons WHERE id = $1", cron_id)
    assert row is not None
    return row


# ------------------------------------------------------------------ exactly once


async def test_racing_services_with_skewed_clocks_enqueue_each_occurrence_once(
    pool: asyncpg.Pool,
) -> None:
    crons = [
        CronJob.interval("race-minute", "record", MINUTE).options(overlap=True),
        CronJob.interval("race-keyed", "record", MINUTE),
    ]
    skews = [0.0, 0.0, -95.0, -30.0, 25.0, 0.2]  # seconds: two lag by more than a slot
    services = [service(pool, *crons) for _ in skews]
    await asyncio.gather(*(s.prepare(now=T0) for s in services))
    rounds = 20
    for k in range(1, rounds + 1):
        base = T0 + k * MINUTE
        order = list(zip(services, skews, strict=True))
        random.shuffle(order)
        await asyncio.gather(*(s.run_once(now=base + timedelta(seconds=d)) for s, d in order))

    slots = [T0.replace(microsecond=0) + k * MINUTE for k in range(1, rounds + 1)]
    overlap = await pool.fetch("SELECT run_at FROM pgfleet.jobs WHERE job_key IS NULL ORDER BY 1")
    assert [r["run_at"] for r in overlap] == slots  # one per slot, none missing
    # The keyed schedule's first job is still queued (nothing runs here), so each
    # later occurrence is handed out but absorbed by it: one job, last slot recorded.
    keyed = await pool.fetch("SELECT run_at FROM pgfleet.jobs WHERE job_key = 'race-keyed'")
    assert [r["run_at"] for r in keyed] == [slots[0]]
    for cron_id in ("race-minute", "race-keyed"):
        row = await cron_row(pool, cron_id)
        assert row["last_occurrence"] == slots[-1]


async def test_every_concurrent_hand_out_of_one_occurrence_but_one_is_refused(
    pool: asyncpg.Pool,
) -> None:
    cron = CronJob.interval("contended", "record", MINUTE).options(overlap=True)
    services = [service(pool, cron) for _ in range(8)]
    await asyncio.gather(*(s.prepare(now=T0) for s in services))
    slot = T0.replace(microsecond=0) + MINUTE
    outcomes = await asyncio.gather(*(s.hand_out("contended", slot) for s in services))
    assert sorted(outcomes) == sorted([Outcome.ENQUEUED] + [Outcome.TAKEN] * 7)
    assert [r["run_at"] for r in await cron_jobs(pool)] == [slot]


async def test_a_clock_that_jumps_back_never_enqueues_again(pool: asyncpg.Pool) -> None:
    cron = CronJob.interval("jumpy", "record", MINUTE).options(overlap=True)
    svc = service(pool, cron)
    await svc.prepare(now=T0)
    late = T0 + 5 * MINUTE
    await svc.run_once(now=late)
    (job,) = await cron_jobs(pool)
    assert job["run_at"] == latest_occurrence(cron, late)

    # The same worker's clock jumps back by several slots.
    for back in (1, 2, 4):
        await svc.run_once(now=late - back * MINUTE)
    # A worker that (re)starts with a lagging clock.
    lagging = service(pool, cron)
    await lagging.prepare(now=T0 - timedelta(hours=1))
    await lagging.run_once(now=late - 2 * MINUTE)
    # Even told to hand out old occurrences directly, the database refuses.
    for back in range(0, 5):
        occurrence = latest_occurrence(cron, late) - back * MINUTE
        assert await lagging.hand_out("jumpy", occurrence) is Outcome.TAKEN
    assert len(await cron_jobs(pool)) == 1
    # Once its clock catches up it takes part again.
    await lagging.run_once(now=late + MINUTE)
    assert len(await cron_jobs(pool)) == 2


# ------------------------------------------------------------------ new definitions


async def test_a_new_schedule_waits_for_its_next_occurrence(pool: asyncpg.Pool) -> None:
    cron = CronJob.monthly_utc("monthly-report", "record", MonthlySchedule(1, 3, 30))
    now = at("2024-05-20 10:00")
    svc = service(pool, cron)
    await svc.prepare(now=now)
    await svc.run_once(now=now)
    assert await cron_jobs(pool) == []
    assert (await cron_row(pool, "monthly-report"))["last_occurrence"] == at("2024-05-01 03:30")
    await svc.run_once(now=at("2024-06-01 03:30"))
    assert [r["run_at"] for r in await cron_jobs(pool)] == [at("2024-06-01 03:30")]


async def test_catch_up_enqueues_the_latest_due_occurrence_exactly_once(
    pool: asyncpg.Pool,
) -> None:
    cron = CronJob.monthly_utc("monthly-report", "record", MonthlySchedule(1, 3, 30))
    now = at("2024-05-20 10:00")
    first = [service(pool, cron.catch_up_on_start()) for _ in range(3)]
    await asyncio.gather(*(s.prepare(now=now) for s in first))
    await asyncio.gather(*(s.run_once(now=now) for s in first))
    # Later starts (with or without catch-up) find the schedule recorded.
    again = service(pool, cron.catch_up_on_start())
    plain = service(pool, cron)
    for svc in (again, plain):
        await svc.prepare(now=now + timedelta(hours=1))
        await svc.run_once(now=now + timedelta(hours=1))
    jobs = await cron_jobs(pool)
    assert [(r["run_at"], r["job_key"]) for r in jobs] == [
        (at("2024-05-01 03:30"), "monthly-report")
    ]


async def test_a_worker_catches_up_on_the_database_clock_and_runs_the_job(
    pool: asyncpg.Pool,
) -> None:
    cron = CronJob.daily_in_timezone(
        "nightly", "record", DailySchedule(2, 30), "America/New_York"
    ).catch_up_on_start()
    rec = Recorder()
    config = WorkerConfig(poll_interval=0.2, cron_poll_interval=0.5)
    async with running_worker(pool, runtime_app.registry, config, rec, crons=[cron]):
        await rec.until(lambda: len(rec.outcomes("succeeded")) == 1)
    (job,) = await cron_jobs(pool)
    # Enqueued by the first round, at database time created_at.
    assert job["run_at"] == latest_occurrence(cron, job["created_at"])
    assert job["status"] == "succeeded" and job["job_key"] == "nightly"
    # A worker started later without catch-up enqueues nothing more.
    async with running_worker(pool, runtime_app.registry, config, crons=[cron]) as (w, _):
        await w.wait_started()
        assert w.cron_runner is not None
        await w.cron_runner.run_once()
    assert len(await cron_jobs(pool)) == 1


# ------------------------------------------------------------------ changed definitions


async def test_a_changed_definition_takes_effect_cleanly(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    old = CronJob.daily_utc("report", "record", DailySchedule(9, 0)).options(overlap=True)
    new = CronJob.daily_utc("report", "serial", DailySchedule(9, 30), payload={}).options(
        overlap=True
    )
    a = service(pool, old)
    await a.prepare(now=at("2024-05-01 08:00"))
    await a.run_once(now=at("2024-05-01 09:00:01"))

    # Deployed at 10:00: the new 09:30 occurrence has passed and is not enqueued.
    b = service(pool, new)
    with caplog.at_level(logging.INFO, logger="pgfleet"):
        await b.prepare(now=at("2024-05-01 10:00"))
    assert "definition changed from 'daily 09:00 UTC' to 'daily 09:30 UTC'" in caplog.text
    row = await cron_row(pool, "report")
    assert (row["definition"], row["job_name"]) == ("daily 09:30 UTC", "serial")
    await b.run_once(now=at("2024-05-01 10:00"))

    # The old definition, still running somewhere, enqueues nothing any more.
    with caplog.at_level(logging.WARNING, logger="pgfleet"):
        await a.run_once(now=at("2024-05-02 09:00:01"))
    assert "not this worker's 'daily 09:00 UTC'" in caplog.text
    await b.run_once(now=at("2024-05-02 09:30:01"))
    await a.run_once(now=at("2024-05-03 09:00:01"))
    await b.run_once(now=at("2024-05-03 09:30:01"))

    jobs = [(r["run_at"], r["name"]) for r in await cron_jobs(pool)]
    assert jobs == [
        (at("2024-05-01 09:00"), "record"),
        (at("2024-05-02 09:30"), "serial"),
        (at("2024-05-03 09:30"), "serial"),
    ]


async def test_a_changed_definition_never_moves_the_schedule_back(pool: asyncpg.Pool) -> None:
    hourly = CronJob.interval("sync", "record", timedelta(hours=1)).options(overlap=True)
    minutely = CronJob.interval("sync", "record", MINUTE).options(overlap=True)
    fast = service(pool, minutely)
    await fast.prepare(now=at("2024-05-01 11:00:30"))
    await fast.run_once(now=at("2024-05-01 12:34:10"))  # hands out 12:34
    slow = service(pool, hourly)
    await slow.prepare(now=at("2024-05-01 12:34:20"))
    await slow.run_once(now=at("2024-05-01 12:59:59"))
    await slow.run_once(now=at("2024-05-01 13:00:00"))
    assert [r["run_at"] for r in await cron_jobs(pool)] == [
        at("2024-05-01 12:34"),
        at("2024-05-01 13:00"),
    ]


async def test_a_deleted_schedule_row_is_recorded_again(pool: asyncpg.Pool) -> None:
    # Even with catch-up: a running worker that finds the row gone does not replay
    # the latest occurrence (it may have run it already).
    cron = CronJob.interval("gone", "record", MINUTE).options(overlap=True).catch_up_on_start()
    svc = service(pool, cron)
    await svc.prepare(now=T0)
    await svc.run_once(now=T0)  # the catch-up
    await pool.execute("DELETE FROM pgfleet.crons WHERE id = 'gone'")
    await pool.execute("DELETE FROM pgfleet.jobs")
    await svc.run_once(now=T0 + MINUTE)  # finds the row missing: records it again
    assert (await cron_row(pool, "gone"))["last_occurrence"] == latest_occurrence(cron, T0 + MINUTE)
    await svc.run_once(now=T0 + 2 * MINUTE)
    assert [r["run_at"] for r in await cron_jobs(pool)] == [
        latest_occurrence(cron, T0 + 2 * MINUTE)
    ]


# ------------------------------------------------------------------ job keys


async def test_an_occurrence_does_not_pile_onto_a_job_still_active(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    cron = CronJob.interval("cleanup", "record", MINUTE, payload={"table": "sessions"})
    svc = service(pool, cron)
    await svc.prepare(now=T0)
    slot = T0.replace(microsecond=0)
    assert await svc.hand_out("cleanup", slot + MINUTE) is Outcome.ENQUEUED
    with caplog.at_level(logging.INFO, logger="pgfleet"):
        assert await svc.hand_out("cleanup", slot + 2 * MINUTE) is Outcome.DEDUPLICATED
    assert "is still queued or running" in caplog.text
    (first,) = await cron_jobs(pool)
    row = await cron_row(pool, "cleanup")
    assert row["last_occurrence"] == slot + 2 * MINUTE and row["last_job_id"] == first["id"]

    queue = Queue(pool)
    await queue.complete(first["id"])
    assert await svc.hand_out("cleanup", slot + 3 * MINUTE) is Outcome.ENQUEUED
    jobs = await cron_jobs(pool)
    assert [(r["run_at"], r["job_key"], r["status"]) for r in jobs] == [
        (slot + MINUTE, "cleanup", "succeeded"),
        (slot + 3 * MINUTE, "cleanup", "queued"),
    ]
    job = await queue.get(jobs[1]["id"])
    assert job is not None and job.payload == {"table": "sessions"}
    assert (await cron_row(pool, "cleanup"))["last_job_id"] == jobs[1]["id"]


async def test_options_apply_to_every_enqueued_job(pool: asyncpg.Pool) -> None:
    cron = CronJob.interval("tuned", "record", MINUTE).options(
        EnqueueOptions(priority=-7, max_attempts=2, queue_name="reports", job_key="report-lock")
    )
    svc = service(pool, cron)
    await svc.prepare(now=T0)
    await svc.run_once(now=T0 + MINUTE)
    (job,) = await Queue(pool).recent()
    assert (job.priority, job.max_attempts, job.queue_name, job.job_key) == (
        -7,
        2,
        "reports",
        "report-lock",
    )


# ------------------------------------------------------------------ logging


async def test_enqueues_log_at_info_and_lost_races_at_debug(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    cron = CronJob.interval("logged", "record", MINUTE)
    a, b = service(pool, cron), service(pool, cron)
    await a.prepare(now=T0)
    await b.prepare(now=T0)
    with caplog.at_level(logging.DEBUG, logger="pgfleet"):
        await a.run_once(now=T0 + MINUTE)
        await b.run_once(now=T0 + MINUTE)
    records = [(r.levelno, r.getMessage()) for r in caplog.records if "logged" in r.getMessage()]
    assert [level for level, _ in records] == [logging.INFO, logging.DEBUG]
    assert "enqueued job" in records[0][1]
    assert "already enqueued by another worker" in records[1][1]


# ------------------------------------------------------------------ startup checks


def _check(crons: list[Any]) -> str:
    with pytest.raises(InvalidOptions) as info:
        # No pool: the cron list is refused while the worker is built, before any query.
        Worker(cast(AppPool, None), runtime_app.registry, WorkerConfig(), crons=crons)
    return str(info.value)


def test_bad_cron_lists_fail_when_the_worker_is_built() -> None:
    assert "duplicate cron id 'twice'" in _check(
        [CronJob.interval("twice", "record", 60), CronJob.interval("twice", "serial", 60)]
    )
    assert "no handler is registered for job name 'send_report'" in _check(
        [CronJob.interval("report", "send_report", 60)]
    )
    assert "item 0 is dict" in _check([{"id": "x"}])
    with pytest.raises(InvalidOptions, match="unknown time zone 'Europe/Atlantis'"):
        CronJob.daily_in_timezone("x", "record", DailySchedule(9, 0), "Europe/Atlantis")
    with pytest.raises(InvalidOptions, match="hour must be an integer from 0 to 23, got 24"):
        DailySchedule(24, 0)
    with pytest.raises(InvalidOptions, match="day must be an integer from 1 to 31, got 0"):
        MonthlySchedule(0, 0, 0)


async def test_a_worker_without_the_handler_in_its_served_names_still_enqueues(
    pool: asyncpg.Pool,
) -> None:
    # The cron needs a registered handler, not one this worker serves: another
    # worker of the fleet runs the job.
    registry = Registry()
    registry.register("elsewhere", lambda job: None)
    registry.register("here", lambda job: None)
    cron = CronJob.interval("split", "elsewhere", MINUTE)
    svc = CronService(pool, registry, [cron], WorkerConfig(job_names=["here"]))
    await svc.prepare(now=T0)
    await svc.run_once(now=T0 + MINUTE)
    assert [r["name"] for r in await cron_jobs(pool)] == ["elsewhere"]


async def test_next_wait_aims_just_after_the_next_occurrence(pool: asyncpg.Pool) -> None:
    cron = CronJob.interval("soon", "record", timedelta(seconds=10))
    svc = service(pool, cron, poll=5.0)
    await svc.prepare(now=T0)
    await svc.run_once(now=T0)  # 0.5 s after a slot: the next is 9.5 s away
    assert 4.5 <= svc.next_wait() <= 5.0
    await svc.run_once(now=T0 + timedelta(seconds=8))  # 1.5 s before the next
    assert 1.0 < svc.next_wait() < 1.7
    assert next_occurrence(cron, T0) == T0.replace(microsecond=0) + timedelta(seconds=10)


async def test_a_changed_job_name_takes_over_the_schedule(pool: asyncpg.Pool) -> None:
    old = CronJob.interval("renamed", "record", MINUTE).options(overlap=True)
    new = CronJob.interval("renamed", "sync_record", MINUTE).options(overlap=True)
    a = service(pool, old)
    await a.prepare(now=T0)
    b = service(pool, new)
    await b.prepare(now=T0 + timedelta(seconds=5))
    row = await cron_row(pool, "renamed")
    assert row["job_name"] == "sync_record"
    assert row["last_occurrence"] == latest_occurrence(old, T0)  # the slots go on
    assert await a.hand_out("renamed", T0.replace(microsecond=0) + MINUTE) is Outcome.SUPERSEDED
    await b.run_once(now=T0 + MINUTE)
    assert [r["name"] for r in await cron_jobs(pool)] == ["sync_record"]
