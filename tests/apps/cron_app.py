"""A worker application for the cron acceptance tests.

``crons`` is the list every worker process registers. The ``bad_*`` callables each
build a list that must stop a worker at startup (``--crons`` calls a callable).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pgfleet import CronJob, DailySchedule, Job, MonthlySchedule, Registry

registry = Registry()

#: Every schedule's interval; the tests read it to compute the slots.
EVERY = timedelta(seconds=1)


@registry.job("tick")
async def tick(job: Job) -> None:
    """Nothing to do: the tests count the jobs the schedules enqueued."""


crons = [
    # Without a job key: any second enqueue of an occurrence would show as a
    # second job, and a skipped occurrence as a gap.
    CronJob.interval("every-second", "tick", EVERY).options(overlap=True),
    # The default: keyed by the schedule id.
    CronJob.interval("every-second-keyed", "tick", EVERY),
]


def bad_zone() -> list[Any]:
    return [CronJob.daily_in_timezone("report", "tick", DailySchedule(9, 0), "Mars/Olympus")]


def bad_hour() -> list[Any]:
    return [CronJob.daily_utc("report", "tick", DailySchedule(24, 0))]


def bad_day() -> list[Any]:
    return [CronJob.monthly_utc("report", "tick", MonthlySchedule(0, 3, 30))]


def duplicate_ids() -> list[Any]:
    return [CronJob.interval("twice", "tick", 60), CronJob.interval("twice", "tick", 120)]


def no_handler() -> list[Any]:
    return [CronJob.interval("report", "send_report", 60)]
