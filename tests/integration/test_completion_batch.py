"""The claim round's outcome arrays as the store sends them: an action shared by
every outcome goes once, delays, errors, ran times or results that no outcome has
go as NULL, and the results as one text. Each job must still be written as its own
outcome says."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
import pytest

from pgfleet import EnqueueRequest, Queue
from pgfleet.db.store import Store
from pgfleet.payloads import encode_result


async def _round(
    pool: asyncpg.Pool,
    worker_id: uuid.UUID,
    outcomes: list[tuple[Any, ...]],
    *,
    limit: int = 0,
    flow: bool = True,
) -> list[Any]:
    """One round: ``outcomes`` as (id, token, action, delay, error, ran, result)."""
    async with pool.acquire() as conn:
        return await Store(conn).job_complete_and_claim(
            ids=[o[0] for o in outcomes],
            tokens=[o[1] for o in outcomes],
            actions=[o[2] for o in outcomes],
            delays=[o[3] for o in outcomes],
            errors=[o[4] for o in outcomes],
            ran=[o[5] for o in outcomes],
            results=[o[6] for o in outcomes],
            worker_id=worker_id,
            job_names=["batch"],
            queue_names=None,
            limit=limit,
            start=limit,
            started=[],
            flow=flow,
        )


async def _claim(pool: asyncpg.Pool, worker_id: uuid.UUID, n: int) -> list[tuple[Any, Any]]:
    await Queue(pool).enqueue_many([EnqueueRequest("batch", i) for i in range(n)])
    rows = await _round(pool, worker_id, [], limit=n)
    claimed = sorted((r["id"], r["lock_token"]) for r in rows if r["claimed"] and r["id"])
    assert len(claimed) == n
    return claimed


async def _states(pool: asyncpg.Pool, ids: list[Any]) -> list[tuple[Any, ...]]:
    rows = await pool.fetch(
        "SELECT status::text, last_error, result_json::text AS result, "
        "run_at > now() + interval '30 seconds' AS later, started_at IS NOT NULL AS started "
        "FROM pgfleet.jobs WHERE id = ANY($1::uuid[]) ORDER BY array_position($1, id)",
        ids,
    )
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("flow", [True, False], ids=["full", "lean"])
async def test_outcomes_sharing_an_action_each_keep_their_own_values(
    pool: asyncpg.Pool, flow: bool
) -> None:
    worker_id = uuid.uuid4()
    (a, ta), (b, tb), (c, tc), (d, td) = await _claim(pool, worker_id, 4)
    # Plain successes: one action, every other array empty of values.
    await _round(
        pool, worker_id, [(a, ta, "succeeded", None, None, None, None),
                          (b, tb, "succeeded", None, None, None, None)], flow=flow,
    )  # fmt: skip
    # One action, each with its own error.
    await _round(
        pool, worker_id, [(c, tc, "failed", None, "E: c", 0.5, None),
                          (d, td, "failed", None, "E: d", None, None)], flow=flow,
    )  # fmt: skip
    assert await _states(pool, [a, b, c, d]) == [
        ("succeeded", None, None, False, True),
        ("succeeded", None, None, False, True),
        ("failed", "E: c", None, False, True),
        ("failed", "E: d", None, False, True),
    ]


async def test_mixed_outcomes_in_one_round_each_get_their_own_action(
    pool: asyncpg.Pool,
) -> None:
    worker_id = uuid.uuid4()
    (a, ta), (b, tb), (c, tc) = await _claim(pool, worker_id, 3)
    await _round(
        pool, worker_id, [(a, ta, "succeeded", None, None, None, '{"n": 1}'),
                          (b, tb, "retry", 60.0, "E: b", None, None),
                          (c, tc, "remove", None, None, None, None)],
    )  # fmt: skip
    assert await _states(pool, [a, b]) == [
        ("succeeded", None, '{"n": 1}', False, True),
        ("queued", "E: b", None, True, True),
    ]
    # Removed at completion: nothing needs its row.
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE id = $1", c) == 0


async def test_a_round_of_removals_deletes_each_job_it_names(pool: asyncpg.Pool) -> None:
    worker_id = uuid.uuid4()
    claimed = await _claim(pool, worker_id, 3)
    await _round(pool, worker_id, [(i, t, "remove", None, None, None, None) for i, t in claimed])
    left = await pool.fetchval(
        "SELECT count(*) FROM pgfleet.jobs WHERE id = ANY($1::uuid[])", [i for i, _ in claimed]
    )
    assert left == 0


@pytest.mark.parametrize("flow", [True, False], ids=["full", "lean"])
async def test_results_sent_as_one_text_each_reach_their_own_job(
    pool: asyncpg.Pool, flow: bool
) -> None:
    worker_id = uuid.uuid4()
    (a, ta), (b, tb), (c, tc), (d, td), (e, te) = await _claim(pool, worker_id, 5)
    # A separator inside a string value is escaped by the encoder, never raw.
    tricky = encode_result({"s": "a\x1eb", "t": ""})
    assert "\x1e" not in tricky
    await _round(
        pool, worker_id, [(a, ta, "succeeded", None, None, None, None),
                          (b, tb, "succeeded", None, None, None, tricky),
                          (c, tc, "remove", None, None, None, '"kept"'),
                          (d, td, "remove", None, None, None, None),
                          (e, te, "succeeded", None, None, None, "[]")], flow=flow,
    )  # fmt: skip
    assert await _states(pool, [a, b, c, e]) == [
        ("succeeded", None, None, False, True),
        ("succeeded", None, tricky, False, True),
        # A job with a result to keep is not removed.
        ("succeeded", None, '"kept"', False, True),
        ("succeeded", None, "[]", False, True),
    ]
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs WHERE id = $1", d) == 0
    value = await pool.fetchval("SELECT result_json FROM pgfleet.jobs WHERE id = $1", b)
    assert json.loads(value) == {"s": "a\x1eb", "t": ""}


async def test_a_result_holding_the_separator_raw_is_refused_before_the_round(
    pool: asyncpg.Pool,
) -> None:
    worker_id = uuid.uuid4()
    (a, ta), (b, tb) = await _claim(pool, worker_id, 2)
    with pytest.raises(ValueError, match="U\\+001E"):
        await _round(
            pool, worker_id, [(a, ta, "succeeded", None, None, None, '"x\x1ey"'),
                              (b, tb, "succeeded", None, None, None, "1")],
        )  # fmt: skip
    # Nothing was written: both jobs still run under their claim.
    statuses = await pool.fetch("SELECT status::text FROM pgfleet.jobs WHERE id = ANY($1)", [a, b])
    assert [r["status"] for r in statuses] == ["running", "running"]
