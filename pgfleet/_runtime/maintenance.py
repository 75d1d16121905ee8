"""The fleet's chores, each a ``Periodic`` service that acts only while this worker
leads: the Rescuer recovers the jobs of dead workers, the Pruner deletes finished
jobs past their retention, the Vacuumer vacuums the jobs table when nothing else
does.

They take turns on one lock, so that together they hold at most one connection of
the pool (the heartbeat's must never wait behind a long prune).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pgfleet._runtime.services import Periodic
from pgfleet.db.store import Store
from pgfleet.db.types import Executor
from pgfleet.events import WorkerEvents

log = logging.getLogger("pgfleet")

#: Most batches one prune round deletes; the next round goes on.
PRUNE_ROUND_BATCHES = 100


class Chore(Periodic):
    """A leader-only Periodic: ``run_once`` does nothing on a follower."""

    def __init__(
        self,
        pool: Executor,
        *,
        interval: float,
        is_leader: Callable[[], bool],
        turn: asyncio.Lock,
    ) -> None:
        super().__init__(interval)
        self._store = Store(pool)
        self._is_leader = is_leader
        self._turn = turn

    async def run_once(self) -> None:
        if not self._is_leader():
            return
        async with self._turn:
            await self.chore()

    async def chore(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class Rescuer(Chore):
    """Requeues (or buries, out of attempts) the jobs of workers whose heartbeat
    expired, and deregisters those workers."""

    name = "rescue"

    def __init__(
        self,
        pool: Executor,
        *,
        interval: float,
        is_leader: Callable[[], bool],
        turn: asyncio.Lock,
        batch_size: int,
        events: WorkerEvents,
        wake: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(pool, interval=interval, is_leader=is_leader, turn=turn)
        self._batch = batch_size
        self.events = events
        self._wake = wake
        self.rescued = 0

    async def chore(self) -> None:
        await self.rescue()

    async def rescue(self) -> int:
        """Recover the jobs of workers whose heartbeat expired; how many."""
        total = 0
        while True:
            rows = await self._store.job_rescue(limit=self._batch)
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
            if len(jobs) < self._batch:
                break
        if total:
            self.rescued += total
            self.events.jobs_rescued(total)
            await self._wake()
        return total


class Pruner(Chore):
    """Deletes finished jobs older than the retention, a bounded batch at a time."""

    name = "prune"

    def __init__(
        self,
        pool: Executor,
        *,
        interval: float,
        is_leader: Callable[[], bool],
        turn: asyncio.Lock,
        retention: float,
        batch_size: int,
    ) -> None:
        super().__init__(pool, interval=interval, is_leader=is_leader, turn=turn)
        self._retention = retention
        self._batch = batch_size
        self.pruned = 0

    async def chore(self) -> None:
        await self.prune()

    async def prune(self) -> int:
        """One round: at most PRUNE_ROUND_BATCHES batches; how many were deleted."""
        total = 0
        for _ in range(PRUNE_ROUND_BATCHES):
            n = await self._store.job_prune_finished(
                older_than_seconds=self._retention, batch_size=self._batch
            )
            total += n
            if n < self._batch:
                break
        if total:
            self.pruned += total
            log.info("pruned %d finished jobs older than %.0fs", total, self._retention)
        return total


class Vacuumer(Chore):
    """VACUUM (ANALYZE) the jobs table when it carries many dead tuples and nothing
    else will clean them: autovacuum is off (``mode="auto"``), or always
    (``mode="always"``). A queue rewrites every row it holds twice, so without
    vacuum its dead tuples and index bloat grow without bound."""

    name = "vacuum"

    def __init__(
        self,
        pool: Executor,
        *,
        interval: float,
        is_leader: Callable[[], bool],
        turn: asyncio.Lock,
        mode: str,
        min_dead_tuples: int,
    ) -> None:
        super().__init__(pool, interval=interval, is_leader=is_leader, turn=turn)
        self.mode = mode
        self._min_dead = min_dead_tuples
        self.vacuums = 0

    async def chore(self) -> None:
        if self.mode != "never":
            await self.vacuum_if_needed()

    async def vacuum_if_needed(self) -> bool:
        health = await self._store.jobs_table_health()
        if health is None:
            return False
        if self.mode == "auto" and health.autovacuum:
            return False
        dead, live = health.dead_tuples, health.live_tuples
        if dead < max(self._min_dead, live // 5):
            return False
        try:
            await self._store.jobs_vacuum()
        except Exception as exc:
            log.warning("could not vacuum pgfleet.jobs (%s); not trying again", exc)
            self.mode = "never"
            return False
        self.vacuums += 1
        log.info("vacuumed pgfleet.jobs: %d dead tuples (%d live)", dead, live)
        return True
