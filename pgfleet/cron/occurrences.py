"""When cron schedules occur: pure functions of a :class:`~pgfleet.cron.CronJob` and
a point in time, in UTC (the rules are in :mod:`pgfleet.cron`'s docstring).

Kept apart from the schedule types so that the runner, the console and tests use
them without any database code.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta, tzinfo

from pgfleet.cron.schedules import CronJob, DailySchedule, MonthlySchedule
from pgfleet.errors import InvalidOptions

__all__ = [
    "EPOCH",
    "aware",
    "due_occurrence",
    "latest_occurrence",
    "next_occurrence",
    "previous_occurrence",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RESOLUTION = timedelta(microseconds=1)


def aware(value: datetime, what: str) -> datetime:
    """``value`` in UTC; InvalidOptions naming ``what`` when it has no time zone."""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidOptions(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _at(day: date, hour: int, minute: int, zone: tzinfo) -> datetime:
    """The instant of a local wall-clock time (UTC).

    ``fold=0`` gives the usual daylight-saving rules: a time in a forward gap takes the offset from
    before the transition, so it lands after the gap, moved forward by its length;
    a repeated time resolves to its first (earlier) instant.
    """
    local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone, fold=0)
    return local.astimezone(UTC)


def _candidates(cron: CronJob, around: datetime, forward: bool) -> Iterable[datetime]:
    """Occurrences near ``around``, in time order (backwards unless ``forward``),
    starting early or late enough to contain the answer."""
    schedule = cron.schedule
    zone = cron.zone
    local = around.astimezone(zone).date()
    if isinstance(schedule, DailySchedule):
        # A weekday filter skips at most six days; one more on each side covers
        # offsets and transitions that move a time across midnight.
        steps = range(-1, 10) if forward else range(1, -10, -1)
        for k in steps:
            day = local + timedelta(days=k)
            if schedule.runs_on(day):
                yield _at(day, schedule.hour, schedule.minute, zone)
    elif isinstance(schedule, MonthlySchedule):
        index = local.year * 12 + local.month - 1
        offsets = range(-1, 3) if forward else range(1, -3, -1)
        for k in offsets:
            year, month0 = divmod(index + k, 12)
            yield _at(schedule.day_in(year, month0 + 1), schedule.hour, schedule.minute, zone)
    else:  # pragma: no cover - intervals are computed directly
        raise AssertionError(schedule)


def latest_occurrence(cron: CronJob, at: datetime) -> datetime:
    """The latest occurrence of ``cron`` at or before ``at`` (in UTC)."""
    at = aware(at, "at")
    schedule = cron.schedule
    if isinstance(schedule, timedelta):
        return EPOCH + ((at - EPOCH) // schedule) * schedule
    for candidate in _candidates(cron, at, forward=False):
        if candidate <= at:
            return candidate
    raise AssertionError(
        f"no occurrence of {cron.definition} found before {at}"
    )  # pragma: no cover


def next_occurrence(cron: CronJob, after: datetime) -> datetime:
    """The first occurrence of ``cron`` strictly after ``after`` (in UTC)."""
    after = aware(after, "after")
    schedule = cron.schedule
    if isinstance(schedule, timedelta):
        return latest_occurrence(cron, after) + schedule
    for candidate in _candidates(cron, after, forward=True):
        if candidate > after:
            return candidate
    raise AssertionError(
        f"no occurrence of {cron.definition} found after {after}"
    )  # pragma: no cover


def due_occurrence(cron: CronJob, last: datetime | None, now: datetime) -> datetime | None:
    """The occurrence to enqueue at ``now`` when ``last`` is the latest one already
    handed out: the latest occurrence at or before ``now`` if it is later than
    ``last``, else None. Occurrences missed in between (no worker was running) are
    not enqueued one by one: only the latest is.
    """
    latest = latest_occurrence(cron, now)
    if last is not None and latest <= aware(last, "last"):
        return None
    return latest


def previous_occurrence(cron: CronJob, occurrence: datetime) -> datetime:
    """The occurrence before ``occurrence`` (strictly earlier)."""
    return latest_occurrence(cron, aware(occurrence, "occurrence") - _RESOLUTION)
