"""``pgfleet jobs`` as operators run it: a real process against real Postgres."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from pgfleet import EnqueueOptions, Queue
from tests.acceptance.api_support import ROOT, jobs_table
from tests.helpers import put_in_state, register_worker
from tests.procs import free_port


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def pgfleet_jobs(*args: str, dsn: str | None = None) -> Run:
    env = {k: v for k, v in os.environ.items() if k != "PGFLEET_DATABASE_URL"}
    if dsn is not None:
        env["PGFLEET_DATABASE_URL"] = dsn
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pgfleet",
        "jobs",
        *args,
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


async def test_list_get_counts_and_workers(database: str, pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    first = await queue.enqueue("send_email", {"to": "a@b.c"})
    second = await queue.enqueue(
        "resize", options=EnqueueOptions(job_key="img-1", limit_key="acme")
    )
    await put_in_state(pool, second, "failed")
    worker_id = uuid.uuid4()
    await register_worker(pool, worker_id)

    listed = await pgfleet_jobs("list", "--json", dsn=database)
    assert listed.code == 0, listed.err
    assert [j["id"] for j in listed.json()] == [str(second), str(first)]
    assert all("payload" not in j for j in listed.json())

    table = await pgfleet_jobs("list", "--status", "failed", dsn=database)
    assert table.code == 0, table.err
    header, *rows = table.out.splitlines()
    assert header.split()[:3] == ["ID", "NAME", "STATUS"]
    assert len(rows) == 1
    assert rows[0].split()[:3] == [str(second), "resize", "failed"]
    assert "boom" in rows[0]

    got = await pgfleet_jobs("get", str(first), "--dsn", database, "--json")
    assert got.code == 0, got.err
    assert got.json()["status"] == "queued"
    assert "payload" not in got.json()
    keyed = await pgfleet_jobs("get", str(second), "--json", dsn=database)
    assert (keyed.json()["job_key"], keyed.json()["limit_key"]) == ("img-1", "acme")
    assert "limit_key     acme" in (await pgfleet_jobs("get", str(second), dsn=database)).out
    with_payload = await pgfleet_jobs("get", str(first), "--payload", dsn=database)
    assert with_payload.code == 0
    assert 'payload       {"to": "a@b.c"}' in with_payload.out

    counts = await pgfleet_jobs("counts", "--json", dsn=database)
    assert counts.json() == {
        "queued": 1,
        "running": 0,
        "succeeded": 0,
        "failed": 1,
        "cancelled": 0,
        "waiting": 0,
    }
    assert "total      2" in (await pgfleet_jobs("counts", dsn=database)).out

    workers = await pgfleet_jobs("workers", "--json", dsn=database)
    assert [(w["id"], w["alive"]) for w in workers.json()] == [(str(worker_id), True)]
    assert str(worker_id) in (await pgfleet_jobs("workers", dsn=database)).out


async def test_cancel_and_retry_and_their_refusals(database: str, pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job = await queue.enqueue("send_email")

    cancelled = await pgfleet_jobs("cancel", str(job), "--json", dsn=database)
    assert cancelled.code == 0, cancelled.err
    assert cancelled.json()["status"] == "cancelled"

    before = await jobs_table(pool)
    again = await pgfleet_jobs("cancel", str(job), dsn=database)
    assert again.code == 4
    assert "cannot cancel job" in again.err
    assert "it is cancelled" in again.err
    assert "nothing was changed" in again.err
    assert await jobs_table(pool) == before

    retried = await pgfleet_jobs("retry", str(job), dsn=database)
    assert retried.code == 0, retried.err
    assert "status        queued" in retried.out
    before = await jobs_table(pool)
    refused = await pgfleet_jobs("retry", str(job), dsn=database)
    assert refused.code == 4
    assert "retry applies only to failed or cancelled jobs" in refused.err
    assert await jobs_table(pool) == before


async def test_get_waits_for_the_job_and_prints_its_failed_attempts(
    database: str, pool: asyncpg.Pool
) -> None:
    queue = Queue(pool)
    job = await queue.enqueue("send_email")
    waiting = asyncio.ensure_future(pgfleet_jobs("get", str(job), "--wait", "60", dsn=database))
    while not await pool.fetchval("SELECT awaited FROM pgfleet.jobs WHERE id = $1", job):
        await asyncio.sleep(0.05)
    await pool.execute(
        "UPDATE pgfleet.jobs SET errors = jsonb_build_array(jsonb_build_object('at', now(), "
        "'attempt', 1, 'error', 'TimeoutError: slow', 'worker', gen_random_uuid())) "
        "WHERE id = $1",
        job,
    )
    await queue.cancel(job, by="ops")
    done = await waiting
    assert done.code == 0, done.err
    assert "status" in done.out and "cancelled" in done.out and "ops" in done.out
    assert "#1" in done.out and "TimeoutError: slow" in done.out


async def test_unknown_ids_and_bad_input_exit_non_zero(database: str, pool: asyncpg.Pool) -> None:
    await Queue(pool).enqueue("send_email")
    before = await jobs_table(pool)
    unknown = str(uuid.uuid4())
    cases: list[tuple[tuple[str, ...], int, str]] = [
        (("get", unknown), 3, f"no job with id {unknown}"),
        (("get", "not-an-id"), 3, "no job with id not-an-id"),
        (("cancel", unknown), 3, f"no job with id {unknown}"),
        (("retry", "42"), 3, "no job with id 42"),
        (("list", "--name", "bad name"), 2, "invalid job name 'bad name'"),
        (("list", "--status", "dead"), 2, "invalid choice: 'dead'"),
        (("list", "--limit", "0"), 2, "must be from 1 to 10000"),
        (("frobnicate",), 2, "invalid choice: 'frobnicate'"),
    ]
    for args, code, message in cases:
        run = await pgfleet_jobs(*args, dsn=database)
        assert (run.code, message in run.err) == (code, True), (args, run.code, run.err)
    assert await jobs_table(pool) == before


async def test_database_problems_exit_non_zero_with_a_clear_message() -> None:
    no_dsn = await pgfleet_jobs("list")
    assert no_dsn.code == 2
    assert "no database: pass --dsn or set PGFLEET_DATABASE_URL" in no_dsn.err

    bad_scheme = await pgfleet_jobs("counts", dsn="mysql://root@localhost/jobs")
    assert bad_scheme.code == 2
    assert "must start with postgresql://" in bad_scheme.err

    bad_port = await pgfleet_jobs("counts", dsn="postgresql://localhost:port/db")
    assert bad_port.code == 2
    assert "invalid database URL" in bad_port.err

    down = await pgfleet_jobs("list", dsn=f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    assert down.code == 1
    assert "cannot connect to the database" in down.err
    assert "Traceback" not in down.err


async def test_a_database_without_the_schema_says_to_migrate(database: str) -> None:
    conn = await asyncpg.connect(database)
    try:
        await conn.execute("DROP SCHEMA pgfleet CASCADE")
    finally:
        await conn.close()
    run = await pgfleet_jobs("counts", dsn=database)
    assert run.code == 1
    assert "pgfleet migrate" in run.err
