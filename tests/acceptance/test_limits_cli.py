"""``pgfleet limits``, ``pgfleet pause`` and ``pgfleet resume`` as operators run
them: a real process against real Postgres."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import asyncpg

from pgfleet import EnqueueRequest, Queue
from tests.acceptance.api_support import ROOT


async def pgfleet(*args: str, dsn: str) -> tuple[int, str, str]:
    env = {**os.environ, "PGFLEET_DATABASE_URL": dsn}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pgfleet",
        *args,
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _json(out: str) -> Any:
    return json.loads(out)


async def test_an_operator_sets_lists_and_clears_limits(pool: asyncpg.Pool, database: str) -> None:
    code, out, err = await pgfleet(
        "limits", "set", "charge_card", "--concurrency", "5", "--json", dsn=database
    )
    assert code == 0, err
    assert _json(out)["concurrency"] == 5 and _json(out)["source"] == "operator"
    await Queue(pool).enqueue_many([EnqueueRequest("charge_card", {}) for _ in range(3)])
    code, out, err = await pgfleet("pause", "charge_card", dsn=database)
    assert code == 0, err
    code, out, err = await pgfleet("limits", "list", "--json", dsn=database)
    assert code == 0, err
    (row,) = _json(out)["limits"]
    assert (row["name"], row["paused"], row["waiting"]) == ("charge_card", True, {"paused": 3})
    code, out, err = await pgfleet("limits", "list", dsn=database)
    assert "charge_card" in out and "PAUSED" in out and "3 paused" in out
    assert (await pgfleet("resume", "charge_card", dsn=database))[0] == 0
    assert (await pgfleet("limits", "clear", "charge_card", dsn=database))[0] == 0
    assert await Queue(pool).limits() == []


async def test_bad_limits_and_targets_exit_2_and_change_nothing(
    pool: asyncpg.Pool, database: str
) -> None:
    for args in (
        ("limits", "set", "charge_card", "--concurrency", "0"),
        ("limits", "set", "charge_card", "--rate", "10", "--per", "inf"),
        ("limits", "set", "charge_card"),
        ("limits", "set", "bad name", "--concurrency", "1"),
        ("pause",),
        ("pause", "a", "--queue", "b"),
    ):
        code, _, err = await pgfleet(*args, dsn=database)
        assert code == 2, (args, err)
        assert "nothing was changed" in err, err
    assert await Queue(pool).limits() == [] and await Queue(pool).paused() == []


async def test_a_named_queue_is_paused_and_resumed(pool: asyncpg.Pool, database: str) -> None:
    code, _, err = await pgfleet("pause", "--queue", "ledger", dsn=database)
    assert code == 0, err
    assert [(p.kind, p.name) for p in await Queue(pool).paused()] == [("queue", "ledger")]
    code, out, err = await pgfleet("resume", "--queue", "ledger", "--json", dsn=database)
    assert code == 0 and _json(out) == {"resumed": "ledger", "was_paused": True}, err
