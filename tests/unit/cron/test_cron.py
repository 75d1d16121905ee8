"""Cron occurrences as pure functions of (schedule, time), and cron definitions
that are refused before anything starts.

Expected instants are written in UTC next to the local time they stand for, from
the published transition dates: America/New_York 2024-03-10 02:00 EST -> 03:00 EDT
and 2024-11-03 02:00 EDT -> 01:00 EST; Europe/London 2024-03-31 01:00 GMT -> 02:00
BST and 2024-10-27 02:00 BST -> 01:00 GMT; Australia/Lord_Howe (+10:30, +11:00 in
summer: a 30-minute shift) 2024-04-07 02:00 -> 01:30 and 2024-10-06 02:00 -> 02:30;
Asia/Kolkata is +05:30 all year.
"""

from __future__ import annotations

import calendar
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from pgfleet import (
    CronJob,
    DailySchedule,
    EnqueueOptions,
    InvalidName,
    InvalidOptions,
    Job,
    JobKeyMode,
    MonthlySchedule,
    PayloadError,
    Registry,
    ValidationError,
    Weekday,
    WorkerConfig,
)
from pgfleet.cron.occurrences import (
    due_occurrence,
    latest_occurrence,
    next_occurrence,
    previous_occurrence,
)
from pgfleet.cron.runner import CronService
from pgfleet.db.deadlines import AppPool

NY = "America/New_York"
LONDON = "Europe/London"
LORD_HOWE = "Australia/Lord_Howe"
KOLKATA = "Asia/Kolkata"
MON_FRI = (Weekday.MONDAY, Weekday.TUESDAY, Weekday.WEDNESDAY, Weekday.THURSDAY, Weekday.FRIDAY)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def daily(hour: int, minute: int, zone: str = "UTC", days: Any = None) -> CronJob:
    schedule = DailySchedule(hour, minute)
    if days is not None:
        schedule = schedule.weekdays(days)
    if zone == "UTC":
        return CronJob.daily_utc("c", "j", schedule)
    return CronJob.daily_in_timezone("c", "j", schedule, zone)


def monthly(day: int, hour: int, minute: int, zone: str = "UTC") -> CronJob:
    if zone == "UTC":
        return CronJob.monthly_utc("c", "j", MonthlySchedule(day, hour, minute))
    return CronJob.monthly_in_timezone("c", "j", MonthlySchedule(day, hour, minute), zone)


def every(value: timedelta | float) -> CronJob:
    return CronJob.interval("c", "j", value)


@dataclass(frozen=True)
class Case:
    what: str
    cron: CronJob
    after: str  # UTC
    expected: tuple[str, ...]  # the next occurrences after `after`, in UTC


