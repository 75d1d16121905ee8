"""Fixtures for running real workers inside the test process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypedDict

import asyncpg

from pgfleet import Job, Registry, Worker, WorkerConfig, WorkerEvents


class Timings(TypedDict):
    """The `WorkerConfig` timings tests pass as ``**FAST`` (typed, so mypy checks them)."""

    poll_interval: float
    heartbeat_interval: float
    dead_worker_timeout: float


#: Short timings so tests see rescues and polls quickly.
FAST: Timings = {"poll_interval": 0.2, "heartbeat_interval": 0.5, "dead_worker_timeout": 2.0}


class Recorder(WorkerEvents):
    """Collects runtime events and lets a test wait for them (no sleeping)."""

    def __init__(self) -> None:
        self.started: list[Job] = []
        self.finished: list[tuple[Job, str]] = []
        self.wakeups: list[str] = []
        self.rescued = 0
        self._changed = asyncio.Event()

    def job_started(self, job: Job, pickup_delay: float) -> None:
        self.started.append(job)
        self._changed.set()

    def job_finished(self, job: Job, outcome: str, duration: float) -> None:
        self.finished.append((job, outcome))
        self._changed.set()

    def wakeup(self, source: str) -> None:
        self.wakeups.append(source)
        self._changed.set()

    def jobs_rescued(self, count: int) -> None:
        self.rescued += count
        self._changed.set()

    async def until(self, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
        async def wait() -> None:
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout)

    def outcomes(self, outcome: str) -> list[Job]:
        return [job for job, o in self.finished if o == outcome]


@asynccontextmanager
async def running_worker(
    pool: asyncpg.Pool,
    registry: Registry,
    config: WorkerConfig | None = None,
    events: WorkerEvents | None = None,
    crons: Sequence[Any] = (),
) -> AsyncIterator[tuple[Worker, Any]]:
    """A worker running in a background task; stops gracefully on exit."""
    stop = asyncio.Event()
    worker = Worker(
        pool, registry, config or WorkerConfig(poll_interval=0.2), events=events, crons=crons
    )
    task = asyncio.create_task(worker.run(shutdown=stop.wait()))
    try:
        yield worker, task
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
