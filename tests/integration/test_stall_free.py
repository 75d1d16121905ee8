"""Nothing stalls, nothing is lost: a worker whose connections hang, outcomes the
database refuses, and payloads it cannot store. Real Postgres, a real TCP proxy
(tests.chaos.proxy) between the worker and the server; waits are on events and
database state, with generous liveness bounds only."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

import pgfleet
from pgfleet import (
    EnqueueOptions,
    EnqueueRequest,
    Job,
    PayloadError,
    Queue,
    Registry,
    Worker,
    WorkerConfig,
)
from pgfleet._runtime.claim_connection import ClaimConnection
from pgfleet.db.deadlines import BoundedPool, DatabaseTimeout, close_pool
from tests.chaos.proxy import ChaosProxy
from tests.integration.conftest import FAST, Recorder, running_worker
from tools.devkit import until


def _through(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@pytest.fixture
async def proxy(database: str) -> AsyncIterator[ChaosProxy]:
    parts = urlsplit(database)
    if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
        pytest.skip("the proxy tests need a Postgres reached over TCP on 127.0.0.1")
    p = ChaosProxy(parts.port)
    await p.start()
    try:
        yield p
    finally:
        await p.close()


def _registry(done: list[uuid.UUID]) -> Registry:
    registry = Registry()

    @registry.job("work")
    async def work(job: Job) -> None:
        done.append(job.id)

    return registry


async def test_worker_recovers_when_its_connections_hang(
    pool: asyncpg.Pool, database: str, proxy: ChaosProxy
) -> None:
    done: list[uuid.UUID] = []
    queue = Queue(pool)
    first = await queue.enqueue_many([EnqueueRequest("work") for _ in range(20)])
    rec = Recorder()
    config = WorkerConfig(concurrency=4, database_timeout=1.5, listen=True, **FAST)
    wpool = await pgfleet.create_pool(_through(database, proxy.port), min_size=0, max_size=8)
    try:
        async with running_worker(wpool, _registry(done), config, rec) as (worker, task):
            await rec.until(lambda: set(first) <= set(done), timeout=60)
            assert worker.health() is None
            proxy.hang()  # every open connection and every new one answers nothing
            later = await queue.enqueue_many([EnqueueRequest("work") for _ in range(20)])
            # The claim loop's round cannot finish: the worker says it is unready.
            for _ in range(600):
                if worker.health() is not None:
                    break
                await asyncio.sleep(0.05)
            assert worker.health() is not None
            assert not (set(later) & set(done))
            await proxy.heal()  # new connections answer again; the hung ones never will
            await rec.until(lambda: set(later) <= set(done), timeout=90)
            for _ in range(600):
                if worker.health() is None:
                    break
                await asyncio.sleep(0.05)
            assert worker.health() is None
            assert not task.done()
    finally:
        await close_pool(wpool)
    rows = await pool.fetch("SELECT status::text AS s, count(*) AS n FROM pgfleet.jobs GROUP BY 1")
    assert {r["s"]: r["n"] for r in rows} == {"succeeded": 40}


async def test_shutdown_is_bounded_when_connections_hang(
    pool: asyncpg.Pool, database: str, proxy: ChaosProxy
) -> None:
    done: list[uuid.UUID] = []
    queue = Queue(pool)
    await queue.enqueue_many([EnqueueRequest("work") for _ in range(10)])
    rec = Recorder()
    config = WorkerConfig(
        concurrency=2,
        database_timeout=2.0,
        completion_flush_timeout=2.0,
        shutdown_grace_period=1.0,
        **FAST,
    )
    wpool = await pgfleet.create_pool(_through(database, proxy.port), min_size=0, max_size=8)
    stop = asyncio.Event()
    worker = Worker(wpool, _registry(done), config, events=rec)
    task = asyncio.create_task(worker.run(shutdown=stop.wait()))
    try:
        await rec.until(lambda: len(done) == 10, timeout=60)
        proxy.hang()
        await queue.enqueue_many([EnqueueRequest("work") for _ in range(5)])
        stop.set()
        # Liveness, not timing: without bounds this waits for ever.
        stats = await asyncio.wait_for(task, 60)
        assert stats.claimed == 10 and stats.succeeded <= 10
    finally:
        if not task.done():
            task.cancel()
        await close_pool(wpool, timeout=2.0)
    # What the hung worker could not write, the fleet recovers once its heartbeat
    # expires: every job ends succeeded.
    rescuer = Recorder()
    async with running_worker(pool, _registry(done), WorkerConfig(**FAST), rescuer):
        for _ in range(1200):
            left = await pool.fetchval(
                "SELECT count(*) FROM pgfleet.jobs WHERE status <> 'succeeded'"
            )
            if left == 0:
                break
            await asyncio.sleep(0.05)
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE status = 'succeeded'") == 15


async def test_bounded_pool_drops_a_connection_that_hangs(database: str, proxy: ChaosProxy) -> None:
    raw = await pgfleet.create_pool(_through(database, proxy.port), min_size=0, max_size=2)
    try:
        db = BoundedPool(raw, timeout=1.0)
        assert await db.fetchval("SELECT 1") == 1
        proxy.hang()
        with pytest.raises(DatabaseTimeout, match="did not answer"):
            await db.fetchval("SELECT 1")
        assert db.hung == 1
        await proxy.heal()
        # The hung connection went, not back into the pool: the next call works.
        assert await db.fetchval("SELECT 2") == 2
    finally:
        await close_pool(raw, timeout=2.0)


# ------------------------------------------------------------------ poison outcomes


def _poison_registry() -> Registry:
    registry = Registry()

    @registry.job("ok")
    async def ok(job: Job) -> None:
        return None

    @registry.job("nul")
    async def nul(job: Job) -> None:
        raise RuntimeError("bad\x00byte")

    @registry.job("surrogate")
    async def surrogate(job: Job) -> None:
        raise RuntimeError("file \udcff.txt")

    @registry.job("huge")
    async def huge(job: Job) -> None:
        raise RuntimeError("x" * 1_000_000)

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no")

    @registry.job("unprintable")
    async def unprintable(job: Job) -> None:
        raise Unprintable()

    return registry


async def test_poison_outcomes_are_stored_readably_and_block_nothing(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    once = EnqueueOptions(max_attempts=1)
    poison = {
        name: await queue.enqueue(name, options=once)
        for name in ("nul", "surrogate", "huge", "unprintable")
    }
    fine = await queue.enqueue_many([EnqueueRequest("ok") for _ in range(50)])
    rec = Recorder()
    config = WorkerConfig(concurrency=4, **FAST)
    async with running_worker(pool, _poison_registry(), config, rec):
        await rec.until(lambda: len(rec.finished) >= 54, timeout=60)
    rows = {r["id"]: r for r in await pool.fetch("SELECT * FROM pgfleet.jobs")}
    assert all(rows[i]["status"] == "succeeded" for i in fine)
    for _name, job_id in poison.items():
        assert rows[job_id]["status"] == "failed"
    assert rows[poison["nul"]]["last_error"] == "RuntimeError: bad\\x00byte"
    assert rows[poison["surrogate"]]["last_error"] == "RuntimeError: file \\udcff.txt"
    assert len(rows[poison["huge"]]["last_error"]) <= 4000
    assert rows[poison["unprintable"]]["last_error"].startswith("Unprintable: ")


async def test_an_outcome_the_database_refuses_is_isolated(pool: asyncpg.Pool) -> None:
    """A refusal that is not about the connection (here a trigger) must not hold
    back the other outcomes of the round, nor every later round."""
    await pool.execute(
        """
        CREATE FUNCTION public.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'succeeded' AND NEW.payload ? 'poison' THEN
                RAISE EXCEPTION 'refusing this outcome';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE UPDATE ON pgfleet.jobs
            FOR EACH ROW EXECUTE FUNCTION public.refuse_poison();
        """
    )
    queue = Queue(pool)
    bad = await queue.enqueue("ok", {"poison": True})
    good = await queue.enqueue_many([EnqueueRequest("ok", {"i": i}) for i in range(30)])
    registry = Registry()

    @registry.job("ok")
    async def ok(job: Job, payload: Any) -> None:
        return None

    rec = Recorder()
    async with running_worker(pool, registry, WorkerConfig(concurrency=8, **FAST), rec):
        await rec.until(lambda: len(rec.finished) >= 31, timeout=60)
    rows = {r["id"]: r for r in await pool.fetch("SELECT * FROM pgfleet.jobs")}
    assert all(rows[i]["status"] == "succeeded" for i in good)
    assert rows[bad]["status"] == "failed"
    assert "could not record this attempt's succeeded outcome" in rows[bad]["last_error"]
    assert "refusing this outcome" in rows[bad]["last_error"]


# ------------------------------------------------------------------ payloads


@pytest.mark.parametrize(
    "payload",
    [json.loads('{"s": "\\ud800"}'), {"k\udcff": 1}, ["a\x00b"]],
    ids=["lone-surrogate-value", "lone-surrogate-key", "nul"],
)
async def test_unstorable_payloads_raise_payload_error_on_every_path(
    pool: asyncpg.Pool, payload: Any
) -> None:
    queue = Queue(pool)
    with pytest.raises(PayloadError):
        await queue.enqueue("work", payload)
    with pytest.raises(PayloadError):
        await queue.enqueue("work", payload, options=EnqueueOptions(priority=1))
    with pytest.raises(PayloadError):
        await queue.enqueue("work", payload, options=EnqueueOptions(job_key="k"))
    with pytest.raises(PayloadError):
        await queue.enqueue_many([EnqueueRequest("work"), EnqueueRequest("work", payload)])
    async with pool.acquire() as conn, conn.transaction():
        with pytest.raises(PayloadError):
            await queue.enqueue("work", payload, connection=conn)
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs") == 0


@dataclass
class SendEmail:
    address: str


async def test_queue_checks_payloads_against_handler_types(pool: asyncpg.Pool) -> None:
    registry = Registry()

    @registry.job("send_email")
    async def send_email(job: Job, payload: SendEmail) -> None:
        return None

    queue = Queue(pool, known_names=registry, check_payloads=True)
    with pytest.raises(PayloadError, match="address"):
        await queue.enqueue("send_email", {"to": "a@example.org"})
    with pytest.raises(PayloadError, match=r"item 1: .*address"):
        await queue.enqueue_many(
            [
                EnqueueRequest("send_email", {"address": "a@example.org"}),
                EnqueueRequest("send_email", {"to": "b@example.org"}),
            ]
        )
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs") == 0
    await queue.enqueue("send_email", SendEmail("a@example.org"))
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs") == 1
    with pytest.raises(pgfleet.InvalidOptions, match="check_payloads"):
        Queue(pool, check_payloads=True)


async def test_a_query_timeout_on_a_hung_connection_returns_and_frees_the_slot(
    database: str, proxy: ChaosProxy
) -> None:
    """What a handler does with the worker's pool: asyncpg's own release would wait
    for ever for the cancel of a timed-out query that the server never answers."""
    raw = await pgfleet.create_pool(
        _through(database, proxy.port), min_size=0, max_size=1, release_timeout=1.0
    )
    try:
        assert await raw.fetchval("SELECT 1") == 1
        proxy.hang()
        call = asyncio.create_task(raw.execute("SELECT 1", timeout=1.0))
        done, _ = await asyncio.wait({call}, timeout=60)
        assert done, "a query timeout on a hung connection never returned"
        with pytest.raises(TimeoutError):
            call.result()
        await proxy.heal()
        # max_size=1: the slot came back, with a new connection behind it.
        assert await asyncio.wait_for(raw.fetchval("SELECT 2"), 60) == 2
    finally:
        await close_pool(raw, timeout=2.0)


async def test_a_handlers_own_timeout_error_is_not_reported_as_its_timeout(
    pool: asyncpg.Pool,
) -> None:
    registry = Registry()

    @registry.job("async_own")
    async def async_own(job: Job) -> None:
        raise TimeoutError  # e.g. asyncpg's query timeout inside the handler

    @registry.job("sync_own")
    def sync_own(job: Job) -> None:
        raise TimeoutError

    queue = Queue(pool)
    once = EnqueueOptions(max_attempts=1)
    ids = [await queue.enqueue(name, options=once) for name in ("async_own", "sync_own")]
    rec = Recorder()
    async with running_worker(pool, registry, WorkerConfig(**FAST), rec):
        await rec.until(lambda: len(rec.finished) >= 2, timeout=60)
    for job_id in ids:
        job = await queue.get(job_id)
        assert job is not None and job.last_error == "TimeoutError: "


async def test_a_pipelined_round_on_a_connection_lost_in_the_same_turn_is_a_lost_connection(
    pool: asyncpg.Pool,
) -> None:
    """A reset read in the loop turn that delivered the previous answer closes the
    claim connection after the loop checked it and before the next round's task
    first runs: asyncpg has then detached the proxy and handed the slot back. The
    round must fail as a lost connection (retried like any outage), never call the
    released proxy ("released back to the pool", the misuse the chaos suite flags)."""
    from pgfleet.db.deadlines import Held
    from pgfleet.errors import DatabaseUnavailable

    registry = Registry()

    @registry.job("never")
    async def never(job: Job) -> None:  # pragma: no cover - nothing is enqueued
        return None

    worker = Worker(pool, registry, WorkerConfig(concurrency=2, **FAST))
    held = Held(await pool.acquire())
    held.conn.terminate()  # asyncpg cleans up at once: the proxy is detached now
    assert held.closed()
    worker._claims.connection.held = held
    with pytest.raises(DatabaseUnavailable, match="closed before the round was sent"):
        await worker._claims._send([], 1, 1, [])
    assert pool.get_size() - pool.get_idle_size() == 0  # the slot went back


@pytest.mark.parametrize("pooled", [False, True], ids=["session", "pooler"])
async def test_a_claim_connection_dropped_mid_statement_ends_the_statement_on_the_server(
    database: str, pooled: bool
) -> None:
    """The claim loop drops a connection whose round passed its deadline. The
    server must end that round too: run to its end, it would keep the row locks of
    the jobs it claims, and the worker's next connection would wait on them."""
    pool = await pgfleet.create_pool(database, min_size=0, max_size=2)
    claim = ClaimConnection(pool, pooled=pooled, timeout=10.0)
    try:
        await claim.open()
        assert claim.held is not None
        conn = claim.held.conn
        pid = conn.get_server_pid()

        async def long_round(store: Any) -> Any:
            # The stand-in for a round that runs long on the server.
            return await conn.fetch("SELECT pg_sleep(600)")

        round_task = asyncio.create_task(claim.transact(long_round))

        async def sleeping() -> bool:
            state = await pool.fetchval(
                "SELECT wait_event FROM pg_stat_activity WHERE pid = $1", pid
            )
            return bool(state == "PgSleep")

        await until(sleeping, timeout=30, what="the round running on the server")
        claim.drop()
        with pytest.raises(Exception):  # noqa: B017 - whatever the dropped connection raises
            await round_task

        async def gone() -> bool:
            n = await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
            return bool(n == 0)

        await until(gone, timeout=30, what="the dropped round's backend to end")
    finally:
        await close_pool(pool, timeout=2.0)


