"""A scripted stand-in for the database under the claim loop: a pool of fake
connections and a ``ClaimStore`` on each, answering rounds from an in-memory queue
unless the test scripts the next answer (refuse, lose the connection, hang, wait
for a gate). Every round is recorded with what was running when it went out."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from pgfleet import Job, Registry, context
from pgfleet._runtime.claim_connection import ClaimStore
from pgfleet._runtime.claimer import ClaimLoop
from pgfleet._runtime.execution import JobRunner
from pgfleet._runtime.outcomes import RunStats
from pgfleet.db.deadlines import BoundedPool
from pgfleet.db.translate import ROUND_COLUMNS
from pgfleet.db.types import Record
from pgfleet.events import WorkerEvents
from pgfleet.testing import make_job
from tools.devkit import until

Row = tuple[Any, ...]


class Refused(Exception):
    """What the fake database raises for a statement it refuses (not an outage)."""


class Misuse(ConnectionError):
    """A statement on a connection already closed: asyncpg would say it was
    released back to the pool."""


class FakeConnection:
    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False
        self.terminated = False
        self.released = False
        self.in_transaction = False
        self._listeners: list[Callable[[Any], None]] = []

    def add_termination_listener(self, callback: Callable[[Any], None]) -> None:
        self._listeners.append(callback)

    def remove_termination_listener(self, callback: Callable[[Any], None]) -> None:
        self._listeners.remove(callback)

    def is_closed(self) -> bool:
        return self.closed

    def is_in_transaction(self) -> bool:
        return self.in_transaction

    def terminate(self) -> None:
        self.terminated = True
        self.lose()

    def lose(self) -> None:
        """The connection closes under the loop (a reset, the server gone)."""
        if not self.closed:
            self.closed = True
            for callback in list(self._listeners):
                callback(self)


@dataclass
class Call:
    """One ``job_complete_and_claim`` as the loop sent it."""

    connection: FakeConnection
    ids: list[uuid.UUID]
    actions: list[str]
    errors: list[str | None]
    limit: int
    start: int
    started: list[uuid.UUID]
    #: The jobs the worker was running when the round went out.
    running: set[uuid.UUID] = field(default_factory=set)


Step = Callable[["FakeDatabase", Call], Awaitable[list[Row]]]


async def answer(db: FakeDatabase, call: Call) -> list[Row]:
    """What the database does: apply the outcomes, claim from the queue."""
    return db.answer(call)


async def refuse(db: FakeDatabase, call: Call) -> list[Row]:
    raise Refused("new row violates check constraint")


async def lose_connection(db: FakeDatabase, call: Call) -> list[Row]:
    call.connection.lose()
    raise ConnectionResetError("connection reset by peer")


async def hang(db: FakeDatabase, call: Call) -> list[Row]:
    await asyncio.get_running_loop().create_future()  # never answers
    raise AssertionError("unreachable")


def gated(gate: asyncio.Event, then: Step = answer) -> Step:
    """Answer as ``then`` once ``gate`` is set: the round stays out until then."""

    async def step(db: FakeDatabase, call: Call) -> list[Row]:
        await gate.wait()
        return await then(db, call)

    return step


async def answer_then_lose(db: FakeDatabase, call: Call) -> list[Row]:
    """Answer, and lose the connection in the same loop turn (a reset read right
    behind the answer), before anything else the loop does runs."""
    rows = db.answer(call)
    asyncio.get_running_loop().call_soon(call.connection.lose)
    return rows


class FakeStore:
    """``ClaimStore`` on one fake connection."""

    def __init__(self, db: FakeDatabase, connection: FakeConnection) -> None:
        self._db = db
        self._connection = connection

    def _use(self, what: str) -> None:
        if self._connection.closed:
            self._db.misuse.append(what)
            raise Misuse(f"{what} on a closed connection")

    async def job_complete_and_claim(
        self,
        *,
        ids: Sequence[uuid.UUID],
        tokens: Sequence[uuid.UUID | None],
        actions: Sequence[str],
        delays: Sequence[float],
        errors: Sequence[str | None],
        ran: Sequence[float | None],
        results: Sequence[str | None],
        worker_id: uuid.UUID,
        job_names: Sequence[str],
        queue_names: Sequence[str] | None,
        limit: int,
        start: int,
        started: Sequence[uuid.UUID],
        flow: bool = True,
    ) -> list[Record]:
        self._use("job_complete_and_claim")
        db = self._db
        call = Call(
            self._connection, list(ids), list(actions), list(errors), limit, start, list(started)
        )
        if db.runner is not None:
            call.running = set(db.runner.running)
        db.calls.append(call)
        step = db.script.popleft() if db.script else answer
        return cast(list[Record], await step(db, call))

    async def job_release_unknown(
        self, *, worker_id: uuid.UUID, known_ids: Sequence[uuid.UUID]
    ) -> int:
        self._use("job_release_unknown")
        self._db.release_unknown.append(list(known_ids))
        return 0

    async def claim_session_begin(self) -> None:
        self._use("claim_session_begin")
        self._db.sessions.append(("begin", self._connection.number))

    async def claim_session_end(self) -> None:
        self._use("claim_session_end")
        self._db.sessions.append(("end", self._connection.number))

    async def claim_transaction_begin(self) -> None:
        self._use("claim_transaction_begin")
        self._connection.in_transaction = True

    async def claim_transaction_commit(self) -> None:
        self._use("claim_transaction_commit")
        self._connection.in_transaction = False

    async def claim_transaction_rollback(self) -> None:
        self._use("claim_transaction_rollback")
        self._connection.in_transaction = False
        self._db.rollbacks += 1


class FakePool:
    def __init__(self) -> None:
        self.connections: list[FakeConnection] = []

    async def acquire(self, *, timeout: float | None = None) -> FakeConnection:
        connection = FakeConnection(len(self.connections))
        self.connections.append(connection)
        return connection

    async def release(self, connection: FakeConnection, *, timeout: float | None = None) -> None:
        connection.released = True


class FakeDatabase:
    """The queue, the script and what was written."""

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self.queue: deque[Job] = deque(jobs)
        self.script: deque[Step] = deque()
        self.pool = FakePool()
        self.calls: list[Call] = []
        #: The action written for each job, and its error.
        self.written: dict[uuid.UUID, str] = {}
        self.errors: dict[uuid.UUID, str | None] = {}
        #: Outcomes of these jobs are refused unless they fail the job.
        self.refused: set[uuid.UUID] = set()
        self.misuse: list[str] = []
        self.release_unknown: list[list[uuid.UUID]] = []
        self.sessions: list[tuple[str, int]] = []
        self.hangs: list[str] = []
        self.rollbacks = 0
        self.runner: JobRunner | None = None

    def store_for(self, connection: Any) -> ClaimStore:
        return FakeStore(self, connection)

    async def hang_detected(self, what: str) -> None:
        self.hangs.append(what)

    def answer(self, call: Call) -> list[Row]:
        for id_, action in zip(call.ids, call.actions, strict=True):
            if id_ in self.refused and action != "failed":
                raise Refused(f"outcome of {id_} refused")
        rows: list[Row] = []
        for id_, action, error in zip(call.ids, call.actions, call.errors, strict=True):
            self.written[id_] = action
            self.errors[id_] = error
            rows.append((False, None, id_, *([None] * (len(ROUND_COLUMNS) - 3))))
        for index in range(min(call.limit, len(self.queue))):
            rows.append(claimed_row(self.queue.popleft(), held=index >= call.start))
        return rows


def claimed_row(job: Job, *, held: bool) -> Row:
    """A claimed job as ``job_complete_and_claim`` returns it (times as epochs)."""
    return (
        True, held, job.id, job.name, json.dumps(job.payload), job.attempt, job.max_attempts,
        job.priority, job.queue_name, job.job_key, job.run_at.timestamp(),
        job.created_at.timestamp(), job.created_at.timestamp(), job.last_error, job.lock_token,
        None, job.snoozes, job.limit_key,
    )  # fmt: skip


class Handlers:
    """The ``work`` handler: records each start, and waits for the jobs a test
    blocks until it finishes them."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.started: list[uuid.UUID] = []
        self._gates: dict[uuid.UUID, asyncio.Event] = {}

        @self.registry.job("work")
        async def work(job: Job) -> None:
            self.started.append(job.id)
            gate = self._gates.get(job.id)
            if gate is not None:
                await gate.wait()

    def block(self, *jobs: Job) -> None:
        for job in jobs:
            self._gates[job.id] = asyncio.Event()

    def finish(self, job: Job) -> None:
        self._gates[job.id].set()


