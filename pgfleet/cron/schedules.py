"""Cron schedules: daily, monthly and interval jobs, enqueued once per occurrence
across the whole fleet.

Every worker may run the same list of :class:`CronJob`. Each schedule has a row in
``pgfleet.crons`` holding the latest occurrence handed out; a worker enqueues an
occurrence only in the transaction that moves that row's ``last_occurrence``
forward to it (a compare-and-set), so each (schedule, occurrence) is enqueued by
exactly one worker, and a worker whose clock lags can never enqueue an occurrence
again. Time is the database's ``now()``.

This module holds the public schedule types. Occurrences are pure functions of the
schedule and a point in time, in :mod:`pgfleet.cron.occurrences`; the worker's runner
that hands them out is :mod:`pgfleet.cron.runner`. The rules:

- Daily and monthly schedules are wall-clock times in UTC or an IANA time zone. A
  local time skipped by a forward daylight-saving transition moves forward by the
  gap (02:30 on a New York spring-forward day runs at 03:30 EDT); a local time
  repeated by a backward transition runs once, at the earlier instant.
- A monthly day the month lacks runs on the month's last day: day 31 runs on
  30 April and on 28 or 29 February; day 29 runs on 28 February in common years.
- Interval schedules are multiples of the interval since the Unix epoch (UTC) and
  ignore time zones: every 15 minutes runs at :00, :15, :30 and :45.
"""

from __future__ import annotations

import calendar
import dataclasses
import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgfleet.errors import InvalidOptions, PayloadError
from pgfleet.jobs import EnqueueOptions, JobKeyMode, validate_name
from pgfleet.payloads import encode_payload

__all__ = [
    "CronJob",
    "DailySchedule",
    "MonthlySchedule",
    "Schedule",
    "Weekday",
]

_RESOLUTION = timedelta(microseconds=1)


class Weekday(enum.IntEnum):
    """Days of the week, numbered like :meth:`datetime.date.weekday` (Monday is 0).

    :meth:`DailySchedule.weekdays` takes these or the plain integers 0-6 (so
    ``calendar.MONDAY`` ... ``calendar.SUNDAY`` work too).
    """

    MONDAY = 0
    TUESDAY = 1
    WEDNESDAY = 2
    THURSDAY = 3
    FRIDAY = 4
    SATURDAY = 5
    SUNDAY = 6

    @property
    def short(self) -> str:
        return self.name[:3].lower()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(value: object, what: str, low: int, high: int) -> None:
    if not _is_int(value) or not low <= value <= high:  # type: ignore[operator]
        raise InvalidOptions(f"{what} must be an integer from {low} to {high}, got {value!r}")


def _weekday(value: object) -> Weekday:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 6:
        raise InvalidOptions(
            f"weekday must be an integer from 0 (Monday) to 6 (Sunday) or a "
            f"pgfleet.Weekday, got {value!r}"
        )
    return Weekday(value)


@dataclass(frozen=True, slots=True)
class DailySchedule:
    """Every day (or on chosen weekdays) at ``hour``:``minute`` local time."""

    hour: int
    minute: int
    #: The weekdays it runs on, in order; None means every day.
    days: tuple[Weekday, ...] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _check_range(self.hour, "DailySchedule hour", 0, 23)
        _check_range(self.minute, "DailySchedule minute", 0, 59)
        if self.days is not None:
            days = tuple(sorted({_weekday(d) for d in self.days}))
            if not days:
                raise InvalidOptions("weekdays must name at least one day")
            object.__setattr__(self, "days", None if len(days) == 7 else days)

    def weekdays(self, *days: int | Iterable[int]) -> DailySchedule:
        """The same time, only on ``days``: integers 0 (Monday) to 6 (Sunday) or
        :class:`Weekday` values, given one by one or as an iterable. The weekday is
        the one of the local date in the schedule's time zone."""
        flat: list[object] = []
        for d in days:
            if isinstance(d, Iterable) and not isinstance(d, str | bytes):
                flat.extend(d)
            else:
                flat.append(d)
        if not flat:
            raise InvalidOptions("weekdays must name at least one day")
        return DailySchedule(self.hour, self.minute, days=tuple(_weekday(d) for d in flat))

    def runs_on(self, day: date) -> bool:
        return self.days is None or day.weekday() in self.days

    def describe(self) -> str:
        text = f"daily {self.hour:02d}:{self.minute:02d}"
        if self.days is not None:
            text += " on " + ",".join(d.short for d in self.days)
        return text


