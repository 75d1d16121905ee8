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
from typing import Any
from uuid import UUID

from pgfleet.db import Q
from pgfleet.db.boundary import translate_errors
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
        from pgfleet import __version__

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
        pool: Any,
        identity: Identity,
        *,
        interval: float,
        lease: float,
        lead: bool,
        events: WorkerEvents,
        on_leader: Callable[[bool], None],
    ) -> None:
        super().__init__(interval)
        self._pool = pool
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
        with translate_errors("heartbeat"):
            row = await self._pool.fetchrow(
                Q.worker_heartbeat.sql,
                i.id,
                i.hostname,
                i.pid,
                i.concurrency,
                i.job_names,
                i.queue_names,
                i.version,
                self._lease,
                self._lead and not self._stop.is_set(),
            )
        if row["inserted"] and self.beats:
            log.warning(
                "worker %s had been declared dead and its jobs recovered; registered again "
                "(outcomes of jobs it was running will be discarded)",
                i.id,
            )
        if self.started_at is None:
            self.started_at = row["started_at"]
        self.beats += 1
        leader = bool(row["leader"])
        if leader != self.is_leader:
            self.is_leader = leader
            log.info("worker %s %s the fleet leadership", i.id, "took" if leader else "lost")
            self.events.leader_changed(leader)
            self._on_leader(leader)

    async def deregister(self) -> None:
        with translate_errors("deregister"):
            await self._pool.execute(Q.worker_deregister.sql, self._identity.id)
        if self.is_leader:
            self.is_leader = False
            self.events.leader_changed(False)


class Maintenance(Periodic):
    """Fleet-wide chores, run only while this worker leads."""

    name = "maintenance"

    def __init__(
        self,
        pool: Any,
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
        self._pool = pool
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
            with translate_errors("rescue"):
                rows = await self._pool.fetch(Q.job_rescue.sql, self._rescue_batch)
            jobs = [r for r in rows if r["id"] is not None]
            for r in rows:
                if r["id"] is None:
                    log.info("deregistered worker %s: its heartbeat expired", r["worker_id"])
            for r in jobs:
                log.info(
                    "recovered job %s (%s) from dead worker %s: now %s",
                    r["id"],
                    r["name"],
                    r["worker_id"],
                    r["status"],
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
            with translate_errors("prune"):
                n = int(
                    await self._pool.fetchval(
                        Q.job_prune_finished.sql, self._retention, self._prune_batch
                    )
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
        with translate_errors("vacuum check"):
            row = await self._pool.fetchrow(Q.jobs_table_health.sql)
        if row is None:
            return False
        if self._vacuum == "auto" and row["autovacuum"]:
            return False
        dead, live = int(row["dead_tuples"]), int(row["live_tuples"])
        if dead < max(self._vacuum_min_dead, live // 5):
            return False
        try:
            with translate_errors("vacuum"):
                await self._pool.execute(Q.jobs_vacuum.sql)
        except Exception as exc:
            log.warning("could not vacuum pgfleet.jobs (%s); not trying again", exc)
            self._vacuum = "never"
            return False
        self.vacuums += 1
        log.info("vacuumed pgfleet.jobs: %d dead tuples (%d live)", dead, live)
        return True
