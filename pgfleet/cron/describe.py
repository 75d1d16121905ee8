"""Schedules back from their stored definitions, for the console's cron page.

``pgfleet.crons`` keeps each schedule's canonical text (:attr:`CronJob.definition`);
reading it back lets the console show every schedule's zone and next occurrences
without loading the application that defined it.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from pgfleet.cron.occurrences import next_occurrence
from pgfleet.cron.schedules import CronJob, DailySchedule, MonthlySchedule, Weekday

_EVERY = re.compile(r"every (\d+)(?:\.(\d{1,6}))?s")
_DAILY = re.compile(r"daily (\d\d):(\d\d)(?: on ([a-z,]+))? (\S+)")
_MONTHLY = re.compile(r"monthly day (\d{1,2}) (\d\d):(\d\d) (\S+)")
_DAYS = {d.short: d for d in Weekday}


def parse_definition(cron_id: str, job_name: str, definition: str) -> CronJob:
    """The :class:`CronJob` whose definition text is ``definition``.

    Raises ValueError for text no pgfleet version writes, and InvalidOptions (a
    ValueError too) for an unknown time zone."""
    if m := _EVERY.fullmatch(definition):
        micros = int((m.group(2) or "0").ljust(6, "0"))
        return CronJob.interval(
            cron_id, job_name, timedelta(seconds=int(m.group(1)), microseconds=micros)
        )
    if m := _DAILY.fullmatch(definition):
        schedule = DailySchedule(int(m.group(1)), int(m.group(2)))
        if m.group(3):
            try:
                days = [_DAYS[d] for d in m.group(3).split(",")]
            except KeyError:
                raise ValueError(f"unknown weekday in {definition!r}") from None
            schedule = schedule.weekdays(days)
        return CronJob.daily_in_timezone(cron_id, job_name, schedule, m.group(4))
    if m := _MONTHLY.fullmatch(definition):
        monthly = MonthlySchedule(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        return CronJob.monthly_in_timezone(cron_id, job_name, monthly, m.group(4))
    raise ValueError(f"unrecognised schedule definition {definition!r}")


def next_occurrences(cron: CronJob, after: datetime, count: int) -> list[datetime]:
    out: list[datetime] = []
    at = after
    for _ in range(count):
        at = next_occurrence(cron, at)
        out.append(at)
    return out
