"""crons.py: schedules. Every worker may register the same list: Postgres makes
sure each occurrence is enqueued once across the fleet."""

from datetime import timedelta

import pgfleet
from pgfleet import CronJob, DailySchedule, EnqueueOptions, Job, MonthlySchedule

registry = pgfleet.Registry()


@registry.job("sync_prices")
async def sync_prices(job: Job) -> None: ...


@registry.job("rebuild_reference_data")
async def rebuild_reference_data(job: Job) -> None: ...


@registry.job("prune_sessions")
async def prune_sessions(job: Job, payload: dict[str, int]) -> None: ...


crons = [
    # After New York markets close, Monday (0) to Friday (4), New York wall-clock time.
    CronJob.daily_in_timezone(
        "sync-prices-after-close",
        "sync_prices",
        DailySchedule(16, 30).weekdays(range(5)),
        "America/New_York",
    ),
    # The first of every month at 03:30 UTC; when the schedule is new, the latest
    # occurrence already due is enqueued at once.
    CronJob.monthly_utc(
        "rebuild-reference-data", "rebuild_reference_data", MonthlySchedule(1, 3, 30)
    ).catch_up_on_start(),
    # Every 15 minutes on the quarter hour, with a payload and enqueue options.
    CronJob.interval(
        "prune-sessions", "prune_sessions", timedelta(minutes=15), payload={"days": 30}
    ).options(EnqueueOptions(priority=10, max_attempts=1)),
]

# From the command line: pgfleet worker --app crons:registry --crons crons:crons
# In code: pgfleet.Worker(pool, registry, crons=crons)
