"""The fleet's chores, each a ``Periodic`` service that acts only while this worker
leads: the Rescuer recovers the jobs of dead workers, the Historian moves finished
jobs to their history and drops its days past the retention, the Pruner deletes
finished jobs past their retention that stayed in the jobs table, the Vacuumer
vacuums the jobs table when dead tuples pile up (on its period, and between the
Historian's batches: moving a batch leaves as many dead tuples).

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
#: Most batches one history round moves (batches of prune_batch_size).
HISTORY_ROUND_BATCHES = 300
#: Days of history partitions the leader keeps created ahead of today.
HISTORY_DAYS_AHEAD = 7
#: A table autovacuum covers is vacuumed by the leader too once its dead tuples pass
#: this many times the leader's own threshold: autovacuum fell behind (it visits a
#: database once per ``autovacuum_naptime``, a minute by default, while a busy queue
#: leaves tens of thousands of dead tuples a second).
AUTOVACUUM_BEHIND = 4


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


class Historian(Chore):
    """Keeps the jobs table small: moves jobs finished longer ago than
    ``move_after`` to ``pgfleet.jobs_history`` (a batch per statement), creates its
    day partitions ahead (from the oldest day still to move, so a leader back after
    a week offline covers the week too), and drops whole days past the retention.

    Each round prepares partitions first, so a job moved at midnight has its day."""

    name = "history"

    def __init__(
        self,
        pool: Executor,
        *,
        interval: float,
        is_leader: Callable[[], bool],
        turn: asyncio.Lock,
        move_after: float,
        retention: float | None,
        batch_size: int,
        days_ahead: int = HISTORY_DAYS_AHEAD,
        between_batches: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        super().__init__(pool, interval=interval, is_leader=is_leader, turn=turn)
        self._between = between_batches
        self._move_after = move_after
        self._retention = retention
        self._batch = batch_size
        self._ahead = days_ahead
        self.moved = 0
        #: The last round stopped at HISTORY_ROUND_BATCHES with more to move.
        self.behind = False
        self.partitions_created = 0
        self.partitions_dropped = 0

    async def chore(self) -> None:
        await self.prepare()
        await self.move()
        await self.drop()

    async def prepare(self) -> int:
        """Create the missing day partitions; how many."""
        created = await self._store.jobs_history_prepare(
            ahead_days=self._ahead, retention=self._retention
        )
        if created:
            self.partitions_created += created
            log.info("created %d day partitions of pgfleet.jobs_history", created)
        return created

    async def move(self) -> int:
        """One round: at most HISTORY_ROUND_BATCHES batches; how many moved. After
        each full batch, ``between_batches`` runs (the Vacuumer's check): a round
        that moves a minute of a busy queue's jobs leaves as many dead tuples, which
        a vacuum at the end of the round would find piled up in a table grown to
        hold them."""
        total = 0
        self.behind = True
        for _ in range(HISTORY_ROUND_BATCHES):
            n = await self._store.jobs_history_move(
                older_than_seconds=self._move_after, batch_size=self._batch
            )
            total += n
            self.moved += n
            if n < self._batch:
                self.behind = False
                break
            if self._between is not None:
                await self._between()
        if self.behind:
            # More jobs finish per interval than a round moves (300,000 a minute at
            # the defaults): the next round starts at once, after the other chores
            # had their turn, instead of letting the claim table grow.
            self.kick()
        return total

    async def drop(self) -> list[str]:
        """Drop the days of history past the retention (none when it is off)."""
        if self._retention is None:
            return []
        dropped = await self._store.jobs_history_drop(older_than_seconds=self._retention)
        for partition, rows in dropped:
            log.info("dropped %s (about %d finished jobs past retention)", partition, rows)
        self.partitions_dropped += len(dropped)
        return [p for p, _ in dropped]


class Vacuumer(Chore):
    """VACUUM (ANALYZE) the jobs table when it carries many dead tuples: at least
    ``min_dead_tuples`` and a fifth of the live ones. A queue rewrites every row it
    holds twice and the Historian deletes it, so without vacuum its dead tuples and
    index bloat grow without bound, and the claim walks them.

    ``mode="auto"``: when autovacuum is off for the table, and when it is on but has
    fallen behind (:data:`AUTOVACUUM_BEHIND` times the threshold); ``"always"``;
    ``"never"``. The check is one read of the table's statistics: it runs on the
    Vacuumer's period and between the Historian's batches, so the table is
    vacuumed as soon as the threshold is passed, each vacuum with bounded work.

    The same check ANALYZEs the table (except with ``"never"``) once its live rows
    pass twice those its statistics were taken on (and ``min_dead_tuples``): a
    backlog that builds up on a table analyzed while nearly empty would otherwise be
    claimed with plans made for the empty table, which walk every queued row per
    claim (a soak's first minutes stalled on that), until autovacuum's next analyze
    or the first vacuum. An ANALYZE samples 3,000 rows (0016) and replans every cached
    plan over the table."""

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
        #: ANALYZEs of a table that outgrew its statistics (vacuums analyze too).
        self.analyzes = 0
        #: Dead tuples the last vacuum found, as the statistics said.
        self.last_dead_tuples = 0

    async def chore(self) -> None:
        await self.vacuum_if_needed()

    def threshold(self, live_tuples: int, *, autovacuum: bool) -> int:
        """Dead tuples from which the leader vacuums the table."""
        base = max(self._min_dead, live_tuples // 5)
        return base * AUTOVACUUM_BEHIND if autovacuum else base

    async def vacuum_if_needed(self) -> bool:
        """Vacuum the jobs table when its dead tuples passed the threshold; whether
        it did. Called with the chores' turn held."""
        if self.mode == "never":
            return False
        health = await self._store.jobs_table_health()
        if health is None:
            return False
        autovacuum = health.autovacuum and self.mode == "auto"
        dead, live = health.dead_tuples, health.live_tuples
        if dead < self.threshold(live, autovacuum=autovacuum):
            if self.outgrew_statistics(live, health.analyzed_tuples):
                await self._analyze()
            return False
        try:
            await self._store.jobs_vacuum()
        except Exception as exc:
            log.warning("could not vacuum pgfleet.jobs (%s); not trying again", exc)
            self.mode = "never"
            return False
        self.vacuums += 1
        self.last_dead_tuples = dead
        log.debug("vacuumed pgfleet.jobs: %d dead tuples (%d live)", dead, live)
        return True

    def outgrew_statistics(self, live_tuples: int, analyzed_tuples: int) -> bool:
        """Whether the table holds twice the rows its statistics were taken on (and
        at least ``min_dead_tuples``, at least one)."""
        return live_tuples >= max(self._min_dead, 1, 2 * analyzed_tuples)

    async def _analyze(self) -> None:
        try:
            await self._store.jobs_analyze()
        except Exception as exc:
            log.warning("could not analyze pgfleet.jobs (%s); not trying again", exc)
            self.mode = "never"
            return
        self.analyzes += 1
        log.debug("analyzed pgfleet.jobs: it outgrew its statistics")
