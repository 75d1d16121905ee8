"""The producer side: enqueue jobs and manage them."""

from __future__ import annotations

import asyncio
import enum
import json
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, NoReturn
from uuid import UUID

from pgfleet import _ids
from pgfleet.db.connect import create_pool as create_pool  # public: pgfleet.create_pool
from pgfleet.db.deadlines import AppPool
from pgfleet.db.store import Store
from pgfleet.db.types import Connection
from pgfleet.errors import (
    DuplicateJobKey,
    InvalidJobState,
    InvalidOptions,
    JobNotFound,
    PayloadDecodeError,
    PayloadError,
    PgfleetError,
    UnknownJobName,
)
from pgfleet.jobs import (
    DEFAULT_OPTIONS,
    EnqueueOptions,
    EnqueueRequest,
    Job,
    JobKeyMode,
    JobStatus,
    WorkerInfo,
    _valid_names,
    validate_name,
)
from pgfleet.payloads import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload, encode_payload_array

log = logging.getLogger("pgfleet")

DEFAULT_MAX_ATTEMPTS = 25

# Rounds of insert-then-look-up before giving up on a job key whose holder keeps
# finishing between the two statements.
_KEY_RESOLVE_ROUNDS = 8


class NotifyMode(enum.StrEnum):
    """How enqueues wake workers. Notifications only affect latency, never whether
    a job runs: every idle worker also polls."""

    #: Default. At most one notifying statement per queue is in flight at a time,
    #: so producers never queue on Postgres' commit-time notification lock: a
    #: single enqueue that finds none in flight carries its NOTIFY in its own insert
    #: (one round trip, one commit); enqueues that overlap it commit without one,
    #: and one coalesced NOTIFY per burst follows them from a separate statement.
    #: An enqueue inside the caller's transaction notifies within that transaction.
    COALESCED = "coalesced"
    #: Every enqueue transaction carries its own NOTIFY (at most one per transaction).
    TRANSACTION = "transaction"
    #: No notifications: workers find jobs by polling.
    OFF = "off"


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
        if not isinstance(max_payload_bytes, int) or max_payload_bytes < 2:
            raise InvalidOptions(
                f"max_payload_bytes must be a positive integer, got {max_payload_bytes!r}"
            )
        EnqueueOptions(max_attempts=default_max_attempts)  # validates the range
        self._pool = pool
        self._store = Store(pool)
        self._max_payload_bytes = max_payload_bytes
        self._default_max_attempts = default_max_attempts
        self._known = known_names
        if check_payloads and not callable(getattr(known_names, "get", None)):
            raise InvalidOptions(
                "check_payloads needs known_names=<the Registry>: the handlers' payload "
                "types are what payloads are checked against"
            )
        self._check_payloads = bool(check_payloads)
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
        opts = DEFAULT_OPTIONS if options is None else options
        if not isinstance(opts, EnqueueOptions):
            raise InvalidOptions(f"options must be EnqueueOptions, got {type(opts).__name__}")
        if opts.job_key is not None:
            ids = await self.enqueue_many(
                [EnqueueRequest(name, payload, opts)], connection=connection
            )
            return ids[0]
        self._check_name(name)
        text = encode_payload(payload, self._max_payload_bytes)
        if self._check_payloads:
            self._check_payload(name, payload)
        job_id = _ids.uuid7()
        wake_in_tx, wake_after = self._wake_plan(connection, opts.runs_now)
        # The coalesced wakeup of a lone enqueue rides in its own insert.
        inline = wake_after and self._waker.take_inline()
        if inline:
            wake_in_tx, wake_after = True, False
        store = self._store if connection is None else Store(connection)
        try:
            if opts is DEFAULT_OPTIONS:
                await store.job_insert_plain(
                    id=job_id,
                    name=name,
                    payload=text,
                    max_attempts=self._default_max_attempts,
                    notify=wake_in_tx,
                )
            else:
                await store.job_insert(
                    id=job_id,
                    name=name,
                    payload=text,
                    priority=opts.priority,
                    max_attempts=opts.max_attempts or self._default_max_attempts,
                    queue_name=opts.queue_name,
                    run_at=opts.run_at,
                    delay_seconds=opts.delay_seconds,
                    notify=wake_in_tx,
                )
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
        batch = _Batch(self, requests)
        if not batch.size:
            return []
        wake_in_tx, wake_after = self._wake_plan(connection, batch.any_runs_now)
        store = self._store if connection is None else Store(connection)
        async with store.acquire("enqueue_many") as bound:
            await batch.write(bound, wake_in_tx)
        if wake_after:
            self._waker.request()
        if self.on_enqueued is not None:
            for name, count in batch.names().items():
                self.on_enqueued(name, count)
        return batch.ids

    def _check_name(self, name: str) -> None:
        if name.__class__ is not str or name not in _valid_names:
            validate_name(name)
        known = self._known
        # A Registry answers `in` from its handler dict: no set of names per enqueue.
        if known is not None and name not in known:
            raise UnknownJobName(f"no handler is registered for job name {name!r} (strict mode)")

    def _check_payload(self, name: str, payload: Any, where: str = "") -> None:
        """Refuse a payload its handler could never decode (``check_payloads``)."""
        handler = self._known.get(name)
        if handler is None or not handler.takes_payload:
            return
        value = json.loads(encode_payload(payload, self._max_payload_bytes))
        try:
            handler.decode(value)
        except PayloadDecodeError as exc:
            raise PayloadError(
                f"{where}payload does not decode for the handler of {name!r}: {exc}"
            ) from None

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
        uid = _as_uuid(job_id)
        if uid is None:
            return None
        return await self._store.job_get(id=uid)

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
        uids = [u for u in map(_as_uuid, job_ids) if u is not None]
        if not uids:
            return {}
        return await self._store.job_status_many(ids=uids)

    async def workers(self) -> list[WorkerInfo]:
        """Registered workers, stale registrations not yet recovered included."""
        return await self._store.worker_list()

    # ------------------------------------------------------------ management

    async def cancel(self, job_id: UUID | str) -> Job:
        """Cancel a queued job. A running job is not interrupted: refused with
        :class:`InvalidJobState`, as are finished jobs."""
        uid = self._require_uuid(job_id)
        job = await self._store.job_cancel(id=uid)
        return job or await self._refused(uid, "cancel", ("queued",))

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
        ``older_than``, in batches of ``batch_size``; return how many."""
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
                return total

    async def _refused(self, uid: UUID, operation: str, allowed: tuple[str, ...]) -> NoReturn:
        """Raise why ``operation`` changed nothing: no such job, or not in a status
        it ``allowed``."""
        status = await self._store.job_status_get(id=uid)
        if status is None:
            raise JobNotFound(uid)
        raise InvalidJobState(uid, operation, status.value, allowed)

    def _require_uuid(self, value: UUID | str, what: str = "job") -> UUID:
        uid = _as_uuid(value)
        if uid is None:
            if what == "job":
                raise JobNotFound(value)
            raise InvalidOptions(f"{what} id must be a UUID, got {value!r}")
        return uid

    def _wake(self) -> None:
        if self.notify_mode is not NotifyMode.OFF:
            self._waker.request()


def _as_uuid(value: Any) -> UUID | None:
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            return None
    return None


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


class _Batch:
    """A validated batch, split into one group per insert statement."""

    __slots__ = (
        "_full",
        "_keyed",
        "_plain",
        "_plain_json",
        "_queue",
        "_requests",
        "any_runs_now",
        "ids",
        "size",
    )

    def __init__(self, queue: Queue, requests: Iterable[EnqueueRequest]) -> None:
        self._queue = queue
        self._requests: Sequence[EnqueueRequest] = (
            requests if isinstance(requests, list | tuple) else list(requests)
        )
        self.size = len(self._requests)
        self.ids = _ids.uuid7_batch(self.size)
        self.any_runs_now = False
        self._plain: tuple[list[UUID], list[str], list[Any]] = ([], [], [])
        self._full: list[tuple[Any, ...]] = []
        self._keyed: dict[JobKeyMode, list[tuple[Any, ...]]] = {}
        self._plain_json = ""
        self._split()

    def _split(self) -> None:
        queue = self._queue
        check_name = queue._check_name
        limit = queue._max_payload_bytes
        default_attempts = queue._default_max_attempts
        plain_ids, plain_names, plain_payloads = self._plain
        seen_keys: set[str] = set()
        for index, (req, job_id) in enumerate(zip(self._requests, self.ids, strict=False)):
            if req.__class__ is not EnqueueRequest:
                raise InvalidOptions(
                    f"enqueue_many takes EnqueueRequest items; item {index} is {type(req).__name__}"
                )
            name = req.name
            check_name(name)
            if queue._check_payloads:
                queue._check_payload(name, req.payload, f"item {index}: ")
            opts = req.options
            if opts is DEFAULT_OPTIONS:
                self.any_runs_now = True
                plain_ids.append(job_id)
                plain_names.append(name)
                plain_payloads.append(req.payload)  # encoded together below
                continue
            text = encode_payload(req.payload, limit)
            if not isinstance(opts, EnqueueOptions):
                raise InvalidOptions(f"item {index}: options must be EnqueueOptions")
            self.any_runs_now = self.any_runs_now or opts.runs_now
            row = (
                job_id,
                name,
                text,
                opts.priority,
                opts.max_attempts or default_attempts,
                opts.queue_name,
                opts.job_key,
                opts.run_at,
                opts.delay_seconds,
            )
            key = opts.job_key
            if key is None:
                self._full.append(row)
                continue
            if key in seen_keys:
                raise DuplicateJobKey(
                    f"job_key {key!r} appears more than once in one batch; nothing was enqueued",
                    key,
                )
            seen_keys.add(key)
            self._keyed.setdefault(opts.job_key_mode, []).append(row)
        if plain_payloads:
            self._plain_json = encode_payload_array(plain_payloads, limit)

    def names(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for req in self._requests:
            counts[req.name] = counts.get(req.name, 0) + 1
        return counts

    async def write(self, store: Store, notify: bool) -> None:
        """Write the batch through ``store`` (bound to one connection)."""
        statements = bool(self._plain[0]) + bool(self._full) + len(self._keyed) + notify
        if statements == 1 and not self._keyed:
            await self._write_unkeyed(store)
            return
        async with store.transaction("enqueue_many") as tx:
            await self._write_unkeyed(tx)
            for mode, rows in self._keyed.items():
                await self._write_keyed(tx, mode, rows)
            if notify:
                await tx.notify_jobs()

    async def _write_unkeyed(self, store: Store) -> None:
        plain_ids, plain_names, _ = self._plain
        if plain_ids:
            await store.job_insert_many_plain(
                ids=plain_ids,
                names=plain_names,
                payloads=self._plain_json,
                max_attempts=self._queue._default_max_attempts,
            )
        if self._full:
            ids, names, payloads, priorities, attempts, queues, _, run_ats, delays = zip(
                *self._full, strict=True
            )
            await store.job_insert_many(
                ids=ids,
                names=names,
                payloads=payloads,
                priorities=priorities,
                max_attempts=attempts,
                queue_names=queues,
                run_ats=run_ats,
                delays=delays,
            )

    async def _write_keyed(
        self, store: Store, mode: JobKeyMode, rows: list[tuple[Any, ...]]
    ) -> None:
        """Insert or resolve every keyed row; the batch id of each becomes the id
        of the job that now holds its key."""
        pending = rows
        resolved: dict[str, UUID] = {}
        for _ in range(_KEY_RESOLVE_ROUNDS):
            ids, names, payloads, priorities, attempts, queues, keys, run_ats, delays = zip(
                *pending, strict=True
            )
            resolved.update(
                await store.job_insert_keyed(
                    mode=mode,
                    ids=ids,
                    names=names,
                    payloads=payloads,
                    priorities=priorities,
                    max_attempts=attempts,
                    queue_names=queues,
                    job_keys=keys,
                    run_ats=run_ats,
                    delays=delays,
                )
            )
            missing = [row for row in pending if row[6] not in resolved]
            if missing:
                held = await store.job_ids_by_active_key(keys=[row[6] for row in missing])
                resolved.update(held)
                missing = [row for row in missing if row[6] not in resolved]
            if not missing:
                break
            pending = missing  # their holders finished in between: insert again
        else:
            raise PgfleetError(
                f"could not settle job keys {[row[6] for row in pending][:5]} after "
                f"{_KEY_RESOLVE_ROUNDS} rounds of concurrent changes"
            )
        batch_index = {job_id: i for i, job_id in enumerate(self.ids)}
        for row in rows:
            self.ids[batch_index[row[0]]] = resolved[row[6]]
