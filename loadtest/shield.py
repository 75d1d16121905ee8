"""Stopping users without losing the request in hand.

Locust stops a user that is waiting by killing its greenlet. With no wait between
requests, the kill can land just after the user woke up and sent its next
request: the transaction commits in Postgres, but the user dies before reporting
it, so the database holds jobs Locust never counted. :class:`GracefulStop` turns
every non-forced stop into Locust's graceful one (finish the task, then stop at
the next wait), so every request sent is reported. ``--stop-timeout`` still bounds
how long Locust waits before it forces the rest. :func:`stop_spent` is the other
way a user ends: its ``--total-jobs`` budget is spent.
"""

from __future__ import annotations

from typing import Any, NoReturn

import gevent
from locust.exception import StopUser
from locust.user.task import LOCUST_STATE_STOPPING

from loadtest.users import Budget


class GracefulStop:
    """Mixin for a Locust ``User``: put it before the User class in the bases."""

    _state: Any

    def stop(self, force: bool = False) -> bool:
        if force or self._state is None:  # forced, or never started: nothing in hand
            return super().stop(force)  # type: ignore[misc,no-any-return]
        self._state = LOCUST_STATE_STOPPING
        return False


def stop_spent(user: Any, budget: Budget) -> NoReturn:
    """The job budget is spent: stop ``user``, and the run with the last user."""
    budget.active -= 1
    if budget.active == 0 and user.environment.runner is not None:
        gevent.spawn(user.environment.runner.quit)
    raise StopUser()
