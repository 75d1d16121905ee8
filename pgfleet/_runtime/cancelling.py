"""Cancelling running jobs: the worker holding a job someone cancelled
(``Queue.cancel``) hears of it on the cancel channel, or from its heartbeat's
check when the notification was lost. The handler's ``cancel_requested()`` turns
true at once; an async handler still running after the cancel grace period is
cancelled. The attempt's outcome then ends the job cancelled."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable

from pgfleet._runtime.execution import JobRunner

log = logging.getLogger("pgfleet")


class CancelWatcher:
    def __init__(self, runner: JobRunner, *, grace: float) -> None:
        self._runner = runner
        self._grace = grace
        #: Cancels that reached a job this worker runs or holds (for tests).
        self.requested = 0

    def on_notification(self, payload: str) -> None:
        try:
            uid = uuid.UUID(payload)
        except ValueError:
            return
        self.request(uid)

    def request_many(self, ids: Iterable[uuid.UUID]) -> None:
        for uid in ids:
            self.request(uid)

    def request(self, uid: uuid.UUID) -> None:
        """Someone cancelled job ``uid``: act if this worker runs or holds it."""
        runner = self._runner
        state = runner.state
        if state is None or uid in state.cancelled:
            return
        task = runner.running.get(uid)
        if task is None and uid not in runner.held_ids():
            return  # not ours, or finished: its outcome decides
        state.cancelled.add(uid)
        self.requested += 1
        log.info("job %s: cancel requested while running", uid)
        if task is not None and uid not in runner.in_threads:
            asyncio.get_running_loop().call_later(self._grace, self._expire, uid, task)

    def _expire(self, uid: uuid.UUID, task: asyncio.Task[object]) -> None:
        runner = self._runner
        if runner.running.get(uid) is task and not task.done():
            log.info("job %s: cancelling its handler (cancel grace period over)", uid)
            runner.cancelling.add(uid)
            runner.cancel_task(uid, task)
