"""Stopping users without losing the request in hand.

Locust stops a user that is waiting by killing its greenlet. With no wait between
requests, the kill can land just after the user woke up and sent its next
request: the transaction commits in Postgres, but the user dies before reporting
it, so the database holds jobs Locust never counted. :class:`GracefulStop` turns
every non-forced stop into Locust's graceful one (finish the task, then stop at
the next wait), so every request sent is reported. ``--stop-timeout`` still bounds
how long Locust waits before it forces the rest.
"""

from __future__ import annotations

from typing import Any

from locust.user.users import LOCUST_STATE_STOPPING


class GracefulStop:
    """Mixin for a Locust ``User``: put it before the User class in the bases."""

    _state: Any

    def stop(self, force: bool = False) -> bool:
        if force or self._state is None:  # forced, or never started: nothing in hand
            return super().stop(force)  # type: ignore[misc,no-any-return]
        self._state = LOCUST_STATE_STOPPING
        return False
