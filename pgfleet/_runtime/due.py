"""On time: an idle claim loop sleeps until the next scheduled job it serves is
due (a delayed enqueue, a retry, a snooze), not for a whole poll interval, so
such jobs start within milliseconds of their time without faster polling."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from pgfleet.db.deadlines import Held
from pgfleet.db.store import Store

log = logging.getLogger("pgfleet")

#: Added to a due time before waking: the claim's clock must have passed it.
SLACK = 0.002


class DueTimes:
    """Asks, when the claim loop goes idle, how long until its next job is due."""

    def __init__(
        self, names: Sequence[str], queue_names: Sequence[str] | None, *, timeout: float
    ) -> None:
        self._names = list(names)
        self._queue_names = None if queue_names is None else list(queue_names)
        self._timeout = timeout
        #: Seconds until the next due job at the last check (None: none known).
        self.next_due: float | None = None
        self.checks = 0

    async def idle_wait(self, held: Held | None, poll: float) -> float:
        """How long an idle loop waits: until the next due job, at most ``poll``.
        Without a working connection (or an answer) it is ``poll``."""
        if held is None or held.closed():
            return poll
        try:
            async with asyncio.timeout(self._timeout):
                due = await Store(held.conn).job_next_due(
                    job_names=self._names, queue_names=self._queue_names
                )
        except Exception as exc:  # the next round finds out about the connection
            log.debug("next due job unknown (%s); polling", exc)
            return poll
        self.checks += 1
        self.next_due = due
        if due is None:
            return poll
        return min(poll, max(0.0, due) + SLACK)
