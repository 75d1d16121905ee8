"""The example Django project (examples/django) as a user runs it: ``manage.py
migrate`` (twice: idempotent), ``manage.py runserver`` and ``manage.py
pgfleet_worker`` as real processes. An order placed over HTTP enqueues its receipt
through Django's tasks framework in the order's transaction; the worker started by
the management command runs it once; the view reads the result back through
Django's API (``get_result``); SIGTERM drains the worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg

from tests.procs import Proc, eventually, free_port, processes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django"


async def _manage(args: list[str], log_dir: Path, name: str, env: dict[str, str]) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}-{time.monotonic_ns()}.log"
    argv = [sys.executable, "manage.py", *args]
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(EXAMPLE),
            env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    return Proc(process, argv, log)


def _http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


async def test_an_order_placed_over_http_gets_its_receipt_from_the_managed_worker(
    database: str, tmp_path: Path
) -> None:
    env = {"DATABASE_URL": database, "DJANGO_SETTINGS_MODULE": "shop.settings"}
    for attempt in ("first", "again"):
        migrate = await _manage(["migrate", "--no-input"], tmp_path, f"migrate-{attempt}", env)
        assert await asyncio.wait_for(migrate.process.wait(), 120) == 0, migrate.output()
    conn = await asyncpg.connect(database)
    try:
        versions = await conn.fetch("SELECT version FROM pgfleet.schema_migrations")
        assert len(versions) >= 3
    finally:
        await conn.close()

    port = free_port()
    web = await _manage(["runserver", "--noreload", f"127.0.0.1:{port}"], tmp_path, "web", env)
    worker = await _manage(
        ["pgfleet_worker", "--concurrency", "2", "--poll-interval", "0.2"], tmp_path, "worker", env
    )
    async with processes(web, worker):
        base = f"http://127.0.0.1:{port}"
        await eventually(lambda: _answers(base), 60, "the example's runserver")
        status, placed = await asyncio.to_thread(
            _http, "POST", f"{base}/orders", {"email": "a@example.com", "total_cents": 1200}
        )
        assert status == 201

        async def receipt_sent() -> bool:
            _, seen = await asyncio.to_thread(_http, "GET", f"{base}/orders/{placed['order']}")
            return bool(seen["task_status"] == "SUCCESSFUL")

        await eventually(receipt_sent, 60, "the receipt task to succeed")
        _, seen = await asyncio.to_thread(_http, "GET", f"{base}/orders/{placed['order']}")
        assert seen == {
            "order": placed["order"],
            "receipts_sent": 1,
            "task_status": "SUCCESSFUL",
            "attempts": 1,
        }
        assert await worker.stop(signal.SIGTERM) == 0, worker.output()
        assert "job succeeded: default:orders.tasks.send_receipt" in worker.output()
        await web.stop(signal.SIGTERM)


async def _answers(base: str) -> bool:
    try:
        await asyncio.to_thread(_http, "GET", f"{base}/orders/0")
    except urllib.error.HTTPError:
        return True  # Django answered (there is no order 0)
    except OSError:
        return False
    return True