class ScriptedClaimLoop(ClaimLoop):
    """Backoffs recorded, not slept."""

    pauses: list[float]

    async def pause(self, delay: float) -> None:
        self.pauses.append(delay)
        await asyncio.sleep(0)


def jobs(count: int) -> list[Job]:
    return [make_job("work") for _ in range(count)]


def claim_loop(
    db: FakeDatabase,
    handlers: Handlers,
    *,
    concurrency: int = 2,
    timeout: float = 5.0,
    hold: float = 1.0,
    pooled: bool = False,
    burst: bool = True,
    remove_succeeded: bool = False,
) -> tuple[ScriptedClaimLoop, JobRunner]:
    """A claim loop on ``db`` with a real JobRunner running ``handlers``."""
    events = WorkerEvents()
    loop: list[ScriptedClaimLoop] = []
    runner = JobRunner(
        handlers.registry,
        concurrency=concurrency,
        default_timeout=None,
        backoff_base=1.0,
        backoff_cap=1.0,
        backoff_jitter=0.0,
        events=events,
        on_outcome=lambda outcome: loop[0].add_outcome(outcome),
        prefetch=0,
        prefetch_window=1.0,
    )
    runner.state = context.WorkerState(
        dt.datetime.now(dt.UTC), threading.Event(), asyncio.get_running_loop().create_future()
    )
    claims = ScriptedClaimLoop(
        uuid.uuid4(),
        db.pool,
        cast(BoundedPool, db),
        runner,
        names=["work"],
        queue_names=None,
        poll_interval=0.01,
        timeout=timeout,
        hold=hold,
        pooled=pooled,
        events=events,
        stats=RunStats(),
        remove_succeeded=remove_succeeded,
        store=db.store_for,
    )
    claims.pauses = []
    claims.burst = burst
    loop.append(claims)
    db.runner = runner
    return claims, runner


async def soon(check: Callable[[], object], what: str = "condition") -> None:
    """Wait (a few loop turns, a second at most) until ``check()`` is true."""

    async def probe() -> object:
        return check()

    await until(probe, timeout=2.0, what=what, interval=0.001)
