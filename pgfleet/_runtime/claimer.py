"""The claim loop: one round trip per turn writes the outcomes of finished
handlers and claims jobs for the free slots, on a connection it keeps."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from pgfleet._runtime.due import DueTimes
from pgfleet._runtime.execution import JobRunner
from pgfleet._runtime.outcomes import Outcome, RunStats
from pgfleet.db.deadlines import BoundedPool, Held
from pgfleet.db.store import Store
from pgfleet.db.translate import is_connection_error, round_result
from pgfleet.db.types import Record
from pgfleet.errors import DatabaseUnavailable
from pgfleet.events import WorkerEvents
from pgfleet.payloads import storable_text

log = logging.getLogger("pgfleet")

#: Seconds a job claimed ahead (prefetch) may wait for a free slot before it is
#: handed back, unstarted, for any worker to take.
PREFETCH_HOLD = 1.0


class ClaimLoop:
    """Writes outcomes and claims jobs, batching both into one statement per round.

    Every round is bounded by ``timeout``: a connection that does not answer is
    dropped and the round retried on a new one. A round that fails for any other
    reason has its outcomes written one by one, so that one outcome the database
    refuses can never hold back the others.
    """

    def __init__(
        self,
        worker_id: uuid.UUID,
        pool: Any,  # the application's pool: held connections come from it directly
        db: BoundedPool,
        executor: JobRunner,
        *,
        names: Sequence[str],
        queue_names: Sequence[str] | None,
        poll_interval: float,
        timeout: float,
        hold: float = PREFETCH_HOLD,
        pooled: bool,
        events: WorkerEvents,
        stats: RunStats,
    ) -> None:
        self.worker_id = worker_id
        self._pool = pool
        self._db = db
        self._executor = executor
        self._names = list(names)
        self._queue_names = None if queue_names is None else list(queue_names)
        self._poll = poll_interval
        self._timeout = timeout
        self._hold = hold
        #: A handler finished since the last round (a slot came free): the
        #: round may top up the jobs held ahead.
        self._finished = False
        self._pooled = pooled
        self.events = events
        self.stats = stats
        #: Outcomes waiting for the next round.
        self.outcomes: list[Outcome] = []
        #: Set by the drain: claim nothing more, write what is left, then return.
        self.stopping = False
        #: Return (stopping) once a round leaves slots free and nothing runs.
        self.burst = False
        self._wake_event = asyncio.Event()
        self._wake_source = "start"
        #: When the next scheduled job is due: the idle wait ends then.
        self.due = DueTimes(names, queue_names, timeout=timeout)
        #: Health, for readiness: consecutive failed rounds, when the current round
        #: began (None between rounds), when the failures began.
        self._failures = 0
        self._unreachable = 0
        self._round_started: float | None = None
        self._failing_since: float | None = None

    # ------------------------------------------------------------ signals

    def wake(self, source: str) -> None:
        if not self._wake_event.is_set():
            self._wake_source = source
            self._wake_event.set()

    def add_outcome(self, outcome: Outcome) -> None:
        """A handler finished: its outcome goes with the next round."""
        self.outcomes.append(outcome)
        self._finished = True
        self.wake("completion")

    def release_held(self) -> None:
        """Hand back every job claimed ahead (the drain: they never start)."""
        self._release_held(None)

    def _release_held(self, claimed_before: float | None) -> None:
        jobs = self._executor.take_held(claimed_before)
        if jobs:
            if claimed_before is not None:
                log.info("handing back %d jobs held %gs without a free slot", len(jobs), self._hold)
            self.outcomes.extend(Outcome.released(job) for job in jobs)

    def health(self) -> str | None:
        """None while the loop reaches the database, else why it does not."""
        if self._failures:
            return f"claim loop cannot reach the database ({self._failures} failed rounds)"
        started = self._round_started
        if started is not None:
            waited = time.monotonic() - started
            if waited > max(self._timeout / 3, 1.0):
                return f"claim round waiting for the database for {waited:.0f}s"
        return None

    async def _wait(self, timeout: float | None) -> None:
        if not self._wake_event.is_set():
            if timeout is None:
                await self._wake_event.wait()
            else:
                try:
                    await asyncio.wait_for(self._wake_event.wait(), timeout)
                except TimeoutError:
                    self._wake_source = "poll"
        self.events.wakeup(self._wake_source)

    # ------------------------------------------------------------ the loop

    async def run(self) -> None:
        held: Held | None = None
        idle = False
        refused = 0
        executor = self._executor
        #: A round's answer not settled yet: under load, the next round goes out
        #: first and this one's jobs start while it is in flight, so the database
        #: does not wait for the client between rounds (see _send_then_settle).
        deferred: tuple[list[Outcome], list[Record], int] | None = None
        try:
            while True:
                if executor.held:
                    self._release_held(time.monotonic() - self._hold)
                if deferred is not None and (
                    self.stopping
                    or not (self.outcomes or executor.unmarked)
                    or held is None
                    or held.closed()
                ):
                    # Nothing to send first (or no connection to send it on).
                    self._settle(deferred[0], deferred[1])
                    deferred = None
                if self.stopping and not executor.running and not self.outcomes:
                    return
                arriving = 0 if deferred is None else deferred[2]
                free, start = (0, 0) if self.stopping else executor.wanted(self._finished, arriving)
                if not self.outcomes and not executor.unmarked:
                    if free == 0:
                        self._wake_event.clear()
                        await self._wait(executor.held_wait(self._hold))
                        continue
                    if idle:
                        await self._wait(await self.due.idle_wait(held, self._poll))
                        idle = False
                        continue
                self._wake_event.clear()
                batch, self.outcomes = self.outcomes, []
                self._finished = False
                started = executor.take_started()
                self._round_started = time.monotonic()
                round_: asyncio.Task[list[Record]] | None = None
                if deferred is not None:
                    assert held is not None  # settled above otherwise
                    round_ = await self._send_then_settle(
                        held, batch, free, start, started, deferred
                    )
                    deferred = None
                try:
                    if round_ is None and held is not None and held.closed():
                        held.drop()  # closed under us: make sure its slot goes back
                        held = None
                    reached = held is not None
                    async with asyncio.timeout(self._timeout):
                        if held is None:
                            held = Held(await self._pool.acquire(timeout=self._timeout))
                            if not self._pooled:
                                await Store(held.conn).claim_session_begin()
                            reached = True
                            if self._failures:
                                await self._release_unknown(Store(held.conn), batch)
                        if round_ is not None:
                            rows = await round_
                        else:
                            rows = await self._claim(Store(held.conn), batch, free, start, started)
                except TimeoutError:
                    executor.restore_started(started)
                    await self._round_failed(batch, held, None, reached=False)
                    held = None
                    continue
                except Exception as exc:
                    executor.restore_started(started)
                    if held is not None and not held.closed() and not is_connection_error(exc):
                        # The database answered, and refused: not an outage.
                        self._round_started = None
                        refused += 1
                        await self._isolate(Store(held.conn), batch, exc, refused)
                        await self.pause(min(30.0, 0.05 * 2 ** min(refused, 10)))
                        continue
                    await self._round_failed(batch, held, exc, reached=reached)
                    held = None
                    continue
                self._round_started = None
                refused = 0
                if self._failures:
                    assert self._failing_since is not None
                    log.warning(
                        "claim loop of worker %s reaches the database again after %.1fs "
                        "(%d failed rounds)",
                        self.worker_id,
                        time.monotonic() - self._failing_since,
                        self._failures,
                    )
                    self._failures = 0
                    self._unreachable = 0
                    self._failing_since = None
                if not self.stopping and (self.outcomes or executor.unmarked):
                    # Handlers finished while the round was out: send theirs first.
                    claimed = sum(1 for row in rows if row[0])
                    deferred = (batch, rows, claimed)
                else:
                    claimed = self._settle(batch, rows)
                idle = claimed < free
                if (
                    self.burst
                    and idle
                    and not executor.running
                    and not executor.held
                    and not self.outcomes
                ):
                    self.stopping = True
                    return
        finally:
            if held is not None and self._round_started is not None:
                held.drop()  # cut mid-round (flush timeout, cancellation): state unknown
            self._round_started = None
            if held is not None and not held.closed():
                try:
                    async with asyncio.timeout(min(self._timeout, 5.0)):
                        if not self._pooled:
                            await Store(held.conn).claim_session_end()
                except BaseException:
                    # Closed, not released: its session was not reset (and a live
                    # connection kept out of the pool is one pool.close() waits for).
                    held.drop()
                else:
                    with contextlib.suppress(Exception):
                        await held.release(self._pool, min(self._timeout, 5.0))
            elif held is not None:
                held.drop()

    async def _send_then_settle(
        self,
        held: Held,
        batch: list[Outcome],
        free: int,
        start: int,
        started: list[uuid.UUID],
        deferred: tuple[list[Outcome], list[Record], int],
    ) -> asyncio.Task[list[Record]]:
        """Send a round, then settle the previous one while it is out: its task's
        first step writes the statement, and the jobs the previous round claimed
        start (and its outcomes are reported) before this one's answer can arrive.
        Returns the round's task, for the caller to await like a round of its own.
        If settling fails the round is cancelled: its connection is dropped with
        the loop (a cut round's state is unknown)."""
        round_ = asyncio.get_running_loop().create_task(
            self._send(held, batch, free, start, started)
        )
        try:
            await asyncio.sleep(0)
            self._settle(deferred[0], deferred[1])
        except BaseException:
            round_.cancel()
            raise
        return round_

    async def _send(
        self, held: Held, batch: list[Outcome], free: int, start: int, started: list[uuid.UUID]
    ) -> list[Record]:
        """A pipelined round's task. The connection can be lost in the loop turn
        between the caller's check and this first step (a reset read in the same
        turn as the previous answer): asyncpg has then already handed its slot back
        and detached the proxy, so say the connection is gone instead of calling
        it."""
        if held.closed():
            raise DatabaseUnavailable("the claim connection closed before the round was sent")
        return await self._claim(Store(held.conn), batch, free, start, started)

    async def _claim(
        self, store: Store, batch: list[Outcome], free: int, start: int, started: list[uuid.UUID]
    ) -> list[Record]:
        """One claim round's statement. Behind a transaction-mode pooler it runs in a
        transaction of its own that carries the planner settings (SET LOCAL); a
        direct connection has them on its session (claim_session_begin)."""
        if not self._pooled:
            return await self._complete_and_claim(store, batch, free, start, started)
        await store.claim_transaction_begin()
        try:
            rows = await self._complete_and_claim(store, batch, free, start, started)
            await store.claim_transaction_commit()
        except Exception:
            conn = store.connection
            if not conn.is_closed() and conn.is_in_transaction():
                with contextlib.suppress(Exception):
                    await store.claim_transaction_rollback()
            raise
        return rows

    async def _complete_and_claim(
        self,
        store: Store,
        batch: list[Outcome],
        free: int,
        start: int = 0,
        started: Sequence[uuid.UUID] = (),
    ) -> list[Record]:
        now = time.perf_counter()
        return await store.job_complete_and_claim(
            ids=[o.job.id for o in batch],
            tokens=[o.job.lock_token for o in batch],
            actions=[o.action for o in batch],
            delays=[o.delay for o in batch],
            errors=[o.error for o in batch],
            ran=[None if o.started is None else now - o.started for o in batch],
            results=[o.result for o in batch],
            worker_id=self.worker_id,
            job_names=self._names,
            queue_names=self._queue_names,
            limit=free,
            start=start,
            started=started,
        )

    async def _round_failed(
        self, batch: list[Outcome], held: Held | None, exc: BaseException | None, *, reached: bool
    ) -> None:
        """The round's connection failed or hung: put its outcomes back, drop the
        connection and retry after a backoff. Says so once, not every round.

        A connection that was working and then closed (``reached``: a server
        restart, pg_terminate_backend, a pooler recycling it) is replaced at once; the
        backoff grows only while the database cannot be reached at all."""
        for o in batch:
            o.resent = True
        self.outcomes[:0] = batch
        if held is not None:
            held.drop()
        if exc is None:
            await self._db.hang_detected("claim round")
            reason = f"no answer within {self._timeout:g}s; connection dropped"
        else:
            reason = str(exc) or type(exc).__name__
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        if reached:
            self._unreachable = 0
            delay = 0.05
        else:
            self._unreachable += 1
            delay = min(30.0, 0.05 * 2 ** min(self._unreachable, 10))
        if self._failures == 1:
            log.warning(
                "claim round of worker %s failed (%s); retrying with backoff, the worker "
                "is unready until the database answers",
                self.worker_id,
                reason,
            )
        else:
            log.debug("claim round failed again (%s); retrying in %.2fs", reason, delay)
        self._round_started = None
        await self.pause(delay)

    async def _isolate(
        self, store: Store, batch: list[Outcome], exc: BaseException, refused: int
    ) -> None:
        """Write a refused round's outcomes one at a time, claiming nothing. An
        outcome the database refuses is replaced by a permanent failure that says
        why, so its job ends instead of blocking every later round."""
        if batch or refused == 1 or refused % 100 == 0:
            log.error(
                "claim round of worker %s was refused by the database (%s: %s)%s",
                self.worker_id,
                type(exc).__name__,
                exc,
                f"; writing its {len(batch)} outcomes one by one" if batch else "",
            )
        for index, o in enumerate(batch):
            try:
                rows = await self._write_one(store, o)
            except Exception as exc:
                if is_connection_error(exc) or isinstance(exc, TimeoutError):
                    for rest in batch[index:]:
                        rest.resent = True
                    self.outcomes[:0] = batch[index:]
                    return
                error = storable_text(
                    f"pgfleet could not record this attempt's {o.label} outcome: "
                    f"{type(exc).__name__}: {exc}"
                )
                log.error("job %s (%s): %s", o.job.id, o.job.name, error)
                o.action, o.label, o.delay, o.error = "failed", "failed", 0.0, error
                try:
                    rows = await self._write_one(store, o)
                except Exception as again:
                    log.error(
                        "job %s (%s): its outcome cannot be written (%s); it stays running "
                        "until this worker stops and the fleet recovers it",
                        o.job.id,
                        o.job.name,
                        again,
                    )
                    continue
            self._settle([o], rows)

    async def _write_one(self, store: Store, o: Outcome) -> list[Record]:
        async with asyncio.timeout(self._timeout):
            return await self._complete_and_claim(store, [o], 0)

    async def _release_unknown(self, store: Store, batch: list[Outcome]) -> None:
        known = (
            list(self._executor.running)
            + self._executor.held_ids()
            + [o.job.id for o in batch]
            + [o.job.id for o in self.outcomes]
        )
        released = await store.job_release_unknown(worker_id=self.worker_id, known_ids=known)
        if released:
            log.warning(
                "released %d jobs claimed by a round whose answer was lost with the connection",
                released,
            )

    async def pause(self, delay: float) -> None:
        await asyncio.sleep(delay)

    def _settle(self, batch: list[Outcome], rows: list[Record]) -> int:
        """Report the round's written outcomes and start the jobs it claimed."""
        jobs, ahead, applied = round_result(rows, self.worker_id)
        stats, events = self.stats, self.events
        for o in batch:
            job = o.job
            # A resent outcome not applied now was most likely applied by the round
            # that first carried it, which committed before its connection dropped.
            if job.id in applied or o.resent:
                stats.count(job.name, o.label)
                if o.label != "released":  # never started: nothing finished
                    events.job_finished(job, o.label, o.duration)
            elif o.label == "released":
                stats.count(job.name, "cancelled")
            else:
                log.warning(
                    "job %s (%s) was taken away while running (recovered, or completed or "
                    "failed by an operator): its %s outcome was discarded",
                    job.id,
                    job.name,
                    o.label,
                )
                stats.count(job.name, "cancelled")
                events.job_finished(job, "cancelled", o.duration)
        claimed = len(jobs) + len(ahead)
        if claimed:
            stats.claimed += claimed
            events.jobs_claimed(claimed)
            if self.stopping:
                # Claimed by a round that was in flight when the drain began: hand
                # them straight back, their attempts not counted, instead of starting.
                self.outcomes.extend(Outcome.aborted(job) for job in jobs)
                self.outcomes.extend(Outcome.released(job) for job in ahead)
            else:
                self._executor.launch(jobs, ahead)
        return claimed
