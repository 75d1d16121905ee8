"""Background services of a worker, all of one shape: ``run_once`` does one round
(tests call it directly), ``start``/``stop`` run it on an interval.

- Heartbeat: registers the worker, renews its lease (which renews every lock it
  holds) and takes or renews the fleet leadership.
- Maintenance (leader only): rescues jobs of dead workers, prunes finished jobs and
  vacuums the jobs table when nothing else does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
from collections.abc import Awaitable, Callable
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
            self._kick.clear()
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
    ) -> None:
        super().__init__(interval)
        self._store = Store(pool)
        self._identity = identity
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

    async def deregister(self) -> None:
        await self._store.worker_deregister(worker_id=self._identity.id)
        if self.is_leader:
            self.is_leader = False
            self.events.leader_changed(False)


class Maintenance(Periodic):
    """Fleet-wide chores, run only while this worker leads."""

    name = "maintenance"

    def __init__(
        self,
        pool: Executor,
        *,
        interval: float,
        is_leader: Callable[[], bool],
        retention: float | None,
        prune_interval: float,
        prune_batch_size: int,
        rescue_batch_size: int,
        vacuum: str,
        vacuum_interval: float,
        vacuum_min_dead: int,
        events: WorkerEvents,
        wake: Callable[[], Awaitable[None]],
        clock: Callable[[], float],
    ) -> None:
        super().__init__(interval)
        self._store = Store(pool)
        self._is_leader = is_leader
        self._retention = retention
        self._prune_interval = prune_interval
        self._prune_batch = prune_batch_size
        self._rescue_batch = rescue_batch_size
        self.events = events
        self._wake = wake
        self._clock = clock
        self._last_prune = float("-inf")
        self._vacuum = vacuum
        self._vacuum_interval = vacuum_interval
        self._vacuum_min_dead = vacuum_min_dead
        self._last_vacuum_check = float("-inf")
        self.rescued = 0
        self.pruned = 0
        self.vacuums = 0

    async def run_once(self) -> None:
        if not self._is_leader():
            return
        await self.rescue()
        now = self._clock()
        if self._retention is not None and now - self._last_prune >= self._prune_interval:
            self._last_prune = now
            await self.prune()
        if self._vacuum != "never" and now - self._last_vacuum_check >= self._vacuum_interval:
            self._last_vacuum_check = now
            await self.vacuum_if_needed()

    async def rescue(self) -> int:
        """Recover the jobs of workers whose heartbeat expired."""
        total = 0
        while True:
            rows = await self._store.job_rescue(limit=self._rescue_batch)
            jobs = [r for r in rows if r.job_id is not None]
            for r in rows:
                if r.job_id is None:
                    log.info("deregistered worker %s: its heartbeat expired", r.worker_id)
            for r in jobs:
                log.info(
                    "recovered job %s (%s) from dead worker %s: now %s",
                    r.job_id,
                    r.name,
                    r.worker_id,
                    r.status,
                )
            total += len(jobs)
            if len(jobs) < self._rescue_batch:
                break
        if total:
            self.rescued += total
            self.events.jobs_rescued(total)
            await self._wake()
        return total

    async def prune(self) -> int:
        """Delete finished jobs older than the retention, a bounded batch at a time."""
        assert self._retention is not None
        total = 0
        for _ in range(100):  # at most 100 batches per round; the next round goes on
            n = await self._store.job_prune_finished(
                older_than_seconds=self._retention, batch_size=self._prune_batch
            )
            total += n
            if n < self._prune_batch:
                break
        if total:
            self.pruned += total
            log.info("pruned %d finished jobs older than %.0fs", total, self._retention)
        return total

    async def vacuum_if_needed(self) -> bool:
        """VACUUM (ANALYZE) the jobs table when it carries many dead tuples and
        nothing else will clean them: autovacuum is off (``vacuum="auto"``), or
        always (``vacuum="always"``). A queue rewrites every row it holds twice, so
        without vacuum its dead tuples and index bloat grow without bound."""
        health = await self._store.jobs_table_health()
        if health is None:
            return False
        if self._vacuum == "auto" and health.autovacuum:
            return False
        dead, live = health.dead_tuples, health.live_tuples
        if dead < max(self._vacuum_min_dead, live // 5):
            return False
        try:
            await self._store.jobs_vacuum()
        except Exception as exc:
            log.warning("could not vacuum pgfleet.jobs (%s); not trying again", exc)
            self._vacuum = "never"
            return False
        self.vacuums += 1
        log.info("vacuumed pgfleet.jobs: %d dead tuples (%d live)", dead, live)
        return True