@dataclass(frozen=True, slots=True)
class MonthlySchedule:
    """Every month on ``day`` at ``hour``:``minute`` local time.

    A day the month lacks (29-31) runs on the month's last day instead: day 31
    runs on 30 April, and on 28 February (29 in leap years).
    """

    day: int
    hour: int
    minute: int

    def __post_init__(self) -> None:
        _check_range(self.day, "MonthlySchedule day", 1, 31)
        _check_range(self.hour, "MonthlySchedule hour", 0, 23)
        _check_range(self.minute, "MonthlySchedule minute", 0, 59)

    def day_in(self, year: int, month: int) -> date:
        """The date this schedule runs on in that month (clamped to its last day)."""
        return date(year, month, min(self.day, calendar.monthrange(year, month)[1]))

    def describe(self) -> str:
        return f"monthly day {self.day} {self.hour:02d}:{self.minute:02d}"


Schedule = DailySchedule | MonthlySchedule | timedelta


def _zone(cron_id: str, name: str) -> tzinfo:
    if name == "UTC":
        return UTC
    if not isinstance(name, str) or not name:
        raise InvalidOptions(f"cron {cron_id!r}: time zone must be an IANA name, got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidOptions(
            f"cron {cron_id!r}: unknown time zone {name!r}: use an IANA name such as "
            "'America/New_York' (the tzdata package provides the database where the "
            "system has none)"
        ) from None


