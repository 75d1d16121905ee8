"""The worker runtime behind a real PgBouncer in transaction mode, in-process.

With a server pool of one, every client of the pooler shares one server session:
any session state the worker left behind would be seen by the next client.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import pgfleet
from pgfleet import Job, Registry, WorkerConfig
from pgfleet.db.transaction_pooling import behind_pooler
from tests import pgbouncer
from tests.integration.conftest import Recorder, running_worker

pytestmark = pytest.mark.skipif(
    pgbouncer.find_binary() is None and os.environ.get("CI") != "true",
    reason="pgbouncer is not installed (apt-get install pgbouncer); CI installs it",
)

JOBS = 40


@pytest.fixture(scope="module")
def bouncer(pg_server: Any) -> Iterator[pgbouncer.Bouncer]:
    b = pgbouncer.start(pg_server.admin_dsn, "transaction", pool_size=1)
    try:
        yield b
    finally:
        b.stop()


def _registry() -> Registry:
    registry = Registry()

    @registry.job("noop")
    async def noop(job: Job) -> None:
        return None

    return registry


async def _planner_settings(dsn: str) -> tuple[str, str]:
    pool = await pgfleet.create_pool(dsn, min_size=1, max_size=1, pgbouncer=True)
    try:
        row = await pool.fetchrow(
            "SELECT current_setting('enable_seqscan') AS s, "
            "current_setting('enable_bitmapscan') AS b"
        )
        assert row is not None
        return row["s"], row["b"]
    finally:
        await pool.close()


async def _settings_while_draining(pooled: str, config: WorkerConfig) -> tuple[str, str]:
    """Drain jobs, then, the worker still running, read the shared server's settings."""
    pool = await pgfleet.create_pool(pooled, min_size=0, max_size=4, pgbouncer=True)
    events = Recorder()
    try:
        queue = pgfleet.Queue(pool)
        await queue.enqueue_many([pgfleet.EnqueueRequest("noop", {"i": i}) for i in range(JOBS)])
        async with running_worker(pool, _registry(), config, events):
            await events.until(lambda: len(events.outcomes("succeeded")) == JOBS)
            return await _planner_settings(pooled)
    finally:
        await pool.close()


@pytest.mark.parametrize("pgbouncer_mode", [True, False])
async def test_claim_loop_leaves_no_session_state_behind(
    bouncer: pgbouncer.Bouncer, database: str, pgbouncer_mode: bool
) -> None:
    pooled = bouncer.dsn(database.rsplit("/", 1)[1])
    config = WorkerConfig(poll_interval=0.05, listen=False, pgbouncer=pgbouncer_mode)
    # The one server connection every client shares: the claim loop's planner
    # settings must not be on it. Without pgbouncer=True they are (the control).
    expected = ("on", "on") if pgbouncer_mode else ("off", "off")
    assert await _settings_while_draining(pooled, config) == expected


async def test_listen_dsn_wakes_workers_behind_a_transaction_pooler(
    bouncer: pgbouncer.Bouncer, database: str
) -> None:
    pooled = bouncer.dsn(database.rsplit("/", 1)[1])
    pool = await pgfleet.create_pool(pooled, min_size=0, max_size=4, pgbouncer=True)
    events = Recorder()
    try:
        # A poll interval far beyond the test's patience: only a notification wakes it.
        config = WorkerConfig(poll_interval=3600, pgbouncer=True, listen_dsn=database)
        async with running_worker(pool, _registry(), config, events) as (worker, _task):
            await worker.wait_started()
            assert worker.listener is not None
            await worker.listener.connected.wait()
            async with pool.acquire() as conn:
                assert await behind_pooler(conn)
            await pgfleet.Queue(pool).enqueue("noop", {})
            await events.until(lambda: len(events.outcomes("succeeded")) == 1)
            assert "notify" in events.wakeups
    finally:
        await pool.close()


async def test_without_listen_dsn_a_pooled_worker_does_not_listen(
    bouncer: pgbouncer.Bouncer, database: str
) -> None:
    pooled = bouncer.dsn(database.rsplit("/", 1)[1])
    pool = await pgfleet.create_pool(pooled, min_size=0, max_size=4, pgbouncer=True)
    events = Recorder()
    try:
        config = WorkerConfig(poll_interval=0.05, pgbouncer=True)
        async with running_worker(pool, _registry(), config, events) as (worker, _task):
            await worker.wait_started()
            assert worker.listener is None
            await pgfleet.Queue(pool).enqueue("noop", {})
            await events.until(lambda: len(events.outcomes("succeeded")) == 1)
    finally:
        await pool.close()
