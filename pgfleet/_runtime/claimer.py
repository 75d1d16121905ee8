"""The claim loop: one round trip per turn writes the outcomes of finished
handlers and claims jobs for the free slots, on a connection it keeps.

In three parts: ``claim_connection.py`` the connection it holds,
``claim_planner.py`` what each turn does (pure), and this module the loop that
carries turns out and handles what a round's answer, or its failure, means."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pgfleet._runtime import claim_planner as planner
from pgfleet._runtime.claim_connection import ClaimConnection, ClaimStore
from pgfleet._runtime.claim_planner import LoopState, Step, Turn
from pgfleet._runtime.due import DueTimes
from pgfleet._runtime.execution import JobRunner
from pgfleet._runtime.outcomes import Outcome, RunStats
from pgfleet.db.deadlines import BoundedPool
from pgfleet.db.store import Store
from pgfleet.db.translate import is_connection_error, round_result, round_signals
from pgfleet.db.types import Record
from pgfleet.errors import DatabaseUnavailable
from pgfleet.events import WorkerEvents
from pgfleet.payloads import storable_text

log = logging.getLogger("pgfleet")

#: Seconds a job claimed ahead (prefetch) may wait for a free slot before it is
#: handed back, unstarted, for any worker to take.
PREFETCH_HOLD = 1.0


@dataclass(slots=True)
class _Deferred:
    """A round's answer not settled yet: under load, the next round goes out first
    and this one's jobs start while it is in flight (see ``_send_then_settle``)."""

    batch: list[Outcome]
    rows: list[Record]
    claimed: int


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
        remove_succeeded: bool = False,
        store: Callable[[Any], ClaimStore] = Store,  # a scripted fake in unit tests
    ) -> None:
        self.worker_id = worker_id
        self.connection = ClaimConnection(pool, pooled=pooled, timeout=timeout, store=store)
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
        self.events = events
        self.stats = stats
        #: Outcomes waiting for the next round.
        self.outcomes: list[Outcome] = []
        #: Set by the drain: claim nothing more, write what is left, then return.
        self.stopping = False
        #: Return (stopping) once a round leaves slots free and nothing runs.
        self.burst = False
        #: Flow control is in play for this worker's names: the full claim statement
        #: (the first round always is; each round says for the next).
        self._flow = True
        #: A succeeded job is written as action 'remove': deleted at completion
        #: unless something needs its row (remove_succeeded_jobs).
        self._succeeded = "remove" if remove_succeeded else "succeeded"
        #: Rate limits: poll at least this often (flow_pace; None: no rate binds).
        self._pace: float | None = None
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
        #: Refused rounds in a row (in this run).
        self._refused = 0

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
        started = self._round_started
        waited = None if started is None else time.monotonic() - started
        return planner.health(failures=self._failures, waited=waited, timeout=self._timeout)

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

    def _state(self, deferred: _Deferred | None, idle: bool) -> LoopState:
        executor = self._executor
        arriving = 0 if deferred is None else deferred.claimed
        wanted, start = (0, 0) if self.stopping else executor.wanted(self._finished, arriving)
        return LoopState(
            stopping=self.stopping,
            pending=len(self.outcomes),
            unmarked=executor.unmarked,
            running=len(executor.running),
            wanted=wanted,
            start=start,
            idle=idle,
            deferred=deferred is not None,
            connected=self.connection.usable,
            held_wait=executor.held_wait(self._hold) if wanted == 0 else None,
            poll=self._poll if self._pace is None else min(self._poll, self._pace),
        )

    async def run(self) -> None:
        idle = False
        self._refused = 0
        executor = self._executor
        deferred: _Deferred | None = None
        try:
            while True:
                if executor.held:
                    self._release_held(time.monotonic() - self._hold)
                turn = planner.plan(self._state(deferred, idle))
                if turn.step is Step.SETTLE:
                    assert deferred is not None
                    self._settle(deferred.batch, deferred.rows)
                    deferred = None
                    turn = planner.plan(self._state(None, idle))
                if turn.step is Step.STOP:
                    return
                if turn.step is Step.WAIT:
                    self._wake_event.clear()
                    await self._wait(turn.wake_within)
                    continue
                if turn.step is Step.POLL:
                    assert turn.wake_within is not None
                    # Until the next scheduled job is due, at most the poll interval.
                    await self._wait(
                        await self.due.idle_wait(self.connection.held, turn.wake_within)
                    )
                    idle = False
                    continue
                batch, rows, claimed = await self._send_round(turn, deferred)
                deferred = None
                if rows is None:
                    continue
                if planner.defers(
                    stopping=self.stopping, pending=len(self.outcomes), unmarked=executor.unmarked
                ):
                    # Handlers finished while the round was out: send theirs first.
                    deferred = _Deferred(batch, rows, claimed)
                else:
                    claimed = self._settle(batch, rows)
                idle = claimed < turn.limit
                if planner.burst_finished(
                    burst=self.burst,
                    idle=idle,
                    running=len(executor.running),
                    held=executor.held,
                    pending=len(self.outcomes),
                ):
                    self.stopping = True
                    return
        finally:
            await self.connection.close(cut=self._round_started is not None)
            self._round_started = None

    async def _send_round(
        self, turn: Turn, deferred: _Deferred | None
    ) -> tuple[list[Outcome], list[Record] | None, int]:
        """Send a round as ``turn`` says, settling ``deferred`` while it is out when
        pipelined; its batch of outcomes, its rows (None: it failed, and was
        handled) and how many jobs it claimed."""
        self._wake_event.clear()
        batch, self.outcomes = self.outcomes, []
        self._finished = False
        started = self._executor.take_started()
        self._round_started = time.monotonic()
        pipelined: asyncio.Task[list[Record]] | None = None
        if deferred is not None:
            assert turn.pipelined  # else settled
            pipelined = await self._send_then_settle(batch, turn, started, deferred)
        rows = await self._round(batch, turn, started, pipelined)
        if rows is None:
            return batch, None, 0
        self._round_started = None
        self._refused = 0
        claimed, self._pace, self._flow = round_signals(rows)
        if self._failures:
            self._recovered()
        return batch, rows, claimed

    async def _round(
        self,
        batch: list[Outcome],
        turn: Turn,
        started: list[uuid.UUID],
        pipelined: asyncio.Task[list[Record]] | None,
    ) -> list[Record] | None:
        """A round's answer, on the held connection (opened first if there is none);
        None when it failed or was refused (its outcomes are back in line, or
        written one by one)."""
        connection = self.connection
        if pipelined is None:
            connection.drop_if_closed()
        reached = connection.held is not None
        try:
            async with asyncio.timeout(self._timeout):
                if connection.held is None:
                    await connection.open()
                    reached = True
                    if self._failures:
                        await self._release_unknown(connection.store(), batch)
                if pipelined is not None:
                    return await pipelined
                return await connection.transact(
                    functools.partial(self._statement, batch=batch, turn=turn, started=started)
                )
        except TimeoutError:
            self._executor.restore_started(started)
            await self._round_failed(batch, None, reached=False)
        except Exception as exc:
            self._executor.restore_started(started)
            if connection.usable and not is_connection_error(exc):
                # The database answered, and refused: not an outage.
                self._round_started = None
                self._refused += 1
                await self._isolate(connection.store(), batch, exc, self._refused)
                await self.pause(planner.backoff(self._refused))
            else:
                await self._round_failed(batch, exc, reached=reached)
        return None

    def _recovered(self) -> None:
        assert self._failing_since is not None
        log.warning(
            "claim loop of worker %s reaches the database again after %.1fs (%d failed rounds)",
            self.worker_id,
            time.monotonic() - self._failing_since,
            self._failures,
        )
        self._failures = 0
        self._unreachable = 0
        self._failing_since = None

    async def _send_then_settle(
        self,
        batch: list[Outcome],
        turn: Turn,
        started: list[uuid.UUID],
        deferred: _Deferred,
    ) -> asyncio.Task[list[Record]]:
        """Send a round, then settle the previous one while it is out: its task's
        first step writes the statement, and the jobs the previous round claimed
        start (and its outcomes are reported) before this one's answer can arrive.
        Returns the round's task, for the caller to await like a round of its own.
        If settling fails the round is cancelled: its connection is dropped with
        the loop (a cut round's state is unknown)."""
        round_ = asyncio.get_running_loop().create_task(
            self._send(batch, turn.limit, turn.start, started)
        )
        try:
            await asyncio.sleep(0)
            self._settle(deferred.batch, deferred.rows)
        except BaseException:
            round_.cancel()
            raise
        return round_

    async def _send(
        self, batch: list[Outcome], limit: int, start: int, started: list[uuid.UUID]
    ) -> list[Record]:
        """A pipelined round's task. The connection can be lost in the loop turn
        between the caller's check and this first step (a reset read in the same
        turn as the previous answer): asyncpg has then already handed its slot back
        and detached the proxy, so say the connection is gone instead of calling
        it."""
        if not self.connection.usable:
            raise DatabaseUnavailable("the claim connection closed before the round was sent")
        turn = Turn(Step.SEND, limit=limit, start=start)
        return await self.connection.transact(
            functools.partial(self._statement, batch=batch, turn=turn, started=started)
        )

    async def _statement(
        self,
        store: ClaimStore,
        *,
        batch: list[Outcome],
        turn: Turn | None = None,
        started: Sequence[uuid.UUID] = (),
    ) -> list[Record]:
        """The round's statement: write ``batch``, mark ``started``, claim as
        ``turn`` says (nothing without one)."""
        now = time.perf_counter()
        return await store.job_complete_and_claim(
            ids=[o.job.id for o in batch],
            tokens=[o.job.lock_token for o in batch],
            actions=[self._succeeded if o.action == "succeeded" else o.action for o in batch],
            delays=[o.delay for o in batch],
            errors=[o.error for o in batch],
            ran=[None if o.started is None else now - o.started for o in batch],
            results=[o.result for o in batch],
            worker_id=self.worker_id,
            job_names=self._names,
            queue_names=self._queue_names,
            limit=0 if turn is None else turn.limit,
            start=0 if turn is None else turn.start,
            started=started,
            flow=self._flow,
        )

    async def _round_failed(
        self, batch: list[Outcome], exc: BaseException | None, *, reached: bool
    ) -> None:
        """The round's connection failed or hung: put its outcomes back, drop the
        connection and retry after a backoff. Says so once, not every round.

        A connection that was working and then closed (``reached``) is replaced at
        once; the backoff grows only while the database cannot be reached at all."""
        for o in batch:
            o.resent = True
        self.outcomes[:0] = batch
        self.connection.drop()
        if exc is None:
            await self._db.hang_detected("claim round")
            reason = f"no answer within {self._timeout:g}s; connection dropped"
        else:
            reason = str(exc) or type(exc).__name__
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        self._unreachable = 0 if reached else self._unreachable + 1
        delay = planner.outage_backoff(reached=reached, unreachable=self._unreachable)
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
        self, store: ClaimStore, batch: list[Outcome], exc: BaseException, refused: int
    ) -> None:
        """Write a refused round's outcomes one at a time, claiming nothing. An
        outcome the database refuses is replaced by a permanent failure that says
        why, so its job ends instead of blocking every later round."""
        if planner.should_log_refusal(outcomes=len(batch), refused=refused):
            log.error(
                "claim round of worker %s was refused by the database (%s: %s)%s",
                self.worker_id,
                type(exc).__name__,
                exc,
                f"; writing its {len(batch)} outcomes one by one" if batch else "",
            )
        for index, o in enumerate(batch):
            rows: list[Record] | None
            try:
                rows = await self._write_one(store, o)
            except Exception as exc:
                if is_connection_error(exc) or isinstance(exc, TimeoutError):
                    for rest in batch[index:]:
                        rest.resent = True
                    self.outcomes[:0] = batch[index:]
                    return
                rows = await self._write_failure(store, o, exc)
                if rows is None:
                    continue
            self._settle([o], rows)

    async def _write_failure(
        self, store: ClaimStore, o: Outcome, exc: Exception
    ) -> list[Record] | None:
        """The database refused ``o``: write a permanent failure that says why
        instead (None when even that is refused)."""
        error = storable_text(
            f"pgfleet could not record this attempt's {o.label} outcome: "
            f"{type(exc).__name__}: {exc}"
        )
        log.error("job %s (%s): %s", o.job.id, o.job.name, error)
        o.action, o.label, o.delay, o.error = "failed", "failed", 0.0, error
        try:
            return await self._write_one(store, o)
        except Exception as again:
            log.error(
                "job %s (%s): its outcome cannot be written (%s); it stays running "
                "until this worker stops and the fleet recovers it",
                o.job.id,
                o.job.name,
                again,
            )
            return None

    async def _write_one(self, store: ClaimStore, o: Outcome) -> list[Record]:
        async with asyncio.timeout(self._timeout):
            return await self._statement(store, batch=[o])

    async def _release_unknown(self, store: ClaimStore, batch: list[Outcome]) -> None:
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
