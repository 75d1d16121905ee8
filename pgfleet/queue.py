"""The producer side: enqueue jobs and manage them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, NoReturn
from uuid import UUID

from pgfleet._runtime import tracing
from pgfleet._runtime.waiting import Waiters, shared_waiters, waiters_of
from pgfleet.db.connect import create_pool as create_pool  # public: pgfleet.create_pool
from pgfleet.db.deadlines import AppPool
from pgfleet.db.plans import DEFAULT_MAX_ATTEMPTS, Batch, Enqueuer, as_job_id
from pgfleet.db.store import Store
from pgfleet.db.types import Connection
from pgfleet.errors import (
    InvalidJobState,
    InvalidOptions,
    JobNotFound,
)
from pgfleet.jobs import (
    BatchProgress,
    EnqueueOptions,
    EnqueueRequest,
    Job,
    JobStatus,
    NotifyMode,
    Relative,
    WorkerInfo,
    validate_name,
)
from pgfleet.limits import Limit, LimitSpec, Paused, check_target
from pgfleet.payloads import DEFAULT_MAX_PAYLOAD_BYTES

log = logging.getLogger("pgfleet")

__all__ = ["DEFAULT_MAX_ATTEMPTS", "NotifyMode", "Queue", "create_pool"]


class _Waker:
    """Coalesces post-commit wakeups: at most one notifying statement in flight per
    queue (an insert carrying its own NOTIFY, or a NOTIFY on its own), and one more
    after it when anything committed without one while it was in flight."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending = False
        self._inline = False
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def take_inline(self) -> bool:
        """Claim the right to notify from the caller's own insert; False while
        another notifying statement of this queue is in flight."""
        if self._inline or (self._task is not None and not self._task.done()):
            return False
        self._inline = True
        return True

    def release_inline(self) -> None:
        self._inline = False
        if self._pending:
            self._start()

    def request(self) -> None:
        self._pending = True
        if not self._inline:
            self._start()

    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while self._pending:
            self._pending = False
            try:
                await self._store.notify_wakeup()
                self.sent += 1
            except Exception as exc:  # polling still finds the jobs
                log.debug("wakeup notification failed: %s", exc)
                return

    async def flush(self) -> None:
        task = self._task
        if task is not None:
            await asyncio.shield(task)


