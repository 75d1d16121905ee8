"""Which jobs the soak's claim p99 verdict compares: the first window after the
warm-up against the last window of the load, on real rows in Postgres."""

from __future__ import annotations

import asyncpg
import pytest

import pgfleet
from loadtest import scenarios

T0 = 1_780_000_000.0  # a fixed moment: the soak's start, in epoch seconds

# (created, claim delay, count), seconds from T0. Soak(seconds=100, judge_warmup=10)
# judges [10, 40) against [70, 100).
JOBS = [
    (1.0, 3.0, 5),  # started at 4 s: in the warm-up, not judged
    (8.0, 4.0, 1),  # created in the warm-up, started at 12 s: the first window
    (15.0, 0.1, 10),
    (30.0, 0.2, 10),
    (45.0, 9.0, 3),  # started at 54 s: between the windows
    (65.0, 7.0, 1),  # created before the last window, started in it (72 s)
    (80.0, 0.5, 10),
    (99.5, 2.0, 4),  # started at 101.5 s: the drain after the load, not judged
]


async def _rows(pool: asyncpg.Pool) -> None:
    queue = pgfleet.Queue(pool)
    for created, delay, count in JOBS:
        for _ in range(count):
            job_id = await queue.enqueue("soak.judged", {})
            await pool.execute(
                "UPDATE pgfleet.jobs SET status = 'succeeded', created_at = to_timestamp($2),"
                " run_at = to_timestamp($2), started_at = to_timestamp($2 + $3),"
                " finished_at = to_timestamp($2 + $3 + 0.01) WHERE id = $1",
                job_id,
                T0 + created,
                delay,
            )


async def test_the_soak_judges_the_first_window_after_the_warm_up_against_the_last(
    pool: asyncpg.Pool, database: str
) -> None:
    await _rows(pool)
    soak = scenarios.Soak(seconds=100, judge_warmup=10)
    assert scenarios._judge_span(soak) == 30
    conn = await asyncpg.connect(database)
    try:
        first, last = await scenarios._judged(conn, T0, soak)
    finally:
        await conn.close()
    # The warm-up's five 3 s delays are not in the first window; the job that waited
    # through the warm-up and started in it is.
    assert first["started"] == 21
    # 0.1 s x 10, 0.2 s x 10 and 4 s: percentile_cont interpolates the p99 between
    # the last two.
    assert first["p50"] == pytest.approx(0.2, abs=1e-3)
    assert first["p99"] == pytest.approx(0.2 + 0.8 * 3.8, abs=1e-3)
    # The last window holds the job created before it began; not the drain's jobs.
    assert last["started"] == 11
    assert last["p50"] == pytest.approx(0.5, abs=1e-3)
    assert last["p99"] == pytest.approx(0.5 + 0.9 * 6.5, abs=1e-3)


async def test_a_soak_too_short_for_two_windows_after_its_warm_up_is_not_judged(
    pool: asyncpg.Pool, database: str
) -> None:
    await _rows(pool)
    conn = await asyncpg.connect(database)
    try:
        assert await scenarios._judged(conn, T0, scenarios.Soak(seconds=10, judge_warmup=10)) == []
        # A run with no job started in its last window has nothing to compare.
        assert await scenarios._judged(conn, T0 + 1000, scenarios.Soak(seconds=100)) == []
    finally:
        await conn.close()
