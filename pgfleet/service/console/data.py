"""What the console reads and changes: the console's queries (pgfleet/db/console.sql)
and the queue's management operations, over the console's own pool."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from pgfleet.db import Q
from pgfleet.db.boundary import translate_errors
from pgfleet.db.console import CQ
from pgfleet.jobs import JobStatus, WorkerInfo, validate_name
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
    #: Created at or after / before (the id's timestamp).
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.name is not None:
            validate_name(self.name, "job name")
        if self.queue is not None:
            validate_name(self.queue, "queue name")

    @property
    def bounded(self) -> bool:
        """True when an index bounds the rows this filter reads; else pages read a
        window of the newest jobs below the cursor."""
        no_column_filter = self.name is None and self.queue is None
        if self.status is None:
            return no_column_filter
        if self.status in INDEXED_STATUSES:
            return True
        # succeeded is most jobs: a page of them is found at once; cancelled is not.
        return no_column_filter and self.status is JobStatus.SUCCEEDED


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: list[Any]
    #: The cursor of the next (older) page, None at the end.
    older: UUID | None
    #: When a bounded search stopped short: the oldest id it read.
    searched_to: UUID | None
    #: How many jobs such a search reads.
    window: int = 0


@dataclass(frozen=True, slots=True)
class Overview:
    now: datetime
    names: list[Any]
    workers: list[WorkerInfo]
    leases: list[Any]


class ConsoleData:
    """The console's one caller of SQL."""

    def __init__(self, pool: Any, queue: Queue, window: int = 10_000) -> None:
        self.pool = pool
        self.queue = queue
        self.window = window

    async def jobs(self, f: JobFilter, before: UUID | None, limit: int) -> JobPage:
        upper = MAX_ID if f.until is None else id_floor(f.until)
        if before is not None:
            upper = min(upper, before)
        lower = MIN_ID if f.since is None else id_floor(f.since)
        status = None if f.status is None else f.status.value
        searched_to = None
        with translate_errors("console jobs"):
            async with self.pool.acquire() as conn:
                if not f.bounded:
                    end = await conn.fetchval(
                        CQ.console_jobs_window_end.sql, upper, lower, self.window - 1
                    )
                    if end is not None:
                        lower = max(lower, end)
                        searched_to = end
                rows = await conn.fetch(
                    CQ.console_jobs_page.sql, status, f.name, f.queue, upper, lower, limit + 1
                )
        older = rows[limit - 1]["id"] if len(rows) > limit else None
        if older is not None:
            searched_to = None
        return JobPage(rows[:limit], older, searched_to, self.window)

    async def overview(self) -> Overview:
        with translate_errors("console overview"):
            async with self.pool.acquire() as conn:
                now = await conn.fetchval(CQ.console_now.sql)
                names = await conn.fetch(Q.queue_stats.sql)
                leases = await conn.fetch(CQ.console_leases.sql)
        workers = await self.queue.workers()
        return Overview(now, sorted(names, key=lambda r: r["name"]), workers, list(leases))

    async def now(self) -> datetime:
        with translate_errors("console now"):
            value: datetime = await self.pool.fetchval(CQ.console_now.sql)
        return value

    async def dead_count(self, name: str) -> int:
        validate_name(name, "job name")
        with translate_errors("console dead count"):
            return int(await self.pool.fetchval(CQ.console_dead_count.sql, name))

    async def retry_dead(self, name: str) -> tuple[int, int]:
        """(retried, skipped because another job holds their key)."""
        validate_name(name, "job name")
        with translate_errors("console bulk retry"):
            row = await self.pool.fetchrow(CQ.console_retry_dead.sql, name)
        return int(row["retried"]), int(row["skipped"])

    async def cancel_dead(self, name: str) -> int:
        validate_name(name, "job name")
        with translate_errors("console bulk cancel"):
            return int(await self.pool.fetchval(CQ.console_cancel_dead.sql, name))

    async def worker_jobs(self, worker_id: UUID, limit: int = 100) -> list[Any]:
        with translate_errors("console worker jobs"):
            return list(await self.pool.fetch(CQ.console_worker_jobs.sql, worker_id, limit))

    async def crons(self) -> tuple[datetime, list[Any]]:
        with translate_errors("console crons"):
            async with self.pool.acquire() as conn:
                now = await conn.fetchval(CQ.console_now.sql)
                rows = await conn.fetch(CQ.console_crons.sql)
        return now, list(rows)
