"""Cron: schedules declared in code, enqueued once per occurrence across the fleet.

- :mod:`pgfleet.cron.schedules`: the public schedule types (``CronJob``, ...) and
  their validation;
- :mod:`pgfleet.cron.occurrences`: when a schedule occurs (pure functions: time
  zones, daylight saving);
- :mod:`pgfleet.cron.runner`: the worker service that hands out each occurrence once;
- :mod:`pgfleet.cron.describe`: schedules read back from their stored definitions
  (the console's cron page).
"""

from pgfleet.cron.schedules import CronJob, DailySchedule, MonthlySchedule, Schedule, Weekday

__all__ = ["CronJob", "DailySchedule", "MonthlySchedule", "Schedule", "Weekday"]
