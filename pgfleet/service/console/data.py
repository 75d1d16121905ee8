"""What the console reads and changes: the console's queries (pgfleet/db/console.sql,
run by the data layer) and the queue's management operations, over the console's
own pool."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from pgfleet.db.deadlines import AppPool
from pgfleet.db.store import KindStats, Store
from pgfleet.db.types import Record
from pgfleet.jobs import EnqueueOptions, JobStatus, WorkerInfo, validate_name
from pgfleet.limits import Limit, Paused
from pgfleet.queue import Queue

MIN_ID = UUID(int=0)
MAX_ID = UUID(int=(1 << 128) - 1)
#: Statuses whose partial index bounds the rows a filtered page reads.
INDEXED_STATUSES = frozenset({JobStatus.FAILED, JobStatus.QUEUED, JobStatus.RUNNING})


def id_floor(moment: datetime) -> UUID:
    """The smallest UUIDv7 of a job created at ``moment`` or later."""
    return UUID(int=int(moment.timestamp() * 1000) << 80)


@dataclass(frozen=True, slots=True)
class JobFilter:
    status: JobStatus | None = None
    name: str | None = None
    queue: str | None = None
    #: A limit key (``EnqueueOptions(limit_key=...)``).
    key: str | None = None
    #: Created at or after / before (the id's timestamp).
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.name is not None:
            validate_name(self.name, "job name")
        if self.queue is not None:
            validate_name(self.queue, "queue name")
        if self.key is not None:
            EnqueueOptions(limit_key=self.key)  # the enqueue's checks, its error

    @property
    def bounded(self) -> bool:
        """True when an index bounds the rows this filter reads; else pages read a
        window of the newest jobs below the cursor."""
        no_column_filter = self.name is None and self.queue is None and self.key is None
        if self.status is None:
            return no_column_filter
        if self.status in INDEXED_STATUSES:
            return True
        # succeeded is most jobs: a page of them is found at once; cancelled is not.
        return no_column_filter and self.status is JobStatus.SUCCEEDED


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: list[Record]
    #: The cursor of the next (older) page, None at the end.
    older: UUID | None
    #: When a bounded search stopped short: the oldest id it read.
    searched_to: UUID | None
    #: How many jobs such a search reads.
    window: int = 0


@dataclass(frozen=True, slots=True)
class Overview:
    now: datetime
    names: list[KindStats]
    workers: list[WorkerInfo]
    leases: list[Record]
    #: Flow control: every name's limits and pause, paused queues, and the due
    #: jobs waiting on them as (name, reason, count).
    limits: list[Limit] = field(default_factory=list)
    paused_queues: list[Paused] = field(default_factory=list)
    waiting: list[tuple[str, str, int]] = field(default_factory=list)
    #: Jobs waiting on parents, by name.
    waiting_on_parents: dict[str, int] = field(default_factory=dict)


class ConsoleData:
    """What the console asks the data layer."""

    def __init__(self, pool: AppPool, queue: Queue, window: int = 10_000) -> None:
        self.pool = pool
        self.store = Store(pool)
        self.queue = queue
        self.window = window

    async def jobs(self, f: JobFilter, before: UUID | None, limit: int) -> JobPage:
        upper = MAX_ID if f.until is None else id_floor(f.until)
        if before is not None:
            upper = min(upper, before)
        lower = MIN_ID if f.since is None else id_floor(f.since)
        searched_to = None
        async with self.store.acquire("console jobs") as store:
            if not f.bounded:
                end = await store.console_jobs_window_end(
                    before=upper, floor=lower, offset=self.window - 1
                )
                if end is not None:
                    lower = max(lower, end)
                    searched_to = end
            rows = await store.console_jobs_page(
                status=f.status,
                name=f.name,
                queue=f.queue,
                key=f.key,
                before=upper,
                floor=lower,
                limit=limit + 1,
            )
        older = rows[limit - 1]["id"] if len(rows) > limit else None
        if older is not None:
            searched_to = None
        return JobPage(rows[:limit], older, searched_to, self.window)

    async def overview(self) -> Overview:
        async with self.store.acquire("console overview") as store:
            now = await store.console_now()
            names = await store.queue_stats()
            leases = await store.console_leases()
            limits = await store.limits_list()
            paused = [p for p in await store.paused_list() if p.kind == "queue"]
            waiting = await store.jobs_waiting_on_limit()
            waiting_on_parents = await store.job_count_waiting()
        workers = await self.queue.workers()
        return Overview(
            now,
            sorted(names, key=lambda r: r.name),
            workers,
            leases,
            limits,
            paused,
            waiting,
            waiting_on_parents,
        )

    async def now(self) -> datetime:
        return await self.store.console_now()

    async def dead_count(self, name: str) -> int:
        validate_name(name, "job name")
        return await self.store.console_dead_count(name=name)

    async def retry_dead(self, name: str) -> tuple[int, int]:
        """(retried, skipped because another job holds their key)."""
        validate_name(name, "job name")
        return await self.store.console_retry_dead(name=name)

    async def cancel_dead(self, name: str) -> int:
        validate_name(name, "job name")
        return await self.store.console_cancel_dead(name=name)

    async def worker_jobs(self, worker_id: UUID, limit: int = 100) -> list[Record]:
        return await self.store.console_worker_jobs(worker_id=worker_id, limit=limit)

    async def crons(self) -> tuple[datetime, list[Record]]:
        async with self.store.acquire("console crons") as store:
            now = await store.console_now()
            rows = await store.console_crons()
        return now, rows
