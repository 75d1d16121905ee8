"""The data layer: the one caller of pgfleet's SQL.

:class:`Store` runs the named statements of ``queries.sql`` and ``console.sql`` on a
pool or a connection. Each method is named after its query, takes keyword
arguments, returns pgfleet values (:class:`Job`, :class:`WorkerInfo`, the small
records below), and raises the library's errors, never the driver's (the claim
loop's statements excepted: see :meth:`Store.job_complete_and_claim`). Nothing
outside :mod:`pgfleet.db` executes a statement.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast
from uuid import UUID

from pgfleet.db.access import AQ
from pgfleet.db.console import CQ
from pgfleet.db.plans import Batch, Statement, Steps, cancel_steps, get_steps
from pgfleet.db.queries import Q
from pgfleet.db.translate import (
    is_connection_error,
    job_from_record,
    translate_errors,
    worker_from_record,
)
from pgfleet.db.types import Connection, Executor, Pool, Record
from pgfleet.jobs import BatchProgress, Job, JobStatus, Relative, WorkerInfo
from pgfleet.limits import Limit, LimitSpec, Paused

T = TypeVar("T")

__all__ = [
    "CronRegistration",
    "CronState",
    "ForceUnlock",
    "HeartbeatBeat",
    "KindStats",
    "RescuedRow",
    "Revocation",
    "SessionState",
    "Store",
    "TableHealth",
    "is_connection_error",
]


def _sparse(values: Sequence[Any]) -> Sequence[Any] | None:
    """``values``, or None when every one is None (a round of plain successes has
    no delays, errors or results): the claim statement's unnest pads a NULL array
    with NULLs, so both read the same, and the driver need not check and encode a
    NULL element per job (about 0.2 µs each)."""
    return None if values.count(None) == len(values) else values


#: Between a round's results in the one text that carries them: JSON text as
#: ``encode_result`` writes it never holds it (control characters in strings are
#: escaped), and an empty field is an outcome without a result.
RESULT_SEPARATOR = "\x1e"


def _joined(results: Sequence[str | None]) -> str | None:
    """A round's results as one text (None when no outcome has one), split again by
    the claim statement: the driver checks and copies an array element by element,
    and a round of 500 results of 1 KiB cost it about 2 µs each instead of 0.5."""
    if results.count(None) == len(results):
        return None
    text = RESULT_SEPARATOR.join("" if r is None else r for r in results)
    if text.count(RESULT_SEPARATOR) != len(results) - 1:
        raise ValueError("a result's JSON text holds U+001E, which separates results")
    return text


def _uniform(values: Sequence[Any]) -> Sequence[Any]:
    """``values``, or only the first when all are equal (the claim statement reads
    it for every row: see ``_sparse``)."""
    if values and values.count(values[0]) == len(values):
        return values[:1]
    return values


# One translator per operation, made once: they hold nothing but the label.
_ENQUEUE = translate_errors("enqueue")
_ENQUEUE_MANY = translate_errors("enqueue_many")
_GET = translate_errors("get")
_RECENT = translate_errors("recent")
_COUNTS = translate_errors("counts")
_BACKLOG = translate_errors("runnable_backlog")
_BACKLOG_BY_NAME = translate_errors("runnable_backlog_by_name")
_STATUS = translate_errors("status")
_STATUSES = translate_errors("statuses")
_WORKERS = translate_errors("workers")
_LIMITS = translate_errors("limits")
_CANCEL = translate_errors("cancel")
_WAIT = translate_errors("wait")
_RETRY = translate_errors("retry")
_RESCHEDULE = translate_errors("reschedule")
_PERMANENTLY_FAIL = translate_errors("permanently_fail")
_COMPLETE = translate_errors("complete")
_FORCE_UNLOCK = translate_errors("force_unlock_worker")
_PRUNE = translate_errors("prune")
_HISTORY = translate_errors("history")
_HEARTBEAT = translate_errors("heartbeat")
_DEREGISTER = translate_errors("deregister")
_RESCUE = translate_errors("rescue")
_VACUUM_CHECK = translate_errors("vacuum check")
_VACUUM = translate_errors("vacuum")
_PING = translate_errors("ping")
_METRICS = translate_errors("queue metrics")
_CRON = translate_errors("cron")
_CRON_PREPARE = translate_errors("cron prepare")
_CONSOLE = translate_errors("console")
_ACCESS = translate_errors("access")
_WORKFLOW = translate_errors("workflow")

# ---------------------------------------------------------------- result records


@dataclass(frozen=True, slots=True)
class ForceUnlock:
    """What ``worker_force_unlock`` did."""

    requeued: int
    failed: int
    deregistered: bool


@dataclass(frozen=True, slots=True)
class HeartbeatBeat:
    """One heartbeat's answer."""

    #: The worker was not registered (first beat, or declared dead meanwhile).
    inserted: bool
    started_at: datetime
    #: This worker holds the fleet leadership after the beat.
    leader: bool


