"""The application the chaos suite's workers serve (``tests.chaos.app:registry``).

Every handler execution is written, before anything else, to a side channel that no
database fault can cut: one append-only file per process under
``$PGFLEET_CHAOS_RUNS_DIR`` (``S <job id> <attempt> <pid> <unix time>`` when it starts,
``E ...`` when it returns). Counting the ``S`` lines of a job counts its executions, so
"ran twice" is measured outside the system under test. The ``work`` handler then also
records itself in ``public.chaos_runs`` through the worker's own pool, so handlers do
real database work through the faulty network like an application's would.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import asyncpg

from pgfleet import Job, Registry

registry = Registry()
_pool: asyncpg.Pool | None = None
_fd: int | None = None

SCHEMA = """
CREATE TABLE IF NOT EXISTS public.chaos_runs (
    job_id     uuid        NOT NULL,
    attempt    integer     NOT NULL,
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""

#: Handlers that raise these (see ``poison``): text Postgres cannot store as is.
POISON_MESSAGES = {
    "nul": "poison: bad\x00byte from a binary file",
    "surrogate": "poison: file name \udcff decoded with surrogateescape",
    "big": "poison: a 1 MB message " + "x" * (1024 * 1024),
}


@registry.on_startup
async def _startup(pool: asyncpg.Pool) -> None:
    global _pool
    _pool = pool


def _side_channel(kind: str, job: Job) -> None:
    global _fd
    if _fd is None:
        directory = os.environ["PGFLEET_CHAOS_RUNS_DIR"]
        _fd = os.open(
            os.path.join(directory, f"runs-{os.getpid()}.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o644,
        )
    os.write(_fd, f"{kind} {job.id} {job.attempt} {os.getpid()} {time.time():.6f}\n".encode())


@registry.job("work")
async def work(job: Job, payload: dict[str, Any]) -> None:
    _side_channel("S", job)
    assert _pool is not None
    await _pool.execute(
        "INSERT INTO public.chaos_runs (job_id, attempt, pid) VALUES ($1, $2, $3)",
        job.id,
        job.attempt,
        os.getpid(),
        timeout=10,
    )
    await asyncio.sleep(payload["ms"] / 1000)
    _side_channel("E", job)


@registry.job("sync_work")
def sync_work(job: Job, payload: dict[str, Any]) -> None:
    _side_channel("S", job)
    time.sleep(payload["ms"] / 1000)
    _side_channel("E", job)


@registry.job("poison")
async def poison(job: Job, payload: dict[str, str]) -> None:
    _side_channel("S", job)
    raise RuntimeError(POISON_MESSAGES[payload["kind"]])


@registry.job("stuck_sync", timeout=2)
def stuck_sync(job: Job, payload: Any) -> None:
    """A sync handler that never returns (a blocking call with no timeout)."""
    _side_channel("S", job)
    threading.Event().wait()
