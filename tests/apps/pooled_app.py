"""The runtime test application plus a one-second cron schedule, for the PgBouncer
suite: one ``--app`` serves both the runtime jobs and the cron's ``tick``."""

from __future__ import annotations

from pgfleet import CronJob
from tests.apps import cron_app
from tests.apps.runtime_app import registry

registry.job("tick")(cron_app.tick)

#: Without a job key: a second enqueue of an occurrence would show as a second job.
crons = [CronJob.interval("every-second", "tick", cron_app.EVERY).options(overlap=True)]

__all__ = ["crons", "registry"]
