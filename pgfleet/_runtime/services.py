"""Background services of a worker, all of one shape: ``run_once`` does one round
(tests call it directly), ``start``/``stop`` run it on an interval.

- Heartbeat: registers the worker, renews its lease (which renews every lock it
  holds) and takes or renews the fleet leadership.

The leader's chores (rescue, prune, vacuum) have the same shape, in
``_runtime/maintenance.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from pgfleet._version import __version__
from pgfleet.db.store import Store
from pgfleet.db.types import Executor
from pgfleet.events import WorkerEvents

log = logging.getLogger("pgfleet")

#: How long ``Periodic.stop`` lets a round in progress finish before cutting it.
STOP_WAIT = 3.0


class Periodic:
    """Runs ``run_once`` every ``interval`` seconds (with a little jitter) until
    stopped. A failing round is logged and retried on the next tick."""

    name = "service"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()

    async def run_once(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._loop(), name=f"pgfleet-{self.name}"
        )

    def next_wait(self) -> float:
        """Seconds until the next round: the interval, with a little jitter."""
        return self.interval * random.uniform(0.9, 1.1)

    def kick(self) -> None:
        """Run a round now instead of waiting for the interval."""
        self._kick.set()

    async def stop(self, wait: float = STOP_WAIT) -> None:
        """Stop after the round in progress, or cut that round when it has not
        finished within ``wait`` seconds (a database that does not answer must not
        hold up a shutdown)."""
        self._stop.set()
        self._kick.set()
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=wait)
        if not done:
            log.warning("%s round still running at shutdown: cut short", self.name)
            task.cancel()
            await asyncio.wait({task})

    async def _loop(self) -> None:
        failing = False
        while not self._stop.is_set():
            # Cleared before the round, not after: a kick or a stop that comes while
            # the round runs (a chore waiting for its turn behind another) must end
            # the wait below at once, not be lost and leave stop() to cut it short.
            self._kick.clear()
            try:
                await self.run_once()
            except Exception as exc:
                # Said once per outage, not once per round.
                log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "%s round failed: %s",
                    self.name,
                    str(exc) or type(exc).__name__,
                )
                failing = True
            else:
                if failing:
                    log.info("%s rounds succeed again", self.name)
                failing = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.next_wait())


@dataclass(frozen=True, slots=True)
class Identity:
    """What a worker registers about itself."""

    id: UUID
    hostname: str
    pid: int
    concurrency: int
    job_names: list[str]
    queue_names: list[str] | None
    version: str

    @classmethod
    def new(
        cls, worker_id: UUID, concurrency: int, job_names: list[str], queue_names: list[str] | None
    ) -> Identity:
        return cls(
            worker_id,
            socket.gethostname(),
            os.getpid(),
            concurrency,
            job_names,
            queue_names,
            __version__,
        )


class Heartbeat(Periodic):
    name = "heartbeat"

    def __init__(
        self,
        pool: Executor,
        identity: Identity,
        *,
        interval: float,
        lease: float,
        lead: bool,
        events: WorkerEvents,
        on_leader: Callable[[bool], None],
        on_cancels: Callable[[list[UUID]], None] | None = None,
    ) -> None:
        super().__init__(interval)
        self._store = Store(pool)
        self._identity = identity
        #: Given the running jobs of this worker someone asked to cancel, after
        #: each beat: the fallback of lost cancel notifications.
        self._on_cancels = on_cancels
        self._lease = lease
        self._lead = lead
        self.events = events
        self._on_leader = on_leader
        self.is_leader = False
        self.started_at: datetime | None = None
        self.beats = 0

    async def run_once(self) -> None:
        i = self._identity
        beat = await self._store.worker_heartbeat(
            id=i.id,
            hostname=i.hostname,
            pid=i.pid,
            concurrency=i.concurrency,
            job_names=i.job_names,
            queue_names=i.queue_names,
            version=i.version,
            lease_seconds=self._lease,
            lead=self._lead and not self._stop.is_set(),
        )
        if beat.inserted and self.beats:
            log.warning(
                "worker %s had been declared dead and its jobs recovered; registered again "
                "(outcomes of jobs it was running will be discarded)",
                i.id,
            )
        if self.started_at is None:
            self.started_at = beat.started_at
        self.beats += 1
        leader = beat.leader
        if leader != self.is_leader:
            self.is_leader = leader
            log.info("worker %s %s the fleet leadership", i.id, "took" if leader else "lost")
            self.events.leader_changed(leader)
            self._on_leader(leader)
        if self._on_cancels is not None:
            cancels = await self._store.job_cancels_of_worker(worker_id=i.id)
            if cancels:
                self._on_cancels(cancels)

    async def deregister(self) -> None:
        await self._store.worker_deregister(worker_id=self._identity.id)
        if self.is_leader:
            self.is_leader = False
            self.events.leader_changed(False)