@dataclass(frozen=True, slots=True)
class RescuedRow:
    """One line of ``job_rescue``: a recovered job, or (``job_id`` None) a worker
    deregistered because its heartbeat expired."""

    job_id: UUID | None
    name: str | None
    #: The job's new status, or ``"worker_expired"``.
    status: str
    worker_id: UUID


@dataclass(frozen=True, slots=True)
class TableHealth:
    """Whether autovacuum looks after ``pgfleet.jobs``, and its tuple counts."""

    autovacuum: bool
    dead_tuples: int
    live_tuples: int
    #: Rows when the planner's statistics were taken (the last VACUUM or ANALYZE).
    analyzed_tuples: int = 0


@dataclass(frozen=True, slots=True)
class KindStats:
    """Queue-level gauges of one job name (``queue_stats``)."""

    name: str
    queued: int
    scheduled: int
    oldest_age: float
    running: int
    dead: int


@dataclass(frozen=True, slots=True)
class CronState:
    """A schedule's row in ``pgfleet.crons``."""

    id: str
    job_name: str
    definition: str
    last_occurrence: datetime
    last_job_id: UUID | None


@dataclass(frozen=True, slots=True)
class CronRegistration:
    """What ``cron_register`` changed (it returns nothing when nothing changed)."""

    inserted: bool
    definition: str
    last_occurrence: datetime
    previous_definition: str | None
    previous_job_name: str | None


@dataclass(frozen=True, slots=True)
class Revocation:
    """A credential name refused by every API replica."""

    name: str
    revoked_at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class SessionState:
    """A live console session (``session_touch``)."""

    credential: str
    credential_digest: bytes
    csrf: str
    #: What the page should show once, then never again.
    notice: str | None
    #: Seconds until the session's absolute end.
    remaining: float


# ---------------------------------------------------------------- the store


