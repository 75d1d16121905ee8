"""What a producer sends, whatever the driver that sends it.

Every producer enqueues, reads and cancels jobs through this module:
:class:`pgfleet.Queue` on asyncpg, the psycopg producers (sync and async) and,
through them, SQLAlchemy and Django. An
:class:`Enqueuer` holds a producer's settings and checks a request as ``Queue``
always has (names, options, payload encoding and size, strict mode, payload checks);
it then hands back the statements to run: named statements of ``queries.sql`` with
their arguments in order. A plan of several statements is a generator (:data:`Steps`)
that is sent the result of each (a batch's job keys are settled in rounds, each
depending on the last) and returns the plan's answer. The driver adapters only run
statements and translate their driver's errors, so an option added to
:class:`~pgfleet.EnqueueOptions` and mapped here, or a change to what ``get`` and
``cancel`` do, reaches every producer at once.

What a driver hands back for a statement follows its shape: ``:exec`` nothing,
``:val`` the first column of the first row (or None), ``:one`` the row as a mapping
(or None), ``:many`` the rows, read by position (asyncpg's ``Record`` and psycopg's
tuples alike). Array arguments are lists (psycopg adapts lists, not tuples).
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from uuid import UUID

from pgfleet import _ids
from pgfleet.db.queries import Q, Query
from pgfleet.db.translate import job_from_record
from pgfleet.errors import (
    DuplicateJobKey,
    InvalidDependency,
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
    _valid_names,
    validate_name,
)
from pgfleet.payloads import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload, encode_payload_array

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "Batch",
    "Enqueuer",
    "Row",
    "Statement",
    "Steps",
    "as_job_id",
    "cancel_steps",
    "get_steps",
    "notify_statement",
]

DEFAULT_MAX_ATTEMPTS = 25

# Rounds of insert-then-look-up before giving up on a job key whose holder keeps
# finishing between the two statements.
KEY_RESOLVE_ROUNDS = 8

_KEYED_QUERY = {
    JobKeyMode.DEDUPE: Q.job_insert_keyed_dedupe,
    JobKeyMode.REPLACE: Q.job_insert_keyed_replace,
    JobKeyMode.PRESERVE_RUN_AT: Q.job_insert_keyed_preserve_run_at,
}

#: A row as a driver returns it: read by position only.
Row = Sequence[Any]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Statement:
    """One named statement and its arguments (``$n`` placeholders, in order).

    ``query.shape`` says what the driver does with it: ``:exec`` runs it, ``:many``
    fetches its rows and sends them back to the batch that asked."""

    query: Query
    args: tuple[Any, ...]

    @property
    def sql(self) -> str:
        return self.query.sql

    @property
    def shape(self) -> str:
        return self.query.shape


#: A plan's statements: each is sent what the driver returned for it (see the
#: module's docstring); the generator returns the plan's answer.
Steps = Generator[Statement, Any, T]


def notify_statement() -> Statement:
    """Wake the workers: inside a transaction that enqueued, delivered when (and
    if) it commits."""
    return Statement(Q.notify_jobs, ())


class Enqueuer:
    """A producer's settings, and the checks and statements of its enqueues.

    ``known_names`` turns on strict mode (a Registry or a collection of names);
    ``check_payloads`` (``known_names`` a Registry) refuses a payload its handler's
    annotated type cannot decode. Bad settings raise :class:`InvalidOptions`.
    """

    __slots__ = ("check_payloads", "default_max_attempts", "known_names", "max_payload_bytes")

    def __init__(
        self,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        known_names: Any = None,
        check_payloads: bool = False,
    ) -> None:
        if not isinstance(max_payload_bytes, int) or max_payload_bytes < 2:
            raise InvalidOptions(
                f"max_payload_bytes must be a positive integer, got {max_payload_bytes!r}"
            )
        EnqueueOptions(max_attempts=default_max_attempts)  # validates the range
        if check_payloads and not callable(getattr(known_names, "get", None)):
            raise InvalidOptions(
                "check_payloads needs known_names=<the Registry>: the handlers' payload "
                "types are what payloads are checked against"
            )
        self.max_payload_bytes = max_payload_bytes
        self.default_max_attempts = default_max_attempts
        self.known_names = known_names
        self.check_payloads = bool(check_payloads)

    # ------------------------------------------------------------ checks

    def check_name(self, name: str) -> None:
        if name.__class__ is not str or name not in _valid_names:
            validate_name(name)
        known = self.known_names
        # A Registry answers `in` from its handler dict: no set of names per enqueue.
        if known is not None and name not in known:
            raise UnknownJobName(f"no handler is registered for job name {name!r} (strict mode)")

    def check_payload(self, name: str, payload: Any, where: str = "") -> None:
        """Refuse a payload its handler could never decode (``check_payloads``)."""
        handler = self.known_names.get(name)
        if handler is None or not handler.takes_payload:
            return
        value = json.loads(encode_payload(payload, self.max_payload_bytes))
        try:
            handler.decode(value)
        except PayloadDecodeError as exc:
            raise PayloadError(
                f"{where}payload does not decode for the handler of {name!r}: {exc}"
            ) from None

    @staticmethod
    def options(options: EnqueueOptions | None) -> EnqueueOptions:
        """``options`` checked (None: the defaults)."""
        if options is None:
            return DEFAULT_OPTIONS
        if not isinstance(options, EnqueueOptions):
            raise InvalidOptions(f"options must be EnqueueOptions, got {type(options).__name__}")
        return options

    # ------------------------------------------------------------ statements

    def single(
        self,
        name: str,
        payload: Any,
        opts: EnqueueOptions,
        *,
        notify: bool,
        job_id: UUID | None = None,
        trace: str | None = None,
    ) -> tuple[UUID, Statement]:
        """The id and the one statement of an enqueue without a job_key (``opts``
        from :meth:`options`; a keyed job goes through :meth:`batch`). ``notify``:
        the statement wakes the workers when its transaction commits. ``job_id``:
        an id handed out before the job is written (Django's deferred enqueue).
        ``trace``: the enqueue's trace context (JSON text) to store with the job."""
        self.check_name(name)
        if opts.after:
            raise InvalidOptions("a job with after is enqueued through a batch (Enqueuer.batch)")
        text = encode_payload(payload, self.max_payload_bytes)
        if self.check_payloads:
            self.check_payload(name, payload)
        if job_id is None:
            job_id = _ids.uuid7()
        if opts is DEFAULT_OPTIONS and trace is None:
            query = Q.job_insert_plain_notify if notify else Q.job_insert_plain
            return job_id, Statement(query, (job_id, name, text, self.default_max_attempts))
        query = Q.job_insert_notify if notify else Q.job_insert
        return job_id, Statement(
            query,
            (
                job_id,
                name,
                text,
                opts.priority,
                opts.max_attempts or self.default_max_attempts,
                opts.queue_name,
                opts.run_at,
                opts.delay_seconds,
                trace,
                opts.limit_key,
            ),
        )

    def batch(
        self, requests: Iterable[EnqueueRequest], *, callback: EnqueueRequest | None = None
    ) -> Batch:
        """A checked batch (nothing is sent yet): see :class:`Batch`. With
        ``callback``, a job that waits for every request of the batch, whatever
        its outcome, and then runs with the outcomes in its payload's ``batch``."""
        return Batch(self, requests, callback=callback)

    def chain(self, requests: Iterable[EnqueueRequest]) -> Batch:
        """A batch where each request waits for the one before it (its own
        ``after`` replaced); a failed or cancelled link cancels the rest."""
        linked = []
        for index, req in enumerate(requests):
            if req.__class__ is not EnqueueRequest:
                raise InvalidOptions(
                    f"a chain takes EnqueueRequest items; item {index} is {type(req).__name__}"
                )
            if index:
                opts = req.options
                if not isinstance(opts, EnqueueOptions):
                    raise InvalidOptions(f"item {index}: options must be EnqueueOptions")
                req = replace(req, options=replace(opts, after=(index - 1,)))
            linked.append(req)
        return Batch(self, linked)


#: Where a parent's edge is settled at once: it had finished when its child came.
_FINISHED = frozenset(("succeeded", "failed", "cancelled"))


class Batch:
    """A checked batch, split into one group per insert statement.

    Every request is checked and every payload encoded before anything is sent: a
    bad item raises and nothing is written. :meth:`steps` yields the statements."""

    __slots__ = (
        "_callback",
        "_dependent",
        "_enqueuer",
        "_full",
        "_keyed",
        "_plain",
        "_plain_json",
        "_requests",
        "any_runs_now",
        "ids",
        "size",
    )

    def __init__(
        self,
        enqueuer: Enqueuer,
        requests: Iterable[EnqueueRequest],
        *,
        callback: EnqueueRequest | None = None,
    ) -> None:
        self._enqueuer = enqueuer
        self._requests: Sequence[EnqueueRequest] = (
            requests if isinstance(requests, list | tuple) else list(requests)
        )
        #: The index of the batch's callback (its last request), or -1.
        self._callback = -1
        if callback is not None:
            self._requests = [*self._requests, self._callback_request(callback)]
            self._callback = len(self._requests) - 1
        self.size = len(self._requests)
        self.ids = _ids.uuid7_batch(self.size)
        #: Some job of the batch is due now (worth a wakeup).
        self.any_runs_now = False
        self._plain: tuple[list[UUID], list[str], list[Any]] = ([], [], [])
        self._full: list[tuple[Any, ...]] = []
        self._keyed: dict[JobKeyMode, list[tuple[Any, ...]]] = {}
        #: (index, row, parents, run_anyway) of each job enqueued with ``after``.
        self._dependent: list[tuple[int, tuple[Any, ...], Sequence[UUID | int | str], bool]] = []
        self._plain_json = ""
        self._split()
        if self._dependent:
            self._check_graph()

    def _callback_request(self, callback: EnqueueRequest) -> EnqueueRequest:
        """The callback as the batch's last request: after every member, run anyway."""
        if callback.__class__ is not EnqueueRequest:
            raise InvalidOptions(f"callback must be an EnqueueRequest, got {type(callback)}")
        if not self._requests:
            raise InvalidOptions("a batch needs at least one job besides its callback")
        opts = callback.options
        if not isinstance(opts, EnqueueOptions):
            raise InvalidOptions("callback: options must be EnqueueOptions")
        if opts.after:
            raise InvalidOptions("callback: after is set by the batch (every member)")
        payload = {} if callback.payload is None else callback.payload
        if not encode_payload(payload, self._enqueuer.max_payload_bytes).startswith("{"):
            raise InvalidOptions(
                "callback: the payload must be a JSON object (or None): its 'batch' key "
                "receives the members' outcomes"
            )
        options = replace(opts, after=(0,), run_anyway=True)
        # Every member: past EnqueueOptions' limit of parents per job, which a
        # batch's callback is exempt from.
        object.__setattr__(options, "after", tuple(range(len(self._requests))))
        return EnqueueRequest(callback.name, payload, options)

    def _split(self) -> None:
        enqueuer = self._enqueuer
        check_name = enqueuer.check_name
        limit = enqueuer.max_payload_bytes
        default_attempts = enqueuer.default_max_attempts
        plain_ids, plain_names, plain_payloads = self._plain
        seen_keys: set[str] = set()
        for index, (req, job_id) in enumerate(zip(self._requests, self.ids, strict=False)):
            if req.__class__ is not EnqueueRequest:
                raise InvalidOptions(
                    f"enqueue_many takes EnqueueRequest items; item {index} is {type(req).__name__}"
                )
            name = req.name
            check_name(name)
            if enqueuer.check_payloads:
                enqueuer.check_payload(name, req.payload, f"item {index}: ")
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
            if opts.after:
                self._dependent.append(
                    (
                        index,
                        (
                            job_id,
                            name,
                            text,
                            opts.priority,
                            opts.max_attempts or default_attempts,
                            opts.queue_name,
                            opts.run_at,
                            opts.delay_seconds,
                        ),
                        opts.after,
                        opts.run_anyway,
                    )
                )
                continue
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
                opts.limit_key,
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

    def _check_graph(self) -> None:
        """Refuse an index outside the batch and a cycle among the batch's jobs
        (a job can only wait on an existing job or one of its own batch)."""
        size = self.size
        edges: dict[int, list[int]] = {}
        for index, _, parents, _ in self._dependent:
            local = [p for p in parents if isinstance(p, int)]
            for p in local:
                if p >= size:
                    raise InvalidDependency(
                        f"item {index}: after names item {p}, but the batch has {size} jobs; "
                        "nothing was enqueued"
                    )
            edges[index] = local
        state: dict[int, int] = {}  # 1: on the current path, 2: done
        for start in edges:
            if state.get(start):
                continue
            path = [start]
            stack = [iter(edges.get(start, ()))]
            state[start] = 1
            while stack:
                nxt = next(stack[-1], None)
                if nxt is None:
                    state[path.pop()] = 2
                    stack.pop()
                    continue
                seen = state.get(nxt)
                if seen == 1:
                    cycle = [*path[path.index(nxt) :], nxt]
                    raise InvalidDependency(
                        "the dependencies of the batch form a cycle (items "
                        + " -> ".join(map(str, cycle))
                        + "); nothing was enqueued"
                    )
                if seen is None:
                    state[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(edges.get(nxt, ())))

    def names(self) -> dict[str, int]:
        """How many jobs of each name the batch holds."""
        counts: dict[str, int] = {}
        for req in self._requests:
            counts[req.name] = counts.get(req.name, 0) + 1
        return counts

    def atomic(self, notify: bool) -> bool:
        """Whether the statements need a transaction of their own (a savepoint
        inside the caller's): more than one statement, or keys to settle."""
        statements = bool(self._plain[0]) + bool(self._full) + len(self._keyed) + notify
        return statements > 1 or bool(self._keyed) or bool(self._dependent)

    def steps(self, notify: bool, trace: str | None = None) -> Steps[list[UUID]]:
        """The batch's statements, in order (see :data:`Steps`); ``notify`` adds
        the wakeup, delivered when the transaction commits; ``trace`` (the
        enqueue's trace context, JSON text) is stored with every job."""
        plain_ids, plain_names, _ = self._plain
        full = self._full
        if plain_ids and trace is not None:  # only the general insert carries it
            full = [*self._plain_rows(), *full]
        elif plain_ids:
            yield Statement(
                Q.job_insert_many_plain,
                (plain_ids, plain_names, self._plain_json, self._enqueuer.default_max_attempts),
            )
        if full:
            ids, names, payloads, priorities, attempts, queues, _, run_ats, delays, lkeys = (
                list(column) for column in zip(*full, strict=True)
            )
            yield Statement(
                Q.job_insert_many,
                (ids, names, payloads, priorities, attempts, queues, run_ats, delays, trace, lkeys),
            )
        for mode, rows in self._keyed.items():
            yield from self._keyed_steps(mode, rows, trace)
        if self._dependent:
            yield from self._dependent_steps(trace)
        if notify:
            yield notify_statement()
        return self.ids

    def _dependent_steps(self, trace: str | None) -> Steps[None]:
        """Insert the jobs with parents as waiting, link them to their parents
        (ids of this batch's jobs as they stand, keyed ones resolved), then settle
        the parents that had already finished."""
        ids = self.ids
        rows: list[tuple[Any, ...]] = []
        children: list[UUID] = []
        edge_parents: list[UUID] = []
        edge_anyway: list[bool] = []
        edge_batch: list[bool] = []
        for index, row, after, anyway in self._dependent:
            # after holds UUIDs and ints once checked (EnqueueOptions normalises it).
            parents = list(
                dict.fromkeys(ids[p] if isinstance(p, int) else UUID(str(p)) for p in after)
            )
            child = ids[index]
            if child in parents:
                raise InvalidDependency(f"item {index} would wait on itself; nothing was enqueued")
            rows.append((child, *row[1:], len(parents)))
            children.extend([child] * len(parents))
            edge_parents.extend(parents)
            edge_anyway.extend([anyway] * len(parents))
            edge_batch.extend([index == self._callback] * len(parents))
        cids, names, payloads, priorities, attempts, queues, run_ats, delays, waiting = (
            list(column) for column in zip(*rows, strict=True)
        )
        yield Statement(
            Q.job_insert_waiting,
            (cids, names, payloads, priorities, attempts, queues, run_ats, delays, trace, waiting),
        )
        parents_status = yield Statement(
            Q.job_dependencies_link, (children, edge_parents, edge_anyway, edge_batch)
        )
        missing = [str(r[0]) for r in parents_status or () if r[1] is None]
        if missing:
            raise InvalidDependency(
                f"after names jobs that do not exist: {', '.join(sorted(missing)[:5])}"
                + (" …" if len(missing) > 5 else "")
                + "; nothing was enqueued"
            )
        finished = [(r[0], r[1]) for r in parents_status or () if r[1] in _FINISHED]
        if finished:
            yield Statement(
                Q.job_settle_new,
                ([p for p, _ in finished], [st for _, st in finished], cids),
            )

    def _plain_rows(self) -> list[tuple[Any, ...]]:
        """The default-options jobs as rows of the general insert."""
        ids, names, _ = self._plain
        texts = [json.dumps(p, separators=(",", ":")) for p in json.loads(self._plain_json)]
        attempts = self._enqueuer.default_max_attempts
        return [
            (job_id, name, text, 0, attempts, None, None, None, 0.0, None)
            for job_id, name, text in zip(ids, names, texts, strict=True)
        ]

    def _keyed_steps(
        self, mode: JobKeyMode, rows: list[tuple[Any, ...]], trace: str | None
    ) -> Steps[None]:
        """Insert or resolve every keyed row; the batch id of each becomes the id
        of the job that now holds its key."""
        pending = rows
        resolved: dict[str, UUID] = {}
        for _ in range(KEY_RESOLVE_ROUNDS):
            ids, names, payloads, priorities, attempts, queues, keys, run_ats, delays, lkeys = (
                list(column) for column in zip(*pending, strict=True)
            )
            inserted = yield Statement(
                _KEYED_QUERY[mode],
                (
                    ids,
                    names,
                    payloads,
                    priorities,
                    attempts,
                    queues,
                    keys,
                    run_ats,
                    delays,
                    trace,
                    lkeys,
                ),
            )
            resolved.update((r[1], r[0]) for r in inserted or ())  # (id, job_key)
            missing = [row for row in pending if row[6] not in resolved]
            if missing:
                held = yield Statement(Q.job_ids_by_active_key, ([row[6] for row in missing],))
                resolved.update((r[0], r[1]) for r in held or ())  # (job_key, id)
                missing = [row for row in missing if row[6] not in resolved]
            if not missing:
                break
            pending = missing  # their holders finished in between: insert again
        else:
            raise PgfleetError(
                f"could not settle job keys {[row[6] for row in pending][:5]} after "
                f"{KEY_RESOLVE_ROUNDS} rounds of concurrent changes"
            )
        batch_index = {job_id: i for i, job_id in enumerate(self.ids)}
        for row in rows:
            self.ids[batch_index[row[0]]] = resolved[row[6]]


# ---------------------------------------------------------------- reading and cancelling


def as_job_id(value: Any) -> UUID | None:
    """``value`` as a job id, or None when it cannot be one (no such job)."""
    if isinstance(value, UUID):
        return value
    if isinstance(value, str):
        try:
            return UUID(value)
        except ValueError:
            return None
    return None


def get_steps(job_id: UUID | str) -> Steps[Job | None]:
    """The job with that id, or None."""
    uid = as_job_id(job_id)
    if uid is None:
        return None
    row = yield Statement(Q.job_get, (uid,))
    return None if row is None else job_from_record(row)


#: Who cancelled, when the caller does not say.
DEFAULT_CANCELLED_BY = "application"
MAX_CANCELLED_BY_LENGTH = 200


def cancel_steps(job_id: UUID | str, by: str | None = None) -> Steps[Job]:
    """Cancel a queued job, or ask the worker running a running one to stop (the
    job returned is then still running, its ``cancel_requested_at`` set); refused
    (:class:`InvalidJobState`) for a finished one, :class:`JobNotFound` when there
    is none. ``by`` says who cancelled (kept as the job's ``cancelled_by``)."""
    uid = as_job_id(job_id)
    if uid is None:
        raise JobNotFound(job_id)
    who = check_cancelled_by(by)
    row = yield Statement(Q.job_cancel, (uid, who))
    if row is not None:
        return job_from_record(row)
    yield from refusal_steps(uid, "cancel", ("queued", "waiting", "running"))
    raise AssertionError("unreachable")  # pragma: no cover - refusal_steps raises


def check_cancelled_by(by: str | None) -> str:
    """Who cancelled, checked: printable text up to 200 characters."""
    if by is None:
        return DEFAULT_CANCELLED_BY
    if (
        not isinstance(by, str)
        or not 1 <= len(by) <= MAX_CANCELLED_BY_LENGTH
        or not by.isprintable()
    ):
        raise InvalidOptions(
            f"by must be 1 to {MAX_CANCELLED_BY_LENGTH} printable characters, got {by!r}"
        )
    return by


def refusal_steps(uid: UUID, operation: str, allowed: tuple[str, ...]) -> Steps[None]:
    """Raise why ``operation`` changed nothing: no such job, or not in a status it
    ``allowed``."""
    status = yield Statement(Q.job_status_get, (uid,))
    if status is None:
        raise JobNotFound(uid)
    raise InvalidJobState(uid, operation, JobStatus(status).value, allowed)
