"""The example applications of examples/ as their READMEs run them, on a database
without pgfleet's schema: FastAPI + asyncpg (uvicorn and ``pgfleet worker`` as real
processes; then the worker embedded in the app's lifespan, through FastAPI's test
client) and Flask + psycopg (its psycopg and SQLAlchemy routes through Flask's test
client, ``flask init-db`` and a real ``pgfleet worker``).

In each, an order the database refuses (too few in stock) rolls its receipt job back
with it: the job does not exist, so it never runs; a committed order's receipt job
runs exactly once (one attempt, one receipt counted, still one after the worker
drained)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from tests import pgharness
from tests.procs import Proc, eventually, free_port, processes
from tools.devkit import create_database, drop_database

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FASTAPI = EXAMPLES / "fastapi-asyncpg"
FLASK = EXAMPLES / "flask-psycopg"


@pytest.fixture
async def empty_database(pg_server: pgharness.Server) -> AsyncIterator[str]:
    """A database without the pgfleet schema, as a new user has."""
    name = pg_server.next_name()
    dsn = await create_database(pg_server.admin_dsn, name)
    try:
        yield dsn
    finally:
        await drop_database(pg_server.admin_dsn, name)


async def _start(argv: list[str], cwd: Path, log_dir: Path, name: str, dsn: str) -> Proc:
    """A command of the README, run from the example's folder."""
    log = log_dir / f"{name}-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(cwd),
            env={**os.environ, "DATABASE_URL": dsn, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    return Proc(process, argv, log)


async def _run(argv: list[str], cwd: Path, log_dir: Path, name: str, dsn: str) -> str:
    proc = await _start(argv, cwd, log_dir, name, dsn)
    code = await asyncio.wait_for(proc.process.wait(), 120)
    assert code == 0, f"{' '.join(argv)} exited {code}:\n{proc.output()}"
    return proc.output()


def _worker_argv(app: str, dsn: str) -> list[str]:
    return [
        sys.executable, "-m", "pgfleet", "worker", "--app", app, "--dsn", dsn,
        "--metrics-port", "0", "--poll-interval", "0.2",
    ]  # fmt: skip


async def _rows(dsn: str, query: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [dict(row) for row in await conn.fetch(query)]
    finally:
        await conn.close()


async def _jobs(dsn: str) -> list[dict[str, Any]]:
    return await _rows(
        dsn,
        "SELECT name, status::text, attempt, job_key, payload::text,"
        " run_at > now() + interval '6 days' AS delayed FROM pgfleet.jobs ORDER BY id",
    )


async def _receipts(dsn: str) -> dict[int, int]:
    rows = await _rows(dsn, "SELECT id, receipts_sent FROM orders ORDER BY id")
    return {row["id"]: row["receipts_sent"] for row in rows}


# ---------------------------------------------------------------- FastAPI + asyncpg


@pytest.mark.parametrize("worker_runs", ["beside", "embedded"])
async def test_fastapi_orders(empty_database: str, tmp_path: Path, worker_runs: str) -> None:
    """uvicorn with ``pgfleet worker`` beside it, or with the worker in the app's
    lifespan (SHOP_WORKER=embedded): it drains when uvicorn shuts down."""
    dsn = empty_database
    await _run([sys.executable, "-m", "pgfleet", "migrate", "--dsn", dsn], FASTAPI, tmp_path, "migrate", dsn)  # fmt: skip
    port = free_port()
    uvicorn = [sys.executable, "-m", "uvicorn", "fastapi_shop.app:app", "--port", str(port)]
    if worker_runs == "embedded":
        uvicorn = ["env", "SHOP_WORKER=embedded", *uvicorn]
        procs = [await _start(uvicorn, FASTAPI, tmp_path, "uvicorn", dsn)]
    else:
        procs = [
            await _start(uvicorn, FASTAPI, tmp_path, "uvicorn", dsn),
            await _start(
                _worker_argv("fastapi_shop.tasks:registry", dsn), FASTAPI, tmp_path, "worker", dsn
            ),
        ]
    base = f"http://127.0.0.1:{port}"
    async with processes(*procs), aiohttp.ClientSession() as http:

        async def answers() -> bool:
            try:
                async with http.get(f"{base}/orders/0") as resp:
                    return resp.status == 404
            except aiohttp.ClientError:
                return False

        await eventually(answers, 60, "uvicorn to serve the example")

        async def post(body: dict[str, Any]) -> tuple[int, Any]:
            async with http.post(f"{base}/orders", json=body) as resp:
                return resp.status, await resp.json()

        status, placed = await post({"email": "ada@example.com", "sku": "mug", "quantity": 2})
        assert status == 201, placed
        status, refused = await post({"email": "bob@example.com", "sku": "mug", "quantity": 50})
        assert (status, refused) == (409, {"detail": "not enough mug in stock"})
        status, _ = await post({"email": "eve@example.com", "sku": "teapot", "quantity": 1})
        assert status == 404
        jobs = await _jobs(dsn)
        assert [job["payload"] for job in jobs] == [f'{{"order": {placed["order"]}}}'], (
            "the refused orders' jobs rolled back with them"
        )

        async def receipt_sent() -> bool:
            async with http.get(f"{base}/orders/{placed['order']}") as resp:
                return bool((await resp.json())["receipt_status"] == "succeeded")

        await eventually(receipt_sent, 60, "the worker to send the receipt")
        for proc in reversed(procs):  # the worker first, then uvicorn
            # uvicorn re-raises the signal once it has shut down cleanly.
            assert await proc.stop(signal.SIGTERM) in (0, -signal.SIGTERM), proc.output()
        web = procs[0].output()
        assert "Application shutdown complete" in web, web

    assert await _receipts(dsn) == {placed["order"]: 1}
    assert [(job["name"], job["status"], job["attempt"]) for job in await _jobs(dsn)] == [
        ("send_receipt", "succeeded", 1)
    ]
    if worker_runs == "beside":
        assert "job succeeded: send_receipt" in procs[-1].output()


# ---------------------------------------------------------------- Flask + psycopg


async def test_flask_orders_through_psycopg_and_sqlalchemy(
    empty_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn = empty_database
    await _run([sys.executable, "-m", "pgfleet", "migrate", "--dsn", dsn], FLASK, tmp_path, "migrate", dsn)  # fmt: skip
    init = await _run(
        [sys.executable, "-m", "flask", "--app", "flask_shop", "init-db"],
        FLASK,
        tmp_path,
        "init",
        dsn,
    )
    assert "the shop's tables are ready" in init
    monkeypatch.syspath_prepend(str(FLASK))
    from flask_shop import create_app

    app = create_app(dsn)
    try:
        await _order_through_flask(app.test_client(), dsn, tmp_path)
    finally:
        app.extensions["engine"].dispose()  # the SQLAlchemy route's pooled connections


def _body(response: TestResponse) -> dict[str, Any]:
    body = response.get_json()
    assert isinstance(body, dict), response.text
    return body


async def _order_through_flask(client: FlaskClient, dsn: str, tmp_path: Path) -> None:
    mug = {"email": "ada@example.com", "sku": "mug"}

    psycopg_order = client.post("/orders", json={**mug, "quantity": 2})
    assert psycopg_order.status_code == 201, psycopg_order.text
    assert client.post("/orders", json={**mug, "quantity": 50}).status_code == 409
    assert client.post("/orders", json={**mug, "sku": "teapot", "quantity": 1}).status_code == 404
    orm_order = client.post("/orm/orders", json={**mug, "quantity": 3})
    assert orm_order.status_code == 201, orm_order.text
    assert client.post("/orm/orders", json={**mug, "quantity": 50}).status_code == 409
    first, second = _body(psycopg_order)["order"], _body(orm_order)["order"]

    jobs = await _jobs(dsn)
    assert [(job["name"], job["payload"]) for job in jobs] == [
        ("send_receipt", f'{{"order": {first}}}'),
        ("ask_for_review", f'{{"order": {first}}}'),
        ("send_receipt", f'{{"order": {second}}}'),
    ], "the refused orders' jobs rolled back with them"
    review = jobs[1]
    assert (review["job_key"], review["delayed"]) == (f"review:{first}", True)
    assert await _rows(dsn, "SELECT available FROM stock") == [{"available": 5}]

    worker = await _start(
        _worker_argv("flask_shop.tasks:registry", dsn), FLASK, tmp_path, "worker", dsn
    )
    async with processes(worker):

        async def receipts_sent() -> bool:
            return all(
                _body(client.get(f"/orders/{order}"))["receipt_status"] == "succeeded"
                for order in (first, second)
            )

        await eventually(receipts_sent, 60, "the worker to send both receipts")
        assert await worker.stop(signal.SIGTERM) == 0, worker.output()

    assert await _receipts(dsn) == {first: 1, second: 1}
    assert [(job["name"], job["status"], job["attempt"]) for job in await _jobs(dsn)] == [
        ("send_receipt", "succeeded", 1),
        ("ask_for_review", "queued", 0),  # in a week
        ("send_receipt", "succeeded", 1),
    ]
