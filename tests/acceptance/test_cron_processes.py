"""Cron schedules across real worker processes.

Three ``pgfleet worker`` processes register the same cron list (tests/apps/cron_app)
against one database and run for a number of one-second slots; after they drain on
SIGTERM the database must hold exactly one job per slot, with no slot missing
between the first and the last. Slots are read from the jobs' run_at (a cron job's
run_at is its occurrence), never from this process's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.apps import cron_app
from tests.helpers import listening

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 8

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PGFLEET_")}


async def _spawn(dsn: str, crons: str, log: Path, *extra: str) -> asyncio.subprocess.Process:
    with log.open("wb") as out:  # the child keeps its own descriptor
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pgfleet",
            "worker",
            "--dsn",
            dsn,
            "--app",
            "tests.apps.cron_app:registry",
            "--crons",
            f"tests.apps.cron_app:{crons}",
            "--metrics-port=0",
            *extra,
            cwd=ROOT,
            env=_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=out,
        )


async def _slots(pool: asyncpg.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(DISTINCT run_at) FROM pgfleet.jobs WHERE job_key IS NULL AND name = 'tick'"
        )
    )


async def test_three_processes_enqueue_exactly_one_job_per_slot(
    database: str, tmp_path: Path
) -> None:
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    flags = (
        "--concurrency=2",
        "--poll-interval=0.5",
        "--cron-poll-interval=0.2",
        "--heartbeat-interval=0.5",
        "--dead-worker-timeout=5",
        "--shutdown-grace-period=10",
    )
    procs = [await _spawn(database, "crons", log, *flags) for log in logs]
    pool = await asyncpg.create_pool(database, min_size=1, max_size=2)
    try:
        async with listening(database) as wakeups:
            # Every new cron job notifies; wait on those, checking the count each time.
            async with asyncio.timeout(120):
                while await _slots(pool) < SLOTS:
                    for i, p in enumerate(procs):
                        if p.returncode is not None:
                            pytest.fail(f"worker {i} exited early:\n{logs[i].read_text()}")
                    with contextlib.suppress(TimeoutError):
                        await wakeups.next(timeout=2.0)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), 60)
        texts = [log.read_text() for log in logs]
        assert codes == [0, 0, 0], "\n\n".join(texts)

        every = cron_app.EVERY
        # ---- the schedule without a job key: one job per slot, none missing.
        rows = await pool.fetch(
            "SELECT run_at, job_key, status::text AS status FROM pgfleet.jobs "
            "WHERE job_key IS NULL ORDER BY run_at"
        )
        run_at = [r["run_at"] for r in rows]
        assert len(run_at) >= SLOTS
        assert len(set(run_at)) == len(run_at), "an occurrence was enqueued twice"
        gaps = [b - a for a, b in itertools.pairwise(run_at)]
        assert set(gaps) == {every}, f"slots missing between {run_at[0]} and {run_at[-1]}"
        assert all(t.microsecond == 0 and t.timestamp() % 1 == 0 for t in run_at)
        assert "failed" not in {r["status"] for r in rows}
        row = await pool.fetchrow("SELECT * FROM pgfleet.crons WHERE id = 'every-second'")
        assert row is not None
        assert row["last_occurrence"] == run_at[-1]
        # Each job was logged as enqueued by exactly one process.
        enqueued = [len(re.findall(r"cron every-second: enqueued job", text)) for text in texts]
        assert sum(enqueued) == len(run_at), enqueued

        # ---- the keyed schedule: each slot from its first to its last went either
        # to a new job or (while the previous job was still queued or running) to
        # none, and was logged as such by exactly one process.
        keyed = await pool.fetch(
            "SELECT run_at FROM pgfleet.jobs WHERE job_key = 'every-second-keyed' ORDER BY 1"
        )
        keyed_at = [r["run_at"] for r in keyed]
        assert len(set(keyed_at)) == len(keyed_at) >= 1
        last = await pool.fetchval(
            "SELECT last_occurrence FROM pgfleet.crons WHERE id = 'every-second-keyed'"
        )
        slots = (last - keyed_at[0]) // every + 1
        absorbed = sum(
            len(re.findall(r"cron every-second-keyed: occurrence \S+ not enqueued", t))
            for t in texts
        )
        assert len(keyed_at) + absorbed == slots, (keyed_at, absorbed, last)
        assert all((t - keyed_at[0]) % every == timedelta(0) for t in keyed_at)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
        await pool.close()


BAD = [
    ("bad_zone", "unknown time zone 'Mars/Olympus'"),
    ("duplicate_ids", "duplicate cron id 'twice'"),
    ("no_handler", "no handler is registered for job name 'send_report'"),
    ("bad_hour", "hour must be an integer from 0 to 23, got 24"),
    ("bad_day", "day must be an integer from 1 to 31, got 0"),
]


async def test_bad_cron_definitions_stop_a_worker_at_startup(database: str, tmp_path: Path) -> None:
    async def run(name: str) -> tuple[int, str]:
        log = tmp_path / f"{name}.log"
        proc = await _spawn(database, name, log)
        code = await asyncio.wait_for(proc.wait(), 60)
        return code, log.read_text()

    results: list[Any] = await asyncio.gather(*(run(name) for name, _ in BAD))
    for (name, message), (code, text) in zip(BAD, results, strict=True):
        assert code != 0, f"{name}: the worker started:\n{text}"
        assert message in text, f"{name}:\n{text}"