def _scans_of_jobs(node: dict[str, Any]) -> list[dict[str, Any]]:
    scan = node["Node Type"].endswith("Scan")
    found = [node] if scan and node.get("Relation Name") == "jobs" else []
    for child in node.get("Plans", []):
        found += _scans_of_jobs(child)
    return found


@pytest.mark.parametrize("statement", ["job_complete_and_claim", "job_complete_and_claim_lean"])
async def test_the_claim_sessions_plan_made_on_an_empty_table_reads_outcomes_by_id(
    pool: asyncpg.Pool, statement: str
) -> None:
    """The claim session plans its statement once (generic) on the statistics of
    the moment. On a table vacuumed while empty they say no row, and the
    completion's join of outcomes to jobs came out as a scan of the whole primary
    key per round, with a filter: a soak's backlog built on a just-truncated table
    made one round take 14.6 s. The outcome ids are an index condition whatever
    the statistics say."""
    from pgfleet.db.queries import Q

    sql = getattr(Q, statement).sql
    async with pool.acquire() as conn:
        await conn.execute("TRUNCATE pgfleet.jobs CASCADE")
        await conn.execute("VACUUM ANALYZE pgfleet.jobs")
        assert (
            await conn.fetchval(
                "SELECT reltuples FROM pg_class WHERE oid = 'pgfleet.jobs'::regclass"
            )
            == 0
        )
        await conn.execute(Q.claim_session_begin.sql)
        try:
            params = (await conn.prepare(sql)).get_parameters()
            types = [await conn.fetchval("SELECT format_type($1, NULL)", t.oid) for t in params]
            await conn.execute(
                f"PREPARE empty_plan ({', '.join(types)}) AS {sql.rstrip().rstrip(';')}"
            )
            nulls = ", ".join("NULL" for _ in params)
            plan = json.loads(
                await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE empty_plan ({nulls})")
            )
            await conn.execute("DEALLOCATE empty_plan")
        finally:
            await conn.execute(Q.claim_session_end.sql)
    done = [p for p in plan[0]["Plan"]["Plans"] if p.get("Subplan Name") == "CTE done"]
    assert len(done) == 1
    scans = _scans_of_jobs(done[0])
    assert scans and all("Index Cond" in s for s in scans), scans