class Queue:
    """Enqueue jobs into Postgres and manage them.

    ``pool`` is the application's asyncpg pool. ``known_names`` turns on strict
    mode: enqueueing a name outside it (a Registry or a collection of names) raises
    :class:`UnknownJobName`. With ``check_payloads`` (``known_names`` a Registry), a
    payload its handler's annotated type cannot decode raises :class:`PayloadError`
    instead of being enqueued to fail at the worker.
    """

    def __init__(
        self,
        pool: AppPool,
        *,
        notify: NotifyMode | str = NotifyMode.COALESCED,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        known_names: Any = None,
        check_payloads: bool = False,
    ) -> None:
        try:
            self.notify_mode = NotifyMode(notify)
        except ValueError:
            allowed = ", ".join(m.value for m in NotifyMode)
            raise InvalidOptions(
                f"unknown notify mode {notify!r}: expected one of {allowed}"
            ) from None
        self._enqueuer = Enqueuer(
            max_payload_bytes=max_payload_bytes,
            default_max_attempts=default_max_attempts,
            known_names=known_names,
            check_payloads=check_payloads,
        )
        self._pool = pool
        self._store = Store(pool)
        self._waker = _Waker(self._store)
        #: Called with (name, count) after jobs commit through this queue (metrics hook).
        self.on_enqueued: Callable[[str, int], None] | None = None

    @property
    def pool(self) -> AppPool:
        return self._pool

    # ------------------------------------------------------------ enqueue

    async def enqueue(
        self,
        name: str,
        payload: Any = None,
        *,
        options: EnqueueOptions | None = None,
        connection: Connection | None = None,
    ) -> UUID:
        """Enqueue one job and return its id (an existing job's id when its job_key
        deduplicates). With ``connection``, the job commits or rolls back with the
        caller's transaction."""
        tracer = tracing.current_tracer()
        if tracer is None:
            return await self._enqueue(name, payload, options, connection, None)
        with tracing.enqueue_span(tracer, str(name)) as trace:
            return await self._enqueue(name, payload, options, connection, trace)

    async def _enqueue(
        self,
        name: str,
        payload: Any,
        options: EnqueueOptions | None,
        connection: Connection | None,
        trace: str | None,
    ) -> UUID:
        opts = self._enqueuer.options(options)
        if opts.job_key is not None or opts.after:
            ids = await self._enqueue_many([EnqueueRequest(name, payload, opts)], connection, trace)
            return ids[0]
        wake_in_tx, wake_after = self._wake_plan(connection, opts.runs_now)
        # The coalesced wakeup of a lone enqueue rides in its own insert.
        inline = wake_after and self._waker.take_inline()
        if inline:
            wake_in_tx, wake_after = True, False
        try:
            job_id, statement = self._enqueuer.single(
                name, payload, opts, notify=wake_in_tx, trace=trace
            )
            store = self._store if connection is None else Store(connection)
            await store.enqueue_one(statement)
        finally:
            if inline:
                self._waker.release_inline()
        if wake_after:
            self._waker.request()
        if self.on_enqueued is not None:
            self.on_enqueued(name, 1)
        return job_id

    async def enqueue_many(
        self, requests: Iterable[EnqueueRequest], *, connection: Connection | None = None
    ) -> list[UUID]:
        """Enqueue a batch atomically and return the ids in request order.

        One statement per job-key mode in one transaction (a savepoint inside the
        caller's transaction). A job_key repeated within the batch raises
        :class:`DuplicateJobKey` and nothing is inserted.
        """
        tracer = tracing.current_tracer()
        if tracer is None:
            return await self._enqueue_many(requests, connection, None)
        requests = list(requests)
        name = tracing.batch_name(getattr(r, "name", "?") for r in requests)
        with tracing.enqueue_span(tracer, str(name), len(requests)) as trace:
            return await self._enqueue_many(requests, connection, trace)

    async def enqueue_batch(
        self,
        requests: Iterable[EnqueueRequest],
        *,
        callback: EnqueueRequest,
        connection: Connection | None = None,
    ) -> tuple[UUID, list[UUID]]:
        """Enqueue jobs as one batch, atomically, with a callback job that runs
        once, when every one of them has finished (succeeded, failed for good or
        cancelled). Returns ``(batch_id, member ids)``: the batch's id is its
        callback's.

        The callback's payload must be a JSON object (or None); when it becomes
        due, its ``batch`` key holds ``{"id", "size", "succeeded", "failed",
        "cancelled"}``. :meth:`batch_progress` reads the batch meanwhile."""
        batch = self._enqueuer.batch(requests, callback=callback)
        ids = await self._run_batch(batch, connection, None)
        return ids[-1], ids[:-1]

    async def enqueue_chain(
        self, requests: Iterable[EnqueueRequest], *, connection: Connection | None = None
    ) -> list[UUID]:
        """Enqueue "A then B then C": each job waits for the one before it to
        succeed; one that fails for good or is cancelled cancels the rest. Returns
        the ids in order."""
        return await self._run_batch(self._enqueuer.chain(requests), connection, None)

    async def batch_progress(self, batch_id: UUID | str) -> BatchProgress:
        """How far a batch (:meth:`enqueue_batch`) got: members finished by
        outcome, pending, and the callback's status."""
        uid = self._require_uuid(batch_id)
        progress = await self._store.batch_progress(id=uid)
        if progress is None:
            raise JobNotFound(uid)
        return progress

    async def parents(self, job_id: UUID | str, *, limit: int = 100) -> list[Relative]:
        """The jobs ``job_id`` waits (or waited) on, with their status."""
        return await self._store.job_parents(id=self._require_uuid(job_id), limit=_limit(limit))

    async def children(self, job_id: UUID | str, *, limit: int = 100) -> list[Relative]:
        """The jobs waiting (or that waited) on ``job_id``, with their status."""
        return await self._store.job_children(id=self._require_uuid(job_id), limit=_limit(limit))

    async def _enqueue_many(
        self,
        requests: Iterable[EnqueueRequest],
        connection: Connection | None,
        trace: str | None,
    ) -> list[UUID]:
        return await self._run_batch(self._enqueuer.batch(requests), connection, trace)

    async def _run_batch(
        self, batch: Batch, connection: Connection | None, trace: str | None
    ) -> list[UUID]:
        if not batch.size:
            return []
        wake_in_tx, wake_after = self._wake_plan(connection, batch.any_runs_now)
        store = self._store if connection is None else Store(connection)
        ids = await store.enqueue_batch(batch, notify=wake_in_tx, trace=trace)
        if wake_after:
            self._waker.request()
        if self.on_enqueued is not None:
            for name, count in batch.names().items():
                self.on_enqueued(name, count)
        return ids

    def _wake_plan(self, connection: Connection | None, runs_now: bool) -> tuple[bool, bool]:
        """(notify inside the transaction, request a coalesced wakeup after)."""
        mode = self.notify_mode
        if mode is NotifyMode.OFF or not runs_now:
            return False, False
        if mode is NotifyMode.TRANSACTION:
            return True, False
        if connection is not None and connection.is_in_transaction():
            return True, False
        return False, True

    async def flush_notifications(self) -> None:
        """Wait until the coalesced wakeup requested so far has been sent."""
        await self._waker.flush()

    # ------------------------------------------------------------ reading

    async def get(self, job_id: UUID | str) -> Job | None:
        """The job with that id, or None."""
        return await self._store.get(job_id)

    async def recent(
        self,
        limit: int = 50,
        *,
        status: JobStatus | str | None = None,
        name: str | None = None,
    ) -> list[Job]:
        """The most recently created jobs, newest first, optionally filtered."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
            raise InvalidOptions(f"limit must be an integer from 1 to 10000, got {limit!r}")
        st = None if status is None else JobStatus.parse(status)
        if name is not None:
            validate_name(name)
        return await self._store.job_list_recent(status=st, name=name, limit=limit)

    async def counts(self) -> dict[JobStatus, int]:
        """Exact job totals by status (every status present, zeros included).

        Scans all retained jobs: do not call it at high frequency on large tables.
        """
        out = dict.fromkeys(JobStatus, 0)
        out.update(await self._store.job_count_by_status())
        return out

    async def runnable_backlog(
        self, name: str | None = None, *, at_most: int | None = None, horizon: float = 0.0
    ) -> int:
        """Jobs due now and waiting for a worker, of one name or all; with
        ``horizon`` (seconds), the queued jobs due within it too.

        With ``at_most``, counting stops there: checking a backlog against a cap
        then costs at most the cap, however deep the backlog is.
        """
        if name is not None:
            validate_name(name)
        limit = _count_limit(at_most)
        return await self._store.job_count_queued(name=name, limit=limit, horizon=_horizon(horizon))

    async def runnable_backlog_by_name(
        self, names: Iterable[str], *, at_most: int | None = None, horizon: float = 0.0
    ) -> dict[str, int]:
        """The runnable backlog of each name (each counted up to ``at_most``), with
        the jobs due within ``horizon`` seconds."""
        wanted = sorted({validate_name(n) for n in names})
        if not wanted:
            return {}
        limit = _count_limit(at_most)
        return await self._store.job_count_queued_by_names(
            names=wanted, limit=limit, horizon=_horizon(horizon)
        )

    async def statuses(self, job_ids: Iterable[UUID | str]) -> dict[UUID, JobStatus]:
        """The current status of each job that exists, by id, in one query."""
        uids = [u for u in map(as_job_id, job_ids) if u is not None]
        if not uids:
            return {}
        return await self._store.job_status_many(ids=uids)

    async def workers(self) -> list[WorkerInfo]:
        """Registered workers, stale registrations not yet recovered included."""
        return await self._store.worker_list()

    # ------------------------------------------------------------ management

    async def cancel(self, job_id: UUID | str, *, by: str | None = None) -> Job:
        """Cancel a job. A queued one ends ``cancelled`` at once. A running one is
        asked to stop: the worker holding it is told, its handler sees
        :func:`pgfleet.cancel_requested` and (async) is cancelled after the
        worker's ``cancel_grace_period``; the job returned is still ``running``,
        with ``cancel_requested_at`` set, and ends ``cancelled`` (or
        ``succeeded``, if its handler finished first: never both; never retried).
        ``by`` names who cancelled (``cancelled_by``; default ``application``).
        Finished jobs are refused with :class:`InvalidJobState`."""
        return await self._store.cancel(job_id, by)

    async def wait(self, job_id: UUID | str, *, timeout: float | None = None) -> Job:
        """Wait until the job has finished (succeeded, failed or cancelled) and
        return it, its ``result`` and ``errors`` included. Raises
        :class:`TimeoutError` after ``timeout`` seconds (None: no limit) and
        :class:`JobNotFound` when there is no such job.

        Every waiter on this queue's pool in this process, through any ``Queue``,
        shares one LISTEN connection (held while anyone waits); a poll every
        second covers lost notifications."""
        uid = self._require_uuid(job_id)
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0
        ):
            raise InvalidOptions(
                f"timeout must be a non-negative number of seconds, got {timeout!r}"
            )
        return await shared_waiters(self._pool).wait(uid, timeout)

    @property
    def waiters(self) -> Waiters | None:
        """The state shared by the waiters on this queue's pool in this process
        (None while nobody waits on it)."""
        return waiters_of(self._pool)

    async def retry(self, job_id: UUID | str) -> Job:
        """Run a failed or cancelled job again now, with fresh attempts."""
        uid = self._require_uuid(job_id)
        job = await self._store.job_retry(id=uid)
        if job is None:
            await self._refused(uid, "retry", ("failed", "cancelled"))
        self._wake()
        return job

    async def reschedule(
        self,
        job_id: UUID | str,
        *,
        run_at: datetime | None = None,
        delay: timedelta | float | None = None,
    ) -> Job:
        """Move a queued job to a new run_at (or now + delay; now when neither)."""
        opts = EnqueueOptions(run_at=run_at, delay=delay)
        uid = self._require_uuid(job_id)
        moved = await self._store.job_reschedule(
            id=uid, run_at=opts.run_at, delay_seconds=opts.delay_seconds
        )
        if moved is None:
            await self._refused(uid, "reschedule", ("queued",))
        job, due = moved
        if due:
            self._wake()
        return job

    async def permanently_fail(self, job_id: UUID | str, reason: str = "failed by operator") -> Job:
        """Fail a queued or running job for good. A running handler is not
        interrupted, but its lock is released and its outcome discarded."""
        if not isinstance(reason, str) or not reason:
            raise InvalidOptions("reason must be a non-empty string")
        uid = self._require_uuid(job_id)
        job = await self._store.job_permanently_fail(id=uid, reason=reason)
        if job is None:
            await self._refused(uid, "permanently_fail", ("queued", "running"))
        if job.queue_name is not None:
            self._wake()
        return job

    async def complete(self, job_id: UUID | str) -> Job:
        """Retire a queued or running job as succeeded. A running handler is not
        interrupted, but its lock is released and its outcome discarded."""
        uid = self._require_uuid(job_id)
        job = await self._store.job_complete(id=uid)
        if job is None:
            await self._refused(uid, "complete", ("queued", "running"))
        if job.queue_name is not None:
            self._wake()
        return job

    async def force_unlock_worker(self, worker_id: UUID | str) -> dict[str, int]:
        """Requeue everything a gone worker holds and deregister it, at once.

        Jobs out of attempts are failed instead. Calling this for a live worker can
        make its in-flight jobs run a second time concurrently. Returns counts:
        ``requeued``, ``failed`` and ``deregistered`` (1 if the worker was registered).
        """
        uid = self._require_uuid(worker_id, "worker")
        done = await self._store.worker_force_unlock(worker_id=uid)
        result = {
            "requeued": done.requeued,
            "failed": done.failed,
            "deregistered": int(done.deregistered),
        }
        if result["requeued"]:
            self._wake()
        log.info("force-unlocked worker %s: %s", uid, result)
        return result

    async def prune_finished(self, older_than: timedelta | float, *, batch_size: int = 1000) -> int:
        """Delete succeeded, failed and cancelled jobs finished longer ago than
        ``older_than``, in batches of ``batch_size``; return how many. In history,
        whole days past the cutoff are dropped, and the rest deleted in batches."""
        seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else older_than
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise InvalidOptions(f"older_than must be a non-negative duration, got {older_than!r}")
        if not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000:
            raise InvalidOptions(f"batch_size must be from 1 to 100000, got {batch_size!r}")
        total = 0
        while True:
            n = await self._store.job_prune_finished(
                older_than_seconds=float(seconds), batch_size=batch_size
            )
            total += n
            if n < batch_size:
                break
        dropped = await self._store.jobs_history_drop(older_than_seconds=float(seconds), exact=True)
        total += sum(n for _, n in dropped)
        while True:
            n = await self._store.jobs_history_prune(
                older_than_seconds=float(seconds), batch_size=batch_size
            )
            total += n
            if n < batch_size:
                return total

    # ------------------------------------------------------------ flow control

    async def set_limits(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: int | None = None,
        per: float | timedelta = 1.0,
        per_key: bool = False,
    ) -> Limit:
        """Limit job ``name`` fleet-wide: at most ``concurrency`` running at once,
        at most ``rate`` attempts started in any window of ``per`` seconds;
        ``per_key``: for each ``limit_key`` on its own. An operator's value: it
        replaces any limit of the name and a code default never overwrites it.
        Workers obey it from their next claim round. Bad values raise
        :class:`InvalidOptions` and write nothing."""
        validate_name(name)
        spec = LimitSpec.check(concurrency=concurrency, rate=rate, per=per, per_key=per_key)
        limit = await self._store.limits_set(name=name, spec=spec)
        log.info("limits of %s set: %s", name, spec)
        return limit

    async def clear_limits(self, name: str) -> bool:
        """Remove job ``name``'s limits (a pause stays); whether it had any. A
        default declared in code is written again by the next worker that starts."""
        validate_name(name)
        return await self._store.limits_clear(name=name)

    async def limits(self) -> list[Limit]:
        """Every job name with a limit or a pause, by name."""
        return await self._store.limits_list()

    async def pause(self, name: str | None = None, *, queue_name: str | None = None) -> datetime:
        """Stop new starts of job ``name`` (or of named queue ``queue_name``) across
        the fleet until :meth:`resume`: running jobs finish, enqueues are still
        accepted. Durable. Returns when it was paused."""
        kind, target = check_target(name, queue_name)
        since = await self._store.pause(kind=kind, name=target)
        log.info("paused %s %s", "job name" if kind == "name" else "queue", target)
        return since

    async def resume(self, name: str | None = None, *, queue_name: str | None = None) -> bool:
        """Let job ``name`` (or named queue ``queue_name``) start again; whether it
        was paused."""
        kind, target = check_target(name, queue_name)
        resumed = await self._store.resume(kind=kind, name=target)
        if resumed:
            log.info("resumed %s %s", "job name" if kind == "name" else "queue", target)
        return resumed

    async def paused(self) -> list[Paused]:
        """The paused job names and named queues."""
        return await self._store.paused_list()

    async def waiting_on_limits(self) -> list[tuple[str, str, int]]:
        """``(job name, reason, due jobs)`` held back right now; reason is
        ``paused``, ``concurrency`` or ``rate``."""
        return await self._store.jobs_waiting_on_limit()

    async def _refused(self, uid: UUID, operation: str, allowed: tuple[str, ...]) -> NoReturn:
        """Raise why ``operation`` changed nothing: no such job, or not in a status
        it ``allowed``."""
        status = await self._store.job_status_get(id=uid)
        if status is None:
            raise JobNotFound(uid)
        raise InvalidJobState(uid, operation, status.value, allowed)

    def _require_uuid(self, value: UUID | str, what: str = "job") -> UUID:
        uid = as_job_id(value)
        if uid is None:
            if what == "job":
                raise JobNotFound(value)
            raise InvalidOptions(f"{what} id must be a UUID, got {value!r}")
        return uid

    def _wake(self) -> None:
        if self.notify_mode is not NotifyMode.OFF:
            self._waker.request()


def _limit(limit: int) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
        raise InvalidOptions(f"limit must be an integer from 1 to 10000, got {limit!r}")
    return limit


def _count_limit(at_most: int | None) -> int | None:
    if at_most is None:
        return None
    if not isinstance(at_most, int) or isinstance(at_most, bool) or at_most < 0:
        raise InvalidOptions(f"at_most must be a non-negative integer, got {at_most!r}")
    return at_most


def _horizon(horizon: float) -> float:
    if (
        not isinstance(horizon, int | float)
        or isinstance(horizon, bool)
        or not 0 <= horizon <= 10 * 365 * 86400
    ):
        raise InvalidOptions(f"horizon must be from 0 to ten years in seconds, got {horizon!r}")
    return float(horizon)
