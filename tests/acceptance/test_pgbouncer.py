"""pgfleet behind a real PgBouncer (the Debian package, started privately by the
tests on a free port of 127.0.0.1, never the system service).

The same suite runs with ``pool_mode = transaction`` and a server pool of 4 for a
fleet of 3 worker processes of concurrency 16, producers and the API (workers with
``--pgbouncer --listen-dsn <direct>``), and with ``pool_mode = session`` and a pool
big enough for every client (workers with their defaults: LISTEN and prepared
statements through the pooler). Effects are counted in the database.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

import pgfleet
from pgfleet import EnqueueOptions, EnqueueRequest
from pgfleet.errors import MigrationError
from tests import pgbouncer
from tests.acceptance.api_support import ROOT, Fleet, call, until
from tests.procs import free_ports, http_get, parse_metrics

pytestmark = pytest.mark.skipif(
    pgbouncer.find_binary() is None and os.environ.get("CI") != "true",
    reason="pgbouncer is not installed (apt-get install pgbouncer); CI installs it",
)

PROCESSES, CONCURRENCY, POOL_SIZE = 3, 16, 6
RECORDS_PER_PRODUCER, PRODUCERS, BATCH = 60, 4, 200
API_POOL = 2
#: Server connections PgBouncer may open per database in each mode. Session mode
#: binds a server connection to each client connection for its life (an idle one
#: in a pool included), so it needs one per client: workers, API, producers, the
#: test's own few.
SERVER_POOL = {"transaction": 4, "session": PROCESSES * POOL_SIZE + API_POOL + PRODUCERS + 4}
LANE_JOBS, FLAKY_JOBS, API_JOBS = 20, 10, 5


@pytest.fixture(scope="module", params=["transaction", "session"])
def bouncer(request: Any, pg_server: Any) -> Iterator[pgbouncer.Bouncer]:
    mode = request.param
    b = pgbouncer.start(pg_server.admin_dsn, mode, pool_size=SERVER_POOL[mode])
    try:
        yield b
    finally:
        b.stop()


def _dbname(dsn: str) -> str:
    return dsn.rsplit("/", 1)[1]


@pytest.fixture
async def fleet(database: str, tmp_path: Path) -> AsyncIterator[Fleet]:
    f = Fleet(database, tmp_path)
    try:
        yield f
    finally:
        await f.stop_all()
        for proc in f.processes:  # shown by pytest when the test failed
            print(f"----- {proc.name} (pid {proc.pid}) -----\n{proc.output()}")


async def _produce(pooled: str, transaction: bool) -> dict[str, list[Any]]:
    """Enqueue through the pooler from several producers at once."""
    pool = await pgfleet.create_pool(pooled, min_size=0, max_size=PRODUCERS, pgbouncer=transaction)
    try:
        queue = pgfleet.Queue(pool)
        ids: dict[str, list[Any]] = {"record": [], "lane": [], "flaky": [], "kill": []}

        async def producer(p: int) -> None:
            for i in range(RECORDS_PER_PRODUCER):
                ids["record"].append(await queue.enqueue("record", {"p": p, "i": i}))

        await asyncio.gather(*(producer(p) for p in range(PRODUCERS)))
        batch = [EnqueueRequest("record", {"b": i}) for i in range(BATCH)]
        ids["record"] += await queue.enqueue_many(batch)
        lane = EnqueueOptions(queue_name="lane")
        for i in range(LANE_JOBS):
            ids["lane"].append(await queue.enqueue("serial", {"ms": 5, "i": i}, options=lane))
        retry = EnqueueOptions(max_attempts=3)
        for _ in range(FLAKY_JOBS):
            ids["flaky"].append(await queue.enqueue("flaky", {"failures": 1}, options=retry))
        await queue.flush_notifications()
        return ids
    finally:
        await pool.close()


async def test_fleet_through_pgbouncer(
    bouncer: pgbouncer.Bouncer, database: str, fleet: Fleet, tmp_path: Path
) -> None:
    transaction = bouncer.pool_mode == "transaction"
    pooled = bouncer.dsn(_dbname(database))
    direct = await asyncpg.connect(database)
    try:
        await direct.execute(
            "CREATE TABLE IF NOT EXISTS public.executions (job_id uuid NOT NULL, name text "
            "NOT NULL, attempt integer NOT NULL, pid integer NOT NULL, worker_id uuid, "
            "started_at timestamptz NOT NULL DEFAULT clock_timestamp(), finished_at "
            "timestamptz, seq bigserial)"
        )
        port = free_ports(PROCESSES)
        mode_flags = ["--pgbouncer", "--listen-dsn", database] if transaction else []
        supervisor = fleet.spawn(
            "workers",
            "worker",
            "--dsn",
            pooled,
            "--app",
            "tests.apps.pooled_app:registry",
            "--crons",
            "tests.apps.pooled_app:crons",
            "--processes",
            str(PROCESSES),
            "--concurrency",
            str(CONCURRENCY),
            "--pool-size",
            str(POOL_SIZE),
            "--metrics-port",
            str(port),
            "--poll-interval",
            "0.2",
            "--cron-poll-interval",
            "0.2",
            "--heartbeat-interval",
            "0.5",
            "--dead-worker-timeout",
            "3",
            "--backoff-base",
            "0.05",
            "--backoff-cap",
            "0.2",
            *mode_flags,
        )
        api_flags = ["--pgbouncer"] if transaction else []
        api = await fleet.api(*api_flags, "--pool-size", str(API_POOL), dsn=pooled)
        ids = await _produce(pooled, transaction)
        async with aiohttp.ClientSession() as http:
            for i in range(API_JOBS):
                reply = await call(
                    http, "POST", f"{api.url}/jobs", json={"name": "record", "payload": {"a": i}}
                )
                assert reply.status == 202, reply.body
                ids["record"].append(reply.body["id"])

        async def settled() -> bool:
            left = await direct.fetchval(
                "SELECT count(*) FROM pgfleet.jobs WHERE name <> 'tick' "
                "AND status NOT IN ('succeeded', 'failed')"
            )
            return bool(left == 0)

        await until(settled, "every job to finish through pgbouncer", timeout=120)
        async with aiohttp.ClientSession() as http:
            one = await call(http, "GET", f"{api.url}/jobs/{ids['record'][-1]}")
        assert one.status == 200 and one.body["status"] == "succeeded", one.body

        # Drained exactly once.
        records = len(ids["record"])
        assert records == RECORDS_PER_PRODUCER * PRODUCERS + BATCH + API_JOBS
        twice = await direct.fetchval(
            "SELECT count(*) FROM (SELECT job_id FROM public.executions WHERE name = 'record' "
            "GROUP BY job_id HAVING count(*) <> 1) t"
        )
        assert twice == 0
        assert (
            await direct.fetchval(
                "SELECT count(*) FROM pgfleet.jobs WHERE name = 'record' AND status = 'succeeded'"
            )
            == records
        )
        assert (
            await direct.fetchval(
                "SELECT count(DISTINCT job_id) FROM public.executions WHERE name = 'record'"
            )
            == records
        )
        # A named queue runs one job at a time.
        lane = await direct.fetch(
            "SELECT started_at, finished_at FROM public.executions WHERE name = 'serial' "
            "ORDER BY started_at"
        )
        assert len(lane) == LANE_JOBS
        for before, after in itertools.pairwise(lane):
            assert after["started_at"] >= before["finished_at"]
        # Retries: the first attempt failed, the second succeeded.
        flaky = await direct.fetch(
            "SELECT status::text, attempt FROM pgfleet.jobs WHERE name = 'flaky'"
        )
        assert sorted((r["status"], r["attempt"]) for r in flaky) == [("succeeded", 2)] * FLAKY_JOBS
        # A worker killed mid-job (after the drain: a killed process's other jobs
        # would run again, at least once): the fleet rescues (buries) its job, and
        # the supervisor replaces the process.
        pool = await pgfleet.create_pool(pooled, min_size=0, max_size=1, pgbouncer=transaction)
        try:
            once = EnqueueOptions(max_attempts=1)
            ids["kill"].append(await pgfleet.Queue(pool).enqueue("kill_worker", None, options=once))
        finally:
            await pool.close()
        await until(settled, "the killed worker's job to be rescued", timeout=120)
        dead = await direct.fetchrow(
            "SELECT status::text, last_error FROM pgfleet.jobs WHERE id = $1", ids["kill"][0]
        )
        assert dead is not None
        assert dead["status"] == "failed"
        assert "stopped heartbeating" in dead["last_error"]

        # Crons: one job per occurrence.
        async def occurrences() -> bool:
            n = await direct.fetchval(
                "SELECT count(DISTINCT run_at) FROM pgfleet.jobs WHERE name = 'tick'"
            )
            return bool(n >= 3)

        await until(occurrences, "three cron occurrences", timeout=60)

        # Metrics of the workers (any of the three processes finished jobs).
        finished = 0.0
        for i in range(PROCESSES):
            status, text = await http_get(f"http://127.0.0.1:{port + i}/metrics")
            assert status == 200
            samples = parse_metrics(text).get("pgfleet_jobs_finished_total", [])
            finished += sum(v for _labels, v in samples)
        assert finished >= 1

        supervisor.signal(signal.SIGTERM)
        assert await supervisor.wait(60) == 0, supervisor.output()
        ticks = await direct.fetch(
            "SELECT run_at, count(*) AS n FROM pgfleet.jobs WHERE name = 'tick' GROUP BY run_at"
        )
        assert ticks and all(r["n"] == 1 for r in ticks)
        out = supervisor.output()
        listener = 1 if transaction else 0
        budget = (POOL_SIZE + listener) * PROCESSES
        assert f"at most {budget} connections" in out, out
        assert "prepared statement" not in out, out
        if transaction:
            assert "through a transaction-mode pooler" in out
    finally:
        await direct.close()


async def test_migrations_need_a_direct_or_session_connection(
    bouncer: pgbouncer.Bouncer, database: str
) -> None:
    pooled = bouncer.dsn(_dbname(database))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGFLEET_")}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pgfleet",
        "migrate",
        "--dsn",
        pooled,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 60)
    stdout, stderr = out.decode(), err.decode()
    pool = await pgfleet.create_pool(pooled, min_size=0, max_size=2, pgbouncer=True)
    try:
        if bouncer.pool_mode == "transaction":
            assert child.returncode != 0
            assert "need a direct or session-mode connection" in stderr, stderr
            with pytest.raises(MigrationError, match="transaction mode"):
                await pgfleet.migrate(pool)
        else:
            assert child.returncode == 0, stderr
            assert "up to date" in stdout
            assert await pgfleet.migrate(pool) == []
    finally:
        await pool.close()
    # The database's own address is never refused.
    direct = await asyncpg.connect(database)
    try:
        assert await pgfleet.migrate(direct) == []
    finally:
        await direct.close()