def seconds_text(step: timedelta) -> str:
    """An interval as the schedule definitions write it (``90s``, ``0.5s``)."""
    seconds, micros = divmod(step // _RESOLUTION, 1_000_000)
    if not micros:
        return f"{seconds}s"
    return f"{seconds}.{micros:06d}".rstrip("0") + "s"


@dataclass(frozen=True, slots=True)
class CronJob:
    """A schedule that enqueues job ``job_name`` at each occurrence.

    Build one with :meth:`daily_utc`, :meth:`daily_in_timezone`,
    :meth:`monthly_utc`, :meth:`monthly_in_timezone` or :meth:`interval`.

    ``id`` names the schedule's occurrence slots in the database: keep it stable
    across releases (changing it starts a new schedule). ``job_name`` selects the
    handler; one handler can back several schedules. Each enqueued job runs
    ``job_name`` with ``payload``, its ``run_at`` is the occurrence, and its
    ``job_key`` is ``id`` (:attr:`JobKeyMode.DEDUPE`): while the job of an earlier
    occurrence is still queued or running, a new occurrence enqueues nothing.
    See :meth:`options` to change that.
    """

    id: str
    job_name: str
    schedule: Schedule
    #: IANA zone name of daily/monthly schedules ("UTC" for the *_utc ones);
    #: None for interval schedules.
    timezone: str | None = "UTC"
    payload: Any = None
    #: Enqueue the latest due occurrence when the schedule is first recorded.
    catch_up: bool = False
    enqueue_options: EnqueueOptions | None = None
    #: Enqueue without a job key, so occurrences may run concurrently.
    overlap: bool = False
    zone: tzinfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_name(self.id, "cron id")
        validate_name(self.job_name, "job name")
        schedule = self.schedule
        if isinstance(schedule, timedelta):
            if schedule <= timedelta(0):
                raise InvalidOptions(f"cron {self.id!r}: interval must be positive, got {schedule}")
            if schedule < timedelta(milliseconds=1):
                raise InvalidOptions(f"cron {self.id!r}: interval must be at least 1 ms")
            object.__setattr__(self, "timezone", None)
            object.__setattr__(self, "zone", UTC)
        elif isinstance(schedule, DailySchedule | MonthlySchedule):
            tz = self.timezone if self.timezone is not None else "UTC"
            object.__setattr__(self, "timezone", tz)
            object.__setattr__(self, "zone", _zone(self.id, tz))
        else:
            raise InvalidOptions(
                f"cron {self.id!r}: schedule must be a DailySchedule, MonthlySchedule or "
                f"timedelta, got {type(schedule).__name__}"
            )
        try:
            encode_payload(self.payload)
        except PayloadError as exc:
            raise PayloadError(f"cron {self.id!r}: {exc}") from None
        if not isinstance(self.catch_up, bool) or not isinstance(self.overlap, bool):
            raise InvalidOptions(f"cron {self.id!r}: catch_up and overlap must be booleans")
        opts = self.enqueue_options
        if opts is not None:
            if not isinstance(opts, EnqueueOptions):
                raise InvalidOptions(
                    f"cron {self.id!r}: options must be EnqueueOptions, got {type(opts).__name__}"
                )
            if opts.run_at is not None or opts.delay is not None:
                raise InvalidOptions(
                    f"cron {self.id!r}: options must not set run_at or delay: a cron job "
                    "runs at its occurrence"
                )
            if self.overlap and opts.job_key is not None:
                raise InvalidOptions(
                    f"cron {self.id!r}: overlap=True enqueues without a job key; "
                    f"do not also pass job_key {opts.job_key!r}"
                )

    # ------------------------------------------------------------ constructors

    @classmethod
    def daily_utc(
        cls, id: str, job_name: str, schedule: DailySchedule, *, payload: Any = None
    ) -> CronJob:
        """Every day (or on ``schedule``'s weekdays) at its time in UTC."""
        _expect(id, schedule, DailySchedule, "daily_utc")
        return cls(id, job_name, schedule, "UTC", payload)

    @classmethod
    def daily_in_timezone(
        cls,
        id: str,
        job_name: str,
        schedule: DailySchedule,
        timezone: str,
        *,
        payload: Any = None,
    ) -> CronJob:
        """Every day (or on ``schedule``'s weekdays) at its wall-clock time in the
        IANA zone ``timezone`` (an unknown zone raises InvalidOptions)."""
        _expect(id, schedule, DailySchedule, "daily_in_timezone")
        return cls(id, job_name, schedule, timezone, payload)

    @classmethod
    def monthly_utc(
        cls, id: str, job_name: str, schedule: MonthlySchedule, *, payload: Any = None
    ) -> CronJob:
        """Every month on ``schedule``'s day and time in UTC."""
        _expect(id, schedule, MonthlySchedule, "monthly_utc")
        return cls(id, job_name, schedule, "UTC", payload)

    @classmethod
    def monthly_in_timezone(
        cls,
        id: str,
        job_name: str,
        schedule: MonthlySchedule,
        timezone: str,
        *,
        payload: Any = None,
    ) -> CronJob:
        """Every month on ``schedule``'s day and wall-clock time in ``timezone``."""
        _expect(id, schedule, MonthlySchedule, "monthly_in_timezone")
        return cls(id, job_name, schedule, timezone, payload)

    @classmethod
    def interval(
        cls, id: str, job_name: str, every: timedelta | float, *, payload: Any = None
    ) -> CronJob:
        """Every ``every`` (a timedelta or seconds), at multiples of it since the
        Unix epoch: no time zone, no daylight saving."""
        if isinstance(every, bool) or not isinstance(every, timedelta | int | float):
            raise InvalidOptions(
                f"cron {id!r}: interval must be a timedelta or seconds, got {every!r}"
            )
        if not isinstance(every, timedelta):
            if not math.isfinite(every) or every <= 0:
                raise InvalidOptions(f"cron {id!r}: interval must be positive, got {every!r}")
            every = timedelta(seconds=every)
        return cls(id, job_name, every, None, payload)

    # ------------------------------------------------------------ modifiers

    def catch_up_on_start(self) -> CronJob:
        """When the schedule is first recorded, enqueue its latest due occurrence
        instead of waiting for the next one."""
        return dataclasses.replace(self, catch_up=True)

    def options(self, options: EnqueueOptions | None = None, *, overlap: bool = False) -> CronJob:
        """Enqueue options for this schedule's jobs.

        ``priority``, ``max_attempts`` and ``queue_name`` apply to every job.
        ``job_key`` replaces the schedule id as the jobs' key and ``job_key_mode``
        applies to it (the default key is the schedule id, mode DEDUPE).
        ``overlap=True`` enqueues without any key, so an occurrence is enqueued even
        while earlier ones are still queued or running. ``run_at`` and ``delay`` are
        refused: a cron job runs at its occurrence.
        """
        return dataclasses.replace(self, enqueue_options=options, overlap=overlap)

    # ------------------------------------------------------------ derived

    @property
    def definition(self) -> str:
        """Canonical text of the schedule, stored to detect a changed definition."""
        schedule = self.schedule
        if isinstance(schedule, timedelta):
            return f"every {seconds_text(schedule)}"
        return f"{schedule.describe()} {self.timezone}"

    @property
    def job_key(self) -> str | None:
        """The key its jobs carry (None with overlap)."""
        if self.overlap:
            return None
        opts = self.enqueue_options
        if opts is not None and opts.job_key is not None:
            return opts.job_key
        return self.id

    def enqueue_options_for(self, occurrence: datetime) -> EnqueueOptions:
        """The options of the job enqueued for ``occurrence``."""
        opts = self.enqueue_options or EnqueueOptions()
        key = self.job_key
        return dataclasses.replace(
            opts,
            run_at=occurrence,
            job_key=key,
            job_key_mode=opts.job_key_mode if key is not None else JobKeyMode.DEDUPE,
        )


def _expect(cron_id: str, schedule: object, kind: type, constructor: str) -> None:
    if not isinstance(schedule, kind):
        raise InvalidOptions(
            f"cron {cron_id!r}: {constructor} takes a {kind.__name__}, "
            f"got {type(schedule).__name__}"
        )