class Store:
    """pgfleet's statements, run on ``db``: a pool (each call takes a connection
    of its own) or one connection (calls share its transaction).

    :meth:`acquire` and :meth:`transaction` give a Store bound to one connection
    for calls that must share it."""

    __slots__ = ("db",)

    def __init__(self, db: Executor) -> None:
        self.db = db

    @property
    def connection(self) -> Connection:
        """The connection this store is bound to (inside :meth:`acquire`)."""
        return cast(Connection, self.db)

    @contextlib.asynccontextmanager
    async def acquire(self, what: str = "database call") -> AsyncIterator[Store]:
        """A Store on one connection of the pool (this one when already bound to a
        connection). Failing to get or give back the connection raises the
        library's errors, labelled ``what``."""
        db = self.db
        if not hasattr(db, "acquire"):
            yield self
            return
        with translate_errors(what):
            async with cast(Pool, db).acquire() as conn:
                yield Store(conn)

    @contextlib.asynccontextmanager
    async def transaction(self, what: str = "database call") -> AsyncIterator[Store]:
        """A Store on one connection inside a transaction (a savepoint when that
        connection is already in one): committed when the block ends, rolled back
        when it raises."""
        async with self.acquire(what) as bound:
            with translate_errors(what):
                async with bound.connection.transaction():
                    yield bound

    # ------------------------------------------------------------ enqueue

    async def enqueue_one(self, statement: Statement) -> None:
        """Run a single enqueue's statement (:meth:`Enqueuer.single`)."""
        with _ENQUEUE:
            await self.db.execute(statement.query.sql, *statement.args)

    async def enqueue_batch(
        self, batch: Batch, *, notify: bool, trace: str | None = None
    ) -> list[UUID]:
        """Run a batch's statements on one connection, in a transaction of their
        own when they need one (a savepoint inside the caller's); return the ids
        in request order."""
        async with self.acquire("enqueue_many") as bound:
            if not batch.atomic(notify):
                return await bound.run_plan(batch.steps(notify, trace), _ENQUEUE_MANY)
            async with bound.transaction("enqueue_many") as tx:
                return await tx.run_plan(batch.steps(notify, trace), _ENQUEUE_MANY)

    async def run_plan(self, steps: Steps[T], errors: translate_errors) -> T:
        """Run a plan of :mod:`pgfleet.db.plans` (statements that depend on the
        previous one's answer) on this store's pool or connection."""
        db = self.db
        try:
            statement = next(steps)
            while True:
                sql, args, shape = statement.query.sql, statement.args, statement.query.shape
                with errors:
                    if shape == ":many":
                        answer: Any = await db.fetch(sql, *args)
                    elif shape == ":one":
                        answer = await db.fetchrow(sql, *args)
                    elif shape == ":val":
                        answer = await db.fetchval(sql, *args)
                    else:
                        await db.execute(sql, *args)
                        answer = None
                statement = steps.send(answer)
        except StopIteration as done:
            return cast(T, done.value)

    async def get(self, job_id: UUID | str) -> Job | None:
        """The job with that id, or None (:func:`plans.get_steps`)."""
        return await self.run_plan(get_steps(job_id), _GET)

    async def cancel(self, job_id: UUID | str, by: str | None = None) -> Job:
        """Cancel a queued job, or ask a running one's worker to stop it
        (:func:`plans.cancel_steps`)."""
        return await self.run_plan(cancel_steps(job_id, by), _CANCEL)

    async def job_await(self, *, ids: Sequence[UUID]) -> list[UUID]:
        """Mark the unfinished jobs among ``ids`` as waited for: their end notifies.
        Returns those it could not mark now (locked by another transaction)."""
        with _WAIT:
            rows = await self.db.fetch(Q.job_await.sql, ids)
        return [r["id"] for r in rows]

    async def job_get_many(self, *, ids: Sequence[UUID]) -> list[Job]:
        with _WAIT:
            rows = await self.db.fetch(Q.job_get_many.sql, ids)
        return [job_from_record(r) for r in rows]

    async def job_cancels_of_worker(self, *, worker_id: UUID) -> list[UUID]:
        """The running jobs of a worker that someone asked to cancel."""
        with _HEARTBEAT:
            rows = await self.db.fetch(Q.job_cancels_of_worker.sql, worker_id)
        return [r["id"] for r in rows]

    async def notify_wakeup(self) -> None:
        """Wake the workers now (a committed enqueue's coalesced wakeup)."""
        with _ENQUEUE:
            await self.db.execute(Q.notify_wakeup.sql)

    # ------------------------------------------------------------ reading jobs

    async def batch_progress(self, *, id: UUID) -> BatchProgress | None:
        with _WORKFLOW:
            r = await self.db.fetchrow(Q.batch_progress.sql, id)
        if r is None:
            return None
        return BatchProgress(
            id=r["id"],
            size=int(r["size"]),
            succeeded=int(r["succeeded"]),
            failed=int(r["failed"]),
            cancelled=int(r["cancelled"]),
            pending=int(r["pending"]),
            callback_status=JobStatus(r["callback_status"]),
        )

    async def job_parents(self, *, id: UUID, limit: int) -> list[Relative]:
        with _WORKFLOW:
            rows = await self.db.fetch(Q.job_parents.sql, id, limit)
        return [_relative(r) for r in rows]

    async def job_children(self, *, id: UUID, limit: int) -> list[Relative]:
        with _WORKFLOW:
            rows = await self.db.fetch(Q.job_children.sql, id, limit)
        return [_relative(r) for r in rows]

    async def job_status_get(self, *, id: UUID) -> JobStatus | None:
        with _STATUS:
            status = await self.db.fetchval(Q.job_status_get.sql, id)
        return None if status is None else JobStatus(status)

    async def job_status_many(self, *, ids: Sequence[UUID]) -> dict[UUID, JobStatus]:
        with _STATUSES:
            rows = await self.db.fetch(Q.job_status_many.sql, ids)
        return {r["id"]: JobStatus(r["status"]) for r in rows}

    async def job_list_recent(
        self, *, status: JobStatus | None, name: str | None, limit: int
    ) -> list[Job]:
        """The newest jobs first, optionally of one status and one name."""
        st = None if status is None else status.value
        with _RECENT:
            rows = await self.db.fetch(Q.job_list_recent.sql, st, name, limit)
        return [job_from_record(r) for r in rows]

    async def job_count_by_status(self) -> dict[JobStatus, int]:
        """Jobs per status, for the statuses that have any."""
        with _COUNTS:
            rows = await self.db.fetch(Q.job_count_by_status.sql)
        return {JobStatus(r["status"]): r["n"] for r in rows}

    async def job_count_queued(
        self, *, name: str | None, limit: int | None, horizon: float = 0.0
    ) -> int:
        """The runnable backlog (of one name, or all) with the jobs due within
        ``horizon`` seconds, counted up to ``limit``."""
        with _BACKLOG:
            return int(await self.db.fetchval(Q.job_count_queued.sql, name, limit, horizon))

    async def job_count_queued_by_names(
        self, *, names: Sequence[str], limit: int | None, horizon: float = 0.0
    ) -> dict[str, int]:
        with _BACKLOG_BY_NAME:
            rows = await self.db.fetch(Q.job_count_queued_by_names.sql, names, limit, horizon)
        return {r["name"]: int(r["n"]) for r in rows}

    # ------------------------------------------------------------ management

    async def job_retry(self, *, id: UUID) -> Job | None:
        """The job queued again, or None when it is not failed or cancelled. A job
        in history is moved back to the jobs table first, in the same transaction;
        once more if the leader moved it to history meanwhile."""
        row = None
        for _ in range(2):
            async with self.transaction("retry") as tx:
                with _RETRY:
                    restored = await tx.db.fetchval(Q.jobs_history_restore.sql, [id], None)
                    row = await tx.db.fetchrow(Q.job_retry.sql, id)
            if row is not None or restored:
                break
        return None if row is None else job_from_record(row)

    async def job_reschedule(
        self, *, id: UUID, run_at: datetime | None, delay_seconds: float
    ) -> tuple[Job, bool] | None:
        """The job moved (and whether it is due now), or None when it is not queued."""
        with _RESCHEDULE:
            row = await self.db.fetchrow(Q.job_reschedule.sql, id, run_at, delay_seconds)
        return None if row is None else (job_from_record(row), bool(row["due"]))

    async def job_permanently_fail(self, *, id: UUID, reason: str) -> Job | None:
        with _PERMANENTLY_FAIL:
            row = await self.db.fetchrow(Q.job_permanently_fail.sql, id, reason)
        return None if row is None else job_from_record(row)

    async def job_complete(self, *, id: UUID) -> Job | None:
        with _COMPLETE:
            row = await self.db.fetchrow(Q.job_complete.sql, id)
        return None if row is None else job_from_record(row)

    async def jobs_history_move(self, *, older_than_seconds: float, batch_size: int) -> int:
        """Move one batch of jobs finished longer ago than the cutoff to history."""
        with _HISTORY:
            return int(
                await self.db.fetchval(Q.jobs_history_move.sql, older_than_seconds, batch_size)
            )

    async def jobs_history_prepare(self, *, ahead_days: int, retention: float | None) -> int:
        """Create history's missing day partitions, from the oldest finished job
        still to move (not before the retention's cutoff) to ``ahead_days`` after
        today; how many were created."""
        with _HISTORY:
            return int(await self.db.fetchval(Q.jobs_history_prepare.sql, ahead_days, retention))

    async def jobs_history_drop(
        self, *, older_than_seconds: float, lock_timeout: str = "5s", exact: bool = False
    ) -> list[tuple[str, int]]:
        """Drop history's whole days finished longer ago than the cutoff (and the
        DEFAULT partition's rows before it): (partition, its rows) each, estimated
        unless ``exact``."""
        with _HISTORY:
            rows = await self.db.fetch(
                Q.jobs_history_drop.sql, older_than_seconds, lock_timeout, exact
            )
        return [(r["partition"], int(r["n"])) for r in rows]

    async def jobs_history_prune(self, *, older_than_seconds: float, batch_size: int) -> int:
        """Delete one batch of history's rows finished longer ago than the cutoff."""
        with _PRUNE:
            return int(
                await self.db.fetchval(Q.jobs_history_prune.sql, older_than_seconds, batch_size)
            )

    async def job_prune_finished(self, *, older_than_seconds: float, batch_size: int) -> int:
        """Delete one batch of jobs finished longer ago than the cutoff; how many."""
        with _PRUNE:
            return int(
                await self.db.fetchval(Q.job_prune_finished.sql, older_than_seconds, batch_size)
            )

    async def worker_list(self) -> list[WorkerInfo]:
        with _WORKERS:
            rows = await self.db.fetch(Q.worker_list.sql)
        return [worker_from_record(r) for r in rows]

    async def worker_force_unlock(self, *, worker_id: UUID) -> ForceUnlock:
        with _FORCE_UNLOCK:
            row = await self.db.fetchrow(Q.worker_force_unlock.sql, worker_id)
        assert row is not None  # a SELECT without FROM: always one row
        return ForceUnlock(int(row["requeued"]), int(row["failed"]), bool(row["deregistered"]))

    # ------------------------------------------------------------ flow control

    async def limits_set(self, *, name: str, spec: LimitSpec) -> Limit:
        """An operator's limits for ``name`` (its pause kept)."""
        with _LIMITS:
            row = await self.db.fetchrow(
                Q.limits_set.sql, name, spec.concurrency, spec.rate, spec.per, spec.per_key
            )
        assert row is not None  # an upsert returns its row
        return _limit(row)

    async def limits_set_default(self, *, name: str, spec: LimitSpec) -> tuple[Limit, bool]:
        """A code default for ``name``: the stored limit, and whether this wrote it
        (False: an operator's value is there and wins)."""
        with _LIMITS:
            row = await self.db.fetchrow(
                Q.limits_set_default.sql,
                name,
                spec.concurrency,
                spec.rate,
                spec.per,
                spec.per_key,
            )
        assert row is not None  # written, or the row that stopped the write
        return _limit(row), bool(row["wrote"])

    async def limits_clear(self, *, name: str) -> bool:
        with _LIMITS:
            return bool(await self.db.fetchval(Q.limits_clear.sql, name))

    async def limits_list(self) -> list[Limit]:
        with _LIMITS:
            rows = await self.db.fetch(Q.limits_list.sql)
        return [_limit(r) for r in rows]

    async def pause(self, *, kind: str, name: str) -> datetime:
        """Pause a job name (``kind`` "name") or a named queue ("queue"); since when."""
        query = Q.pause_name if kind == "name" else Q.pause_queue
        with _LIMITS:
            return cast(datetime, await self.db.fetchval(query.sql, name))

    async def resume(self, *, kind: str, name: str) -> bool:
        """Resume a job name or a named queue; whether it was paused."""
        query = Q.resume_name if kind == "name" else Q.resume_queue
        with _LIMITS:
            return bool(await self.db.fetchval(query.sql, name))

    async def paused_list(self) -> list[Paused]:
        with _LIMITS:
            rows = await self.db.fetch(Q.paused_list.sql)
        return [Paused(r["kind"], r["name"], r["paused_at"]) for r in rows]

    async def jobs_waiting_on_limit(self) -> list[tuple[str, str, int]]:
        """``(job name, reason, due jobs)`` held back by a pause or a binding limit."""
        with _LIMITS:
            rows = await self.db.fetch(Q.jobs_waiting_on_limit.sql)
        return [(r["name"], r["reason"], int(r["n"])) for r in rows]

    # ------------------------------------------------------------ claim loop
    #
    # The claim loop's statements raise the driver's errors untranslated: the loop
    # classifies them itself (is_connection_error) and bounds them with its own
    # timeouts, on a connection it holds across rounds.

    async def job_complete_and_claim(
        self,
        *,
        ids: Sequence[UUID],
        tokens: Sequence[UUID | None],
        actions: Sequence[str],
        delays: Sequence[float | None],
        errors: Sequence[str | None],
        ran: Sequence[float | None],
        results: Sequence[str | None],
        worker_id: UUID,
        job_names: Sequence[str],
        queue_names: Sequence[str] | None,
        limit: int,
        start: int,
        started: Sequence[UUID],
        flow: bool = True,
    ) -> list[Record]:
        """The claim loop's one round trip: write the outcomes (one per ``ids``
        entry, the other sequences aligned with it; ``ran``: seconds since the
        handler started, for a job whose claim left ``started_at`` empty), mark
        ``started`` the held jobs the worker has started since, and claim up to
        ``limit`` jobs, the first ``start`` of them started now and the rest held
        ahead (``held`` true).
        Rows with ``claimed`` false are the outcomes applied (only ``id`` set); the
        others are claimed jobs, for :func:`round_result`. ``flow`` false: the
        statement without flow control's steps, for a worker the last round found
        none in play for (see :func:`flow_active`)."""
        query = Q.job_complete_and_claim if flow else Q.job_complete_and_claim_lean
        return await self.db.fetch(
            query.sql,
            ids,
            tokens,
            _uniform(actions),
            _sparse(delays),
            _sparse(errors),
            worker_id,
            job_names,
            queue_names,
            limit,
            start,
            started,
            _sparse(ran),
            _joined(results),
        )

    async def job_next_due(
        self, *, job_names: Sequence[str], queue_names: Sequence[str] | None
    ) -> float | None:
        """Seconds until the next scheduled job of these names is due, or None."""
        value = await self.db.fetchval(Q.job_next_due.sql, job_names, queue_names)
        return None if value is None else float(value)

    async def claim_session_begin(self) -> None:
        """The claim connection's planner settings, for its whole session."""
        await self.db.execute(Q.claim_session_begin.sql)

    async def claim_session_end(self) -> None:
        await self.db.execute(Q.claim_session_end.sql)

    async def claim_transaction_begin(self) -> None:
        """Behind a transaction-mode pooler: the claim round's own transaction,
        carrying the planner settings."""
        await self.db.execute(Q.claim_transaction_begin.sql)

    async def claim_transaction_commit(self) -> None:
        await self.db.execute(Q.claim_transaction_commit.sql)

    async def claim_transaction_rollback(self) -> None:
        await self.db.execute(Q.claim_transaction_rollback.sql)

    async def job_release_unknown(self, *, worker_id: UUID, known_ids: Sequence[UUID]) -> int:
        """Queue again every job ``worker_id`` holds but is not running (claimed by a
        round whose answer was lost); how many."""
        return int(await self.db.fetchval(Q.job_release_unknown.sql, worker_id, known_ids))

    # ------------------------------------------------------------ worker services

    async def worker_heartbeat(
        self,
        *,
        id: UUID,
        hostname: str,
        pid: int,
        concurrency: int,
        job_names: Sequence[str],
        queue_names: Sequence[str] | None,
        version: str,
        lease_seconds: float,
        lead: bool,
    ) -> HeartbeatBeat:
        """Register or refresh the worker; take or renew the leadership if ``lead``."""
        with _HEARTBEAT:
            row = await self.db.fetchrow(
                Q.worker_heartbeat.sql,
                id,
                hostname,
                pid,
                concurrency,
                job_names,
                queue_names,
                version,
                lease_seconds,
                lead,
            )
        assert row is not None  # the upsert always returns its row
        return HeartbeatBeat(bool(row["inserted"]), row["started_at"], bool(row["leader"]))

    async def worker_deregister(self, *, worker_id: UUID) -> None:
        with _DEREGISTER:
            await self.db.execute(Q.worker_deregister.sql, worker_id)

    async def job_rescue(self, *, limit: int) -> list[RescuedRow]:
        """Recover up to ``limit`` jobs of expired workers; deregister those workers."""
        with _RESCUE:
            rows = await self.db.fetch(Q.job_rescue.sql, limit)
        return [RescuedRow(r["id"], r["name"], r["status"], r["worker_id"]) for r in rows]

    async def jobs_table_health(self) -> TableHealth | None:
        with _VACUUM_CHECK:
            row = await self.db.fetchrow(Q.jobs_table_health.sql)
        if row is None:
            return None
        return TableHealth(
            bool(row["autovacuum"]),
            int(row["dead_tuples"]),
            int(row["live_tuples"]),
            int(row["analyzed_tuples"]),
        )

    async def jobs_vacuum(self) -> None:
        with _VACUUM:
            await self.db.execute(Q.jobs_vacuum.sql)

    async def jobs_analyze(self) -> None:
        with _VACUUM:
            await self.db.execute(Q.jobs_analyze.sql)

    async def ping(self) -> None:
        """One round trip (the listener's keepalive)."""
        with _PING:
            await self.db.fetchval(Q.ping.sql)

    # ------------------------------------------------------------ metrics

    async def lease_acquire(self, *, role: str, holder: UUID, lease_seconds: float) -> bool:
        """Take or renew the lease on ``role``; True when ``holder`` holds it."""
        with _METRICS:
            return bool(await self.db.fetchval(Q.lease_acquire.sql, role, holder, lease_seconds))

    async def lease_release(self, *, role: str, holder: UUID) -> None:
        with _METRICS:
            await self.db.execute(Q.lease_release.sql, role, holder)

    async def queue_stats(self) -> list[KindStats]:
        with _METRICS:
            rows = await self.db.fetch(Q.queue_stats.sql)
        return [
            KindStats(
                r["name"],
                int(r["queued"]),
                int(r["scheduled"]),
                float(r["oldest_age"]),
                int(r["running"]),
                int(r["dead"]),
            )
            for r in rows
        ]

    async def job_count_waiting(self) -> dict[str, int]:
        """Jobs waiting on parents, by name."""
        with _METRICS:
            rows = await self.db.fetch(Q.job_count_waiting.sql)
        return {r["name"]: int(r["waiting"]) for r in rows}

    async def workers_alive(self) -> int:
        with _METRICS:
            return int(await self.db.fetchval(Q.workers_alive.sql))

    # ------------------------------------------------------------ cron

    async def cron_now(self) -> datetime:
        """The database clock: the reference of every cron decision."""
        with _CRON:
            value: datetime = await self.db.fetchval(Q.cron_now.sql)
        return value

    async def cron_register(
        self,
        *,
        id: str,
        job_name: str,
        definition: str,
        last_occurrence: datetime,
        latest: datetime,
    ) -> CronRegistration | None:
        """Record a schedule (see queries.sql); None when it was recorded as it is."""
        with _CRON_PREPARE:
            row = await self.db.fetchrow(
                Q.cron_register.sql, id, job_name, definition, last_occurrence, latest
            )
        if row is None:
            return None
        return CronRegistration(
            bool(row["inserted"]),
            row["definition"],
            row["last_occurrence"],
            row["previous_definition"],
            row["previous_job_name"],
        )

    async def cron_get(self, *, id: str) -> CronState | None:
        with _CRON:
            row = await self.db.fetchrow(Q.cron_get.sql, id)
        if row is None:
            return None
        return CronState(
            row["id"],
            row["job_name"],
            row["definition"],
            row["last_occurrence"],
            row["last_job_id"],
        )

    async def cron_advance(
        self, *, id: str, definition: str, job_name: str, occurrence: datetime
    ) -> datetime | None:
        """Hand ``occurrence`` to the current transaction (compare-and-set); None
        when refused."""
        with _CRON:
            value: datetime | None = await self.db.fetchval(
                Q.cron_advance.sql, id, definition, job_name, occurrence
            )
        return value

    async def cron_record_job(self, *, id: str, job_id: UUID) -> bool:
        """Remember the occurrence's job; True when this transaction created it."""
        with _CRON:
            return bool(await self.db.fetchval(Q.cron_record_job.sql, id, job_id))

    # ------------------------------------------------------------ console

    async def console_jobs_window_end(
        self, *, before: UUID, floor: UUID, offset: int
    ) -> UUID | None:
        with _CONSOLE:
            value: UUID | None = await self.db.fetchval(
                CQ.console_jobs_window_end.sql, before, floor, offset
            )
        return value

    async def console_jobs_page(
        self,
        *,
        status: JobStatus | None,
        name: str | None,
        queue: str | None,
        before: UUID,
        floor: UUID,
        limit: int,
        key: str | None = None,
    ) -> list[Record]:
        """A page of jobs (no payloads), newest first: the console reads its rows."""
        st = None if status is None else status.value
        with _CONSOLE:
            return await self.db.fetch(
                CQ.console_jobs_page.sql, st, name, queue, before, floor, limit, key
            )

    async def console_now(self) -> datetime:
        with _CONSOLE:
            value: datetime = await self.db.fetchval(CQ.console_now.sql)
        return value

    async def console_leases(self) -> list[Record]:
        with _CONSOLE:
            return await self.db.fetch(CQ.console_leases.sql)

    async def console_dead_count(self, *, name: str) -> int:
        with _CONSOLE:
            return int(await self.db.fetchval(CQ.console_dead_count.sql, name))

    async def console_retry_dead(self, *, name: str) -> tuple[int, int]:
        """(retried, skipped because another job holds their key)."""
        async with self.transaction("console") as tx:
            with _CONSOLE:
                await tx.db.fetchval(Q.jobs_history_restore.sql, [], name)
                row = await tx.db.fetchrow(CQ.console_retry_dead.sql, name)
        assert row is not None  # a SELECT without FROM: always one row
        return int(row["retried"]), int(row["skipped"])

    async def console_cancel_dead(self, *, name: str) -> int:
        async with self.transaction("console") as tx:
            with _CONSOLE:
                await tx.db.fetchval(Q.jobs_history_restore.sql, [], name)
                return int(await tx.db.fetchval(CQ.console_cancel_dead.sql, name))

    async def console_worker_jobs(self, *, worker_id: UUID, limit: int) -> list[Record]:
        with _CONSOLE:
            return await self.db.fetch(CQ.console_worker_jobs.sql, worker_id, limit)

    async def console_crons(self) -> list[Record]:
        with _CONSOLE:
            return await self.db.fetch(CQ.console_crons.sql)

    # ------------------------------------------------------------ access

    async def revocation_list(self) -> list[Revocation]:
        with _ACCESS:
            rows = await self.db.fetch(AQ.revocation_list.sql)
        return [Revocation(r["name"], r["revoked_at"], r["reason"]) for r in rows]

    async def revocation_check(self, *, name: str) -> bool:
        with _ACCESS:
            return bool(await self.db.fetchval(AQ.revocation_check.sql, name))

    async def revocation_add(self, *, name: str, reason: str) -> tuple[bool, int]:
        """(newly revoked, console sessions ended); every replica is notified."""
        with _ACCESS:
            row = await self.db.fetchrow(AQ.revocation_add.sql, name, reason)
        assert row is not None
        return bool(row["added"]), int(row["sessions_ended"])

    async def revocation_remove(self, *, name: str) -> bool:
        with _ACCESS:
            return bool(await self.db.fetchval(AQ.revocation_remove.sql, name))

    async def session_create(
        self,
        *,
        id: bytes,
        credential: str,
        credential_digest: bytes,
        csrf: str,
        lifetime: float,
        idle: int,
    ) -> None:
        with _ACCESS:
            await self.db.execute(
                AQ.session_create.sql, id, credential, credential_digest, csrf, lifetime, idle
            )

    async def session_touch(self, *, id: bytes) -> SessionState | None:
        with _ACCESS:
            row = await self.db.fetchrow(AQ.session_touch.sql, id)
        if row is None:
            return None
        return SessionState(
            row["credential"],
            bytes(row["credential_digest"]),
            row["csrf"],
            row["notice"],
            row["remaining"].total_seconds(),
        )

    async def session_notice_set(self, *, id: bytes, notice: str) -> None:
        with _ACCESS:
            await self.db.execute(AQ.session_notice_set.sql, id, notice)

    async def session_delete(self, *, id: bytes) -> bool:
        with _ACCESS:
            return bool(await self.db.fetchval(AQ.session_delete.sql, id))

    async def session_count_by_credential(self) -> list[Record]:
        with _ACCESS:
            return await self.db.fetch(AQ.session_count_by_credential.sql)


def _limit(r: Record) -> Limit:
    return Limit(
        name=r["name"],
        concurrency=r["concurrency"],
        rate=r["rate"],
        per=float(r["per"]),
        per_key=bool(r["per_key"]),
        source=r["source"],
        paused_at=r["paused_at"],
        updated_at=r["updated_at"],
    )


def _relative(r: Record) -> Relative:
    return Relative(r["id"], r["name"], JobStatus(r["status"]), r["run_anyway"], r["batch"])