CASES = [
    # ---------------------------------------------------------- America/New_York
    Case(
        "NY 02:30 skipped on spring-forward day runs at 03:30 EDT",
        daily(2, 30, NY),
        "2024-03-09 00:00",
        ("2024-03-09 07:30", "2024-03-10 07:30", "2024-03-11 06:30"),
    ),
    Case(
        "NY 09:00 keeps local time across spring-forward",
        daily(9, 0, NY),
        "2024-03-09 00:00",
        ("2024-03-09 14:00", "2024-03-10 13:00", "2024-03-11 13:00"),
    ),
    Case(
        "NY 01:30 repeated on fall-back day runs once, at 01:30 EDT",
        daily(1, 30, NY),
        "2024-11-02 00:00",
        ("2024-11-02 05:30", "2024-11-03 05:30", "2024-11-04 06:30"),
    ),
    Case(
        "NY 02:00 on fall-back day (exists once, EST)",
        daily(2, 0, NY),
        "2024-11-02 12:00",
        ("2024-11-03 07:00", "2024-11-04 07:00"),
    ),
    Case(
        "NY 00:00 the night of spring-forward",
        daily(0, 0, NY),
        "2024-03-09 12:00",
        ("2024-03-10 05:00", "2024-03-11 04:00"),
    ),
    # ---------------------------------------------------------- Europe/London
    Case(
        "London 01:30 skipped on 31 March runs at 02:30 BST",
        daily(1, 30, LONDON),
        "2024-03-30 00:00",
        ("2024-03-30 01:30", "2024-03-31 01:30", "2024-04-01 00:30"),
    ),
    Case(
        "London 01:30 repeated on 27 October runs once, at 01:30 BST",
        daily(1, 30, LONDON),
        "2024-10-26 12:00",
        ("2024-10-27 00:30", "2024-10-28 01:30"),
    ),
    Case(
        "London 12:00 is UTC in winter and 11:00 UTC in summer",
        daily(12, 0, LONDON),
        "2024-03-30 13:00",
        ("2024-03-31 11:00", "2024-04-01 11:00"),
    ),
    # ---------------------------------------------------------- Australia/Lord_Howe
    Case(
        "Lord Howe 02:15 skipped by the 30-minute gap runs at 02:45 (+11)",
        daily(2, 15, LORD_HOWE),
        "2024-10-04 00:00",
        ("2024-10-04 15:45", "2024-10-05 15:45", "2024-10-06 15:15"),
    ),
    Case(
        "Lord Howe 01:45 repeated runs once, at the earlier (+11) instant",
        daily(1, 45, LORD_HOWE),
        "2024-04-05 00:00",
        ("2024-04-05 14:45", "2024-04-06 14:45", "2024-04-07 15:15"),
    ),
    Case(
        "Lord Howe 02:00 at the start of the spring gap moves to 02:30",
        daily(2, 0, LORD_HOWE),
        "2024-10-05 00:00",
        ("2024-10-05 15:30", "2024-10-06 15:00"),
    ),
    # ---------------------------------------------------------- Asia/Kolkata
    Case(
        "Kolkata 09:00 is 03:30 UTC all year",
        daily(9, 0, KOLKATA),
        "2024-03-09 00:00",
        ("2024-03-09 03:30", "2024-03-10 03:30", "2024-03-11 03:30"),
    ),
    Case(
        "Kolkata 02:00 falls on the previous UTC date",
        daily(2, 0, KOLKATA),
        "2024-06-30 21:00",
        ("2024-07-01 20:30", "2024-07-02 20:30"),
    ),
    Case(
        "Kolkata monthly day 31 at 23:45 in February 2024: 29 Feb",
        monthly(31, 23, 45, KOLKATA),
        "2024-02-01 00:00",
        ("2024-02-29 18:15", "2024-03-31 18:15", "2024-04-30 18:15"),
    ),
    # ---------------------------------------------------------- weekday filters
    Case(
        "NY weekdays 16:30 skip the weekend (and the DST change on Sunday)",
        daily(16, 30, NY, MON_FRI),
        "2024-03-07 22:00",
        ("2024-03-08 21:30", "2024-03-11 20:30", "2024-03-12 20:30"),
    ),
    Case(
        "UTC weekends only",
        daily(8, 0, "UTC", (5, 6)),
        "2024-03-04 00:00",
        ("2024-03-09 08:00", "2024-03-10 08:00", "2024-03-16 08:00"),
    ),
    Case(
        "the weekday is that of the local date (Monday 02:00 Kolkata is Sunday UTC)",
        daily(2, 0, KOLKATA, (calendar.MONDAY,)),
        "2024-03-01 00:00",
        ("2024-03-03 20:30", "2024-03-10 20:30"),
    ),
    Case(
        "all seven weekdays is every day",
        daily(6, 0, "UTC", range(7)),
        "2024-03-09 07:00",
        ("2024-03-10 06:00", "2024-03-11 06:00"),
    ),
    # ---------------------------------------------------------- month ends, leap years
    Case(
        "day 31 runs on each month's last day",
        monthly(31, 0, 0),
        "2024-01-01 00:00",
        ("2024-01-31 00:00", "2024-02-29 00:00", "2024-03-31 00:00", "2024-04-30 00:00"),
    ),
    Case(
        "day 29 in a common year runs on 28 February",
        monthly(29, 12, 0),
        "2023-01-30 00:00",
        ("2023-02-28 12:00", "2023-03-29 12:00"),
    ),
    Case(
        "day 29 in a leap year runs on 29 February",
        monthly(29, 12, 0),
        "2024-01-30 00:00",
        ("2024-02-29 12:00", "2024-03-29 12:00"),
    ),
    Case(
        "2100 is not a leap year, 2000 was",
        monthly(30, 0, 0),
        "2100-02-01 00:00",
        ("2100-02-28 00:00", "2100-03-30 00:00"),
    ),
    Case(
        "2000 was a leap year",
        monthly(30, 0, 0),
        "2000-02-01 00:00",
        ("2000-02-29 00:00", "2000-03-30 00:00"),
    ),
    Case(
        "monthly across the year end",
        monthly(31, 23, 59),
        "2024-12-31 23:59",
        ("2025-01-31 23:59", "2025-02-28 23:59"),
    ),
    Case(
        "monthly on the first, 03:30 UTC",
        monthly(1, 3, 30),
        "2024-01-01 03:30",
        ("2024-02-01 03:30", "2024-03-01 03:30"),
    ),
    Case(
        "monthly in New York on a spring-forward day, 02:30 -> 03:30 EDT",
        monthly(10, 2, 30, NY),
        "2024-02-15 00:00",
        ("2024-03-10 07:30", "2024-04-10 06:30"),
    ),
    # ---------------------------------------------------------- epoch-aligned intervals
    Case(
        "15 minutes on the quarter hour",
        every(timedelta(minutes=15)),
        "2024-03-10 07:07",
        ("2024-03-10 07:15", "2024-03-10 07:30", "2024-03-10 07:45"),
    ),
    Case(
        "an hour is a UTC hour, whatever the DST change in New York",
        every(3600),
        "2024-03-10 06:30",
        ("2024-03-10 07:00", "2024-03-10 08:00"),
    ),
    Case(
        "a day is 00:00 UTC",
        every(timedelta(days=1)),
        "2024-03-10 06:30",
        ("2024-03-11 00:00", "2024-03-12 00:00"),
    ),
    Case(
        "90 minutes: multiples of 5400 s since the epoch",
        every(5400),
        "2024-01-01 00:00",
        ("2024-01-01 01:30", "2024-01-01 03:00"),
    ),
    Case(
        "7 seconds: multiples of 7 since the epoch, not of the minute",
        every(7),
        datetime.fromtimestamp(1_700_000_003, UTC).strftime("%Y-%m-%d %H:%M:%S"),
        (
            datetime.fromtimestamp(1_700_000_008, UTC).strftime("%Y-%m-%d %H:%M:%S"),
            datetime.fromtimestamp(1_700_000_015, UTC).strftime("%Y-%m-%d %H:%M:%S"),
        ),
    ),
    Case(
        "sub-second intervals",
        every(0.25),
        "2024-01-01 00:00:00.100000",
        ("2024-01-01 00:00:00.250000", "2024-01-01 00:00:00.500000"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_next_occurrences(case: Case) -> None:
    got = []
    at = utc(case.after)
    for _ in case.expected:
        at = next_occurrence(case.cron, at)
        got.append(at)
    assert got == [utc(e) for e in case.expected]


@pytest.mark.parametrize("case", CASES, ids=[c.what for c in CASES])
def test_latest_and_previous_agree_with_next(case: Case) -> None:
    occurrences = [utc(e) for e in case.expected]
    for i, occurrence in enumerate(occurrences):
        assert latest_occurrence(case.cron, occurrence) == occurrence
        assert latest_occurrence(case.cron, occurrence - timedelta(microseconds=1)) < occurrence
        if i:
            assert previous_occurrence(case.cron, occurrence) == occurrences[i - 1]
            between = occurrences[i - 1] + (occurrence - occurrences[i - 1]) / 2
            assert latest_occurrence(case.cron, between) == occurrences[i - 1]
    assert latest_occurrence(case.cron, utc(case.after)) <= utc(case.after)
    assert (
        next_occurrence(case.cron, latest_occurrence(case.cron, utc(case.after)))
        == (occurrences[0])
    )


def test_results_are_utc_and_accept_any_aware_input() -> None:
    cron = daily(9, 0, NY)
    local = datetime(2024, 3, 9, 10, 0, tzinfo=cron.zone)  # 10:00 EST = 15:00 UTC
    got = next_occurrence(cron, local)
    assert got == utc("2024-03-10 13:00") and got.tzinfo is UTC
    with pytest.raises(InvalidOptions, match="timezone-aware"):
        next_occurrence(cron, datetime(2024, 3, 9))


def test_every_day_of_a_dst_year_has_exactly_one_occurrence() -> None:
    for zone in (NY, LONDON, LORD_HOWE, KOLKATA):
        for hour, minute in ((0, 0), (1, 30), (2, 0), (2, 30), (23, 59)):
            cron = daily(hour, minute, zone)
            at = utc("2023-12-31 00:00")
            local_dates = []
            while at < utc("2025-01-01 00:00"):
                at = next_occurrence(cron, at)
                local_dates.append(at.astimezone(cron.zone).date())
            days = [d for d in local_dates if d.year == 2024]
            assert len(days) == len(set(days)) == 366, (zone, hour, minute)


# ---------------------------------------------------------------- due occurrence


def test_due_occurrence() -> None:
    cron = every(60)
    now = utc("2024-05-01 12:00:30")
    assert due_occurrence(cron, None, now) == utc("2024-05-01 12:00")
    assert due_occurrence(cron, utc("2024-05-01 11:59"), now) == utc("2024-05-01 12:00")
    assert due_occurrence(cron, utc("2024-05-01 12:00"), now) is None
    # Missed occurrences are not enqueued one by one: only the latest.
    assert due_occurrence(cron, utc("2024-05-01 09:00"), now) == utc("2024-05-01 12:00")
    # A clock that went back (now before the last occurrence) finds nothing due.
    assert due_occurrence(cron, utc("2024-05-01 12:05"), now) is None


# ---------------------------------------------------------------- definitions


def test_definitions_are_canonical_text() -> None:
    assert daily(9, 5).definition == "daily 09:05 UTC"
    assert daily(16, 30, NY, [4, 0, 1, 2, 3, 0]).definition == (
        "daily 16:30 on mon,tue,wed,thu,fri America/New_York"
    )
    assert daily(6, 0, "UTC", range(7)).definition == daily(6, 0).definition
    assert monthly(31, 3, 30).definition == "monthly day 31 03:30 UTC"
    assert monthly(1, 0, 0, KOLKATA).definition == "monthly day 1 00:00 Asia/Kolkata"
    assert every(900).definition == "every 900s"
    assert every(timedelta(minutes=15)).definition == "every 900s"
    assert every(0.2).definition == "every 0.2s"


def test_weekdays_accept_ints_enums_and_iterables() -> None:
    a = DailySchedule(9, 0).weekdays(Weekday.MONDAY, Weekday.FRIDAY)
    b = DailySchedule(9, 0).weekdays([0, 4])
    c = DailySchedule(9, 0).weekdays(calendar.FRIDAY, 0)
    assert a == b == c and a.days == (Weekday.MONDAY, Weekday.FRIDAY)


def test_job_key_and_options() -> None:
    cron = every(60)
    at = utc("2024-05-01 12:00")
    opts = cron.enqueue_options_for(at)
    assert (opts.job_key, opts.job_key_mode, opts.run_at) == ("c", JobKeyMode.DEDUPE, at)

    tuned = cron.options(EnqueueOptions(priority=-5, max_attempts=3, queue_name="q"))
    opts = tuned.enqueue_options_for(at)
    assert (opts.job_key, opts.priority, opts.max_attempts, opts.queue_name) == ("c", -5, 3, "q")

    keyed = cron.options(EnqueueOptions(job_key="mine", job_key_mode=JobKeyMode.REPLACE))
    opts = keyed.enqueue_options_for(at)
    assert (opts.job_key, opts.job_key_mode) == ("mine", JobKeyMode.REPLACE)

    overlapping = cron.options(EnqueueOptions(priority=1), overlap=True)
    assert overlapping.job_key is None
    assert overlapping.enqueue_options_for(at).job_key is None
    assert cron.catch_up_on_start().catch_up and not cron.catch_up


BAD_DEFINITIONS = [
    (lambda: DailySchedule(24, 0), "hour must be an integer from 0 to 23, got 24"),
    (lambda: DailySchedule(-1, 0), "hour must be an integer from 0 to 23"),
    (lambda: DailySchedule(9, 60), "minute must be an integer from 0 to 59, got 60"),
    (lambda: DailySchedule(True, 0), "hour must be an integer"),
    (lambda: MonthlySchedule(0, 3, 30), "day must be an integer from 1 to 31, got 0"),
    (lambda: MonthlySchedule(32, 3, 30), "day must be an integer from 1 to 31, got 32"),
    (lambda: MonthlySchedule(1, 24, 0), "hour must be an integer from 0 to 23, got 24"),
    (lambda: DailySchedule(9, 0).weekdays(7), r"weekday must be an integer from 0 \(Monday\)"),
    (lambda: DailySchedule(9, 0).weekdays("mon"), "weekday must be"),  # type: ignore[arg-type]  # wrong on purpose
    (lambda: DailySchedule(9, 0).weekdays(), "at least one day"),
    (lambda: CronJob.interval("c", "j", 0), "interval must be positive"),
    (lambda: CronJob.interval("c", "j", timedelta(seconds=-5)), "interval must be positive"),
    (lambda: CronJob.interval("c", "j", float("nan")), "interval must be positive"),
    (lambda: CronJob.interval("c", "j", "60"), "interval must be a timedelta or seconds"),  # type: ignore[arg-type]  # wrong on purpose
    (
        lambda: CronJob.daily_in_timezone("c", "j", DailySchedule(9, 0), "Mars/Olympus"),
        "cron 'c': unknown time zone 'Mars/Olympus'",
    ),
    (
        lambda: CronJob.monthly_in_timezone("c", "j", MonthlySchedule(1, 0, 0), "../../etc/x"),
        "unknown time zone",
    ),
    (
        lambda: CronJob.daily_utc("c", "j", MonthlySchedule(1, 0, 0)),  # type: ignore[arg-type]
        "daily_utc takes a DailySchedule",
    ),
    (lambda: CronJob.daily_utc("no spaces", "j", DailySchedule(1, 0)), "invalid cron id"),
    (lambda: CronJob.daily_utc("c", "bad name", DailySchedule(1, 0)), "invalid job name"),
    (lambda: CronJob.interval("c", "j", 60, payload=object()), "cron 'c': "),
    (
        lambda: every(60).options(EnqueueOptions(delay=5)),
        "must not set run_at or delay",
    ),
    (
        lambda: every(60).options(EnqueueOptions(job_key="k"), overlap=True),
        "overlap=True enqueues without a job key",
    ),
]


@pytest.mark.parametrize(("build", "message"), BAD_DEFINITIONS)
def test_bad_definitions_are_refused_with_the_problem_named(build: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        build()


def test_error_types() -> None:
    with pytest.raises(InvalidName):
        CronJob.interval("", "j", 60)
    with pytest.raises(PayloadError):
        CronJob.interval("c", "j", 60, payload=object())


# ---------------------------------------------------------------- service checks (no database)

registry = Registry()


@registry.job("plain")
async def plain(job: Job) -> None:
    pass


@registry.job("needs_dict")
async def needs_dict(job: Job, payload: dict[str, int]) -> None:
    pass


def service(crons: list[Any], **config: Any) -> CronService:
    # No pool: these tests only build and plan the service, never touch the database.
    return CronService(cast(AppPool, None), registry, crons, WorkerConfig(**config))


def test_service_refuses_duplicate_ids() -> None:
    crons = [CronJob.interval("same", "plain", 60), CronJob.interval("same", "plain", 120)]
    with pytest.raises(InvalidOptions, match="duplicate cron id 'same'"):
        service(crons)


def test_service_refuses_job_names_without_handlers() -> None:
    with pytest.raises(InvalidOptions, match="cron 'x': no handler is registered for job name"):
        service([CronJob.interval("x", "nobody", 60)])


def test_service_refuses_payloads_the_handler_cannot_decode() -> None:
    with pytest.raises(InvalidOptions, match="payload does not decode"):
        service([CronJob.interval("x", "needs_dict", 60)])
    service([CronJob.interval("x", "needs_dict", 60, payload={"a": 1})])


def test_service_refuses_other_things_than_cron_jobs() -> None:
    with pytest.raises(InvalidOptions, match="item 1 is str"):
        service([CronJob.interval("x", "plain", 60), "daily at nine"])


def test_short_intervals_are_capped_to_the_poll_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="pgfleet"):
        svc = service(
            [CronJob.interval("fast", "plain", 1), CronJob.interval("slow", "plain", 60)],
            cron_poll_interval=5,
        )
    assert [c.definition for c in svc.crons] == ["every 5s", "every 60s"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "fast" in warnings[0] and "every 5s" in warnings[0]
