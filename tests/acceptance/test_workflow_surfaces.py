"""Workflows through the operator surfaces, as real processes: the HTTP API
(`after` options, POST /batches, GET /batches/{id}, GET /jobs/{id}/dependencies) and
``pgfleet jobs deps`` and ``pgfleet jobs batch``."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from pgfleet import EnqueueOptions, EnqueueRequest, Queue
from tests.acceptance.api_support import Fleet, call
from tests.acceptance.test_jobs_cli import pgfleet_jobs


@pytest.fixture
async def fleet(database: str, tmp_path: Any) -> AsyncIterator[Fleet]:
    f = Fleet(database, tmp_path)
    try:
        yield f
    finally:
        await f.stop_all()
        for proc in f.processes:
            print(f"----- {proc.name} (pid {proc.pid}) -----\n{proc.output()}")


async def test_the_api_enqueues_dependents_and_batches_and_reports_them(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    async with aiohttp.ClientSession() as http:
        chain = await call(
            http,
            "POST",
            f"{api.url}/jobs",
            json={
                "jobs": [
                    {"name": "record"},
                    {"name": "record", "options": {"after": [0]}},
                ]
            },
        )
        assert chain.status == 202, chain.body
        assert [j["status"] for j in chain.body["jobs"]] == ["queued", "waiting"]
        parent, child = (j["id"] for j in chain.body["jobs"])
        deps = await call(http, "GET", f"{api.url}/jobs/{child}/dependencies")
        assert deps.status == 200
        assert deps.body["parents"] == [
            {
                "id": parent,
                "name": "record",
                "status": "queued",
                "run_anyway": False,
                "batch": False,
            }
        ]
        assert deps.body["children"] == []

        unknown = str(uuid.uuid4())
        refused = await call(
            http,
            "POST",
            f"{api.url}/jobs",
            json={"name": "record", "options": {"after": [unknown]}},
        )
        assert refused.status == 422 and unknown in refused.body["error"]
        cycle = await call(
            http,
            "POST",
            f"{api.url}/jobs",
            json={"jobs": [{"name": "record", "options": {"after": [0]}}]},
        )
        assert cycle.status == 422 and "cycle" in cycle.body["error"]

        batch = await call(
            http,
            "POST",
            f"{api.url}/batches",
            json={
                "jobs": [{"name": "record"}, {"name": "record"}],
                "callback": {"name": "record", "payload": {"report": True}},
            },
        )
        assert batch.status == 202, batch.body
        assert batch.headers["Location"] == f"/batches/{batch.body['id']}"
        progress = await call(http, "GET", api.url + batch.headers["Location"])
        assert progress.status == 200
        assert progress.body == {
            "id": batch.body["id"],
            "size": 2,
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "pending": 2,
            "callback_status": "waiting",
        }
        missing = await call(http, "GET", f"{api.url}/batches/{uuid.uuid4()}")
        assert missing.status == 404
    assert await api.stop() == 0


async def test_the_cli_shows_a_jobs_relatives_and_a_batchs_progress(
    database: str, pool: asyncpg.Pool
) -> None:
    queue = Queue(pool)
    parent = await queue.enqueue("record")
    child = await queue.enqueue("record", options=EnqueueOptions(after=(parent,)))
    batch_id, members = await queue.enqueue_batch(
        [EnqueueRequest("record")] * 3, callback=EnqueueRequest("record")
    )
    await queue.cancel(members[0])

    deps = await pgfleet_jobs("deps", str(child), "--json", dsn=database)
    assert deps.code == 0, deps.err
    assert [p["id"] for p in deps.json()["parents"]] == [str(parent)]
    table = await pgfleet_jobs("deps", str(parent), dsn=database)
    assert table.code == 0 and "child" in table.out and str(child) in table.out

    progress = await pgfleet_jobs("batch", str(batch_id), "--json", dsn=database)
    assert progress.code == 0, progress.err
    assert progress.json()["cancelled"] == 1 and progress.json()["pending"] == 2
    assert progress.json()["callback_status"] == "waiting"
    none = await pgfleet_jobs("batch", str(uuid.uuid4()), dsn=database)
    assert none.code == 3


async def test_the_console_shows_parents_children_and_a_batchs_progress(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    token = "console-workflow-token-8Hq3xV-2pLm"
    api = await fleet.api(env={"PGFLEET_API_TOKEN": token})
    queue = Queue(pool)
    parent = await queue.enqueue("record")
    child = await queue.enqueue("record", options=EnqueueOptions(after=(parent,)))
    batch_id, members = await queue.enqueue_batch(
        [EnqueueRequest("record")] * 3, callback=EnqueueRequest("record")
    )
    await queue.complete(members[0])
    jar = aiohttp.CookieJar(unsafe=True)  # the API listens on 127.0.0.1
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(f"{api.url}/ui/login") as resp:
            form = await resp.text()
        csrf = re.search(r'name="login_csrf" value="([^"]+)"', form)
        assert csrf is not None, form
        async with http.post(
            f"{api.url}/ui/login",
            data={"token": token, "login_csrf": csrf.group(1), "next": "/ui/"},
        ) as resp:
            assert resp.status == 200, await resp.text()
        async with http.get(f"{api.url}/ui/jobs/{child}") as resp:
            child_page = await resp.text()
        async with http.get(f"{api.url}/ui/jobs/{parent}") as resp:
            parent_page = await resp.text()
        async with http.get(f"{api.url}/ui/jobs/{batch_id}") as resp:
            batch_page = await resp.text()
        async with http.get(f"{api.url}/ui/") as resp:
            overview = await resp.text()
    assert "Waits on (1)" in child_page and f"/ui/jobs/{parent}" in child_page
    assert "Children (1)" in parent_page and f"/ui/jobs/{child}" in parent_page
    assert 'id="batch"' in batch_page and "1 of 3" in batch_page
    assert "Waiting on parents" in overview
    assert await api.stop() == 0
