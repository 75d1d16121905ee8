"""Schema migrations against a real Postgres."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

import pgfleet
from pgfleet.db import migrate as migrate_module
from pgfleet.errors import MigrationError, SchemaNotReady

EXPECTED_TABLES = {
    "jobs",
    "workers",
    "leader",
    "leases",
    "crons",
    "schema_migrations",
    "revoked_credentials",
    "console_sessions",
    "limits",
    "queue_pauses",
    "flow_turns",
    "flow_fronts",  # 0017: the highest turn claimed per name and priority
    "limit_starts",
    "job_dependencies",
    "jobs_history",  # 0010: partitioned by day; the leader creates the days
    "jobs_history_default",
}
EXPECTED_INDEXES = {
    "jobs_pkey",
    "jobs_waiting",
    "jobs_runnable",
    "jobs_queue_head",
    "jobs_queue_running",
    "jobs_key_active",
    "jobs_running_worker",
    "jobs_finished",
    "jobs_failed_name",
    "jobs_free",
    "jobs_flow_queued",
    "jobs_flow_turns",  # 0017: a name's flagged jobs in claim order
    "jobs_flow_scheduled",  # 0018: those without a turn, in claim order
    "jobs_limited_running",
    "jobs_parents_unsettled",  # 0014: finished parents until their statement's trigger
}


async def _empty_database(pool: asyncpg.Pool) -> None:
    await pool.execute("DROP SCHEMA pgfleet CASCADE")


async def test_migrate_builds_the_expected_schema(pool: asyncpg.Pool) -> None:
    await _empty_database(pool)
    applied = await pgfleet.migrate(pool)
    assert applied == [m.version for m in pgfleet.migrations()]
    tables = {
        r["tablename"]
        for r in await pool.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'pgfleet'")
    }
    assert tables == EXPECTED_TABLES
    indexes = {
        r["indexname"]: r["indexdef"]
        for r in await pool.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'pgfleet' "
            "AND tablename = 'jobs'"
        )
    }
    assert set(indexes) == EXPECTED_INDEXES
    # Claim-path indexes are partial, so retained history stays out of them.
    for name in (
        "jobs_runnable",
        "jobs_queue_head",
        "jobs_key_active",
        "jobs_running_worker",
        "jobs_free",
        "jobs_flow_queued",
        "jobs_flow_turns",
        "jobs_flow_scheduled",
        "jobs_limited_running",
    ):
        assert " WHERE " in indexes[name], name
    # A named queue's serial rule is the claim's (0009): the index is a lookup only.
    assert "UNIQUE" not in indexes["jobs_queue_running"]
    statuses = await pool.fetchval("SELECT enum_range(NULL::pgfleet.job_status)::text")
    assert statuses == "{queued,running,succeeded,failed,cancelled,waiting}"
    # The claim table turns over: vacuum passes over it unthrottled and leaves its
    # size alone (0011).
    options = await pool.fetchval(
        "SELECT reloptions FROM pg_class WHERE oid = 'pgfleet.jobs'::regclass"
    )
    assert "autovacuum_vacuum_cost_delay=0" in options
    assert "vacuum_truncate=false" in options
    assert "autovacuum_vacuum_scale_factor=0.01" in options


async def test_migrate_is_idempotent(pool: asyncpg.Pool) -> None:
    assert await pgfleet.migrate(pool) == []
    assert await pgfleet.migrate(pool) == []
    rows = await pool.fetch("SELECT version, checksum FROM pgfleet.schema_migrations")
    assert [(r["version"], r["checksum"]) for r in rows] == [
        (m.version, m.checksum) for m in pgfleet.migrations()
    ]


async def test_concurrent_migrate_from_many_connections(database: str) -> None:
    setup = await asyncpg.connect(database)
    await setup.execute("DROP SCHEMA pgfleet CASCADE")
    await setup.close()
    conns = [await asyncpg.connect(database) for _ in range(8)]
    try:
        results = await asyncio.gather(*(pgfleet.migrate(c) for c in conns))
    finally:
        for c in conns:
            await c.close()
    # Exactly one caller applied each migration; the others found it done.
    applied = [v for result in results for v in result]
    assert sorted(applied) == [m.version for m in pgfleet.migrations()]
    check = await asyncpg.connect(database)
    try:
        assert await check.fetchval("SELECT count(*) FROM pgfleet.schema_migrations") == len(
            pgfleet.migrations()
        )
    finally:
        await check.close()


async def test_checksum_mismatch_is_a_clear_error(pool: asyncpg.Pool) -> None:
    await pool.execute("UPDATE pgfleet.schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(MigrationError, match=r"checksum mismatch for pgfleet migration 0001_init"):
        await pgfleet.migrate(pool)


async def test_newer_database_is_accepted_with_a_warning(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture
) -> None:
    await pool.execute(
        "INSERT INTO pgfleet.schema_migrations (version, name, checksum) VALUES (999, 'future', 'x')"
    )
    assert await pgfleet.migrate(pool) == []
    assert "newer than this pgfleet" in caplog.text


async def test_migration_script_is_equivalent_to_migrate(pool: asyncpg.Pool) -> None:
    await _empty_database(pool)
    await pool.execute(pgfleet.migration_script())
    # migrate() then sees every version recorded with the right checksum.
    assert await pgfleet.migrate(pool) == []
    async with pool.acquire() as conn:
        await migrate_module.check_schema(conn)
    # Running the script twice refuses instead of corrupting anything.
    async with pool.acquire() as conn:
        with pytest.raises(asyncpg.RaiseError, match="already applied"):
            await conn.execute(pgfleet.migration_script())
        await conn.execute("ROLLBACK")


async def test_check_schema_reports_a_missing_schema(pool: asyncpg.Pool) -> None:
    await _empty_database(pool)
    async with pool.acquire() as conn:
        with pytest.raises(SchemaNotReady, match="run pgfleet.migrate"):
            await migrate_module.check_schema(conn)


async def test_enqueue_without_schema_says_to_migrate(pool: asyncpg.Pool) -> None:
    await _empty_database(pool)
    with pytest.raises(SchemaNotReady, match="migrate"):
        await pgfleet.Queue(pool).enqueue("x", {})


def test_migrations_are_ordered_and_checksummed() -> None:
    shipped = pgfleet.migrations()
    assert [m.version for m in shipped] == list(range(1, len(shipped) + 1))
    assert all(len(m.checksum) == 64 for m in shipped)


async def test_claim_table_analyze_samples_few_rows_and_skips_shown_columns(
    pool: asyncpg.Pool,
) -> None:
    """0016: every column of the claim table has a statistics target of at most 10
    (a column added later without one would bring the leader's frequent ANALYZE back
    to 30,000 sampled rows), and the columns no plan filters on get none."""
    targets = {
        r["attname"]: r["attstattarget"]
        for r in await pool.fetch(
            "SELECT attname, attstattarget FROM pg_attribute"
            " WHERE attrelid = 'pgfleet.jobs'::regclass AND attnum > 0 AND NOT attisdropped"
        )
    }
    unset = sorted(name for name, target in targets.items() if target < 0 or target > 10)
    assert unset == [], f"columns of pgfleet.jobs at the default statistics target: {unset}"
    await pgfleet.Queue(pool).enqueue("stats.probe", {"secret": "x" * 40})
    await pool.execute("ANALYZE pgfleet.jobs")
    with_stats = {
        r["attname"]
        for r in await pool.fetch(
            "SELECT attname FROM pg_stats WHERE schemaname = 'pgfleet' AND tablename = 'jobs'"
        )
    }
    assert {"status", "name", "run_at", "limited"} <= with_stats
    assert not {"payload", "result", "errors", "id", "lock_token"} & with_stats
