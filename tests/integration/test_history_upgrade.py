"""A worker of the version before migration 0010 (its code taken from git) beside the
new schema and a new leader: it claims and finishes jobs as before; jobs the new
leader moved to history are invisible to its reads (docs/operations/upgrades.md)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from pgfleet import EnqueueRequest, Queue, Worker, WorkerConfig, migrations
from tests.apps import runtime_app
from tests.integration.conftest import FAST

ROOT = Path(__file__).resolve().parents[2]
HISTORY = next(m for m in migrations() if m.name == "history_partitions")
# By name, not number: a merge may renumber the file (git log then finds where it was added).
MIGRATION = "pgfleet/db/migrations/*_history_partitions.sql"

OLD_WORKER = """
import asyncio, json, sys, uuid
import asyncpg
import pgfleet
from pgfleet import Queue, Registry, Worker, WorkerConfig

async def main(dsn, ids):
    registry = Registry()

    @registry.job("record")
    async def record(job):
        return None

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    worker = Worker(pool, registry, WorkerConfig(poll_interval=0.2, heartbeat_interval=0.5,
                                                 dead_worker_timeout=2.0))
    stats = await worker.run(burst=True)
    queue = Queue(pool)
    found = {i: (await queue.get(uuid.UUID(i))) is not None for i in ids}
    print(json.dumps({"file": pgfleet.__file__, "succeeded": stats.succeeded,
                      "found": found, "known": len(pgfleet.migrations())}))
    await pool.close()

asyncio.run(main(sys.argv[1], sys.argv[2:]))
"""


def _old_code(into: Path) -> None:
    """The pgfleet package as of the commit before migration 0010 was added."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git history of the checkout")
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", MIGRATION],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        pytest.skip("migration 0010 is not committed yet")
    archive = subprocess.run(
        ["git", "archive", f"{added[-1]}^", "pgfleet"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


async def _run_old(folder: Path, dsn: str, ids: list[str]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        OLD_WORKER,
        dsn,
        *ids,
        cwd=folder,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def test_an_old_worker_runs_beside_the_new_schema(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    _old_code(tmp_path)
    queue = Queue(pool)
    ids = await queue.enqueue_many([EnqueueRequest("record", {}) for _ in range(20)])
    old = await _run_old(tmp_path, database, [str(i) for i in ids])
    assert str(old["file"]).startswith(str(tmp_path))  # the old code ran
    assert old["known"] < HISTORY.version  # it does not know the history migration
    assert old["succeeded"] == 20  # claims and completions are unchanged
    assert all(old["found"].values())
    # The new leader moves what the old worker finished; the new reads find it.
    await pool.execute("UPDATE pgfleet.jobs SET finished_at = finished_at - interval '1 hour'")
    leader = Worker(pool, runtime_app.registry, WorkerConfig(**FAST))
    assert leader.historian is not None
    await leader.historian.prepare()
    assert await leader.historian.move() == 20
    assert None not in [await queue.get(i) for i in ids]
    # The old code reads only pgfleet.jobs: moved jobs are not found by it (why
    # upgrades.md says to keep history_move_after off until no old reader is left).
    more = await queue.enqueue("record", {})
    old = await _run_old(tmp_path, database, [str(ids[0]), str(more)])
    assert old["succeeded"] == 1
    assert old["found"] == {str(ids[0]): False, str(more): True}
