"""Job control through ``pgfleet api`` and ``pgfleet worker`` processes: cancelling a
running job over HTTP, and results through the long poll."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.acceptance.api_support import Fleet, call, until


@pytest.fixture
async def fleet(database: str, tmp_path: Any) -> AsyncIterator[Fleet]:
    f = Fleet(database, tmp_path)
    try:
        yield f
    finally:
        await f.stop_all()
        for proc in f.processes:  # shown by pytest when the test failed
            print(f"----- {proc.name} (pid {proc.pid}) -----\n{proc.output()}")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def enqueue(http: aiohttp.ClientSession, url: str, name: str, payload: Any) -> str:
    reply = await call(http, "POST", f"{url}/jobs", json={"name": name, "payload": payload})
    assert reply.status == 202, reply.body
    job_id: str = reply.body["id"]
    return job_id


async def record(http: aiohttp.ClientSession, url: str, job_id: str, wait: float = 0) -> Any:
    query = f"?wait={wait:g}" if wait else ""
    reply = await call(http, "GET", f"{url}/jobs/{job_id}{query}")
    assert reply.status == 200, reply.body
    return reply.body


async def cancel_running_over_http(fleet: Fleet, http: aiohttp.ClientSession, *flags: str) -> None:
    api = await fleet.api()
    fleet.worker("--concurrency", "1", *flags)
    job_id = await enqueue(http, api.url, "long", {"s": 600})

    async def running() -> bool:
        return bool((await record(http, api.url, job_id))["status"] == "running")

    await until(running, "the long job to run")
    asked = time.monotonic()
    reply = await call(http, "POST", f"{api.url}/jobs/{job_id}/cancel", json={})
    assert reply.status == 200 and reply.body["status"] == "running", reply.body
    assert reply.body["cancel_requested_at"] and reply.body["cancelled_by"] == "api:anonymous"
    done = await record(http, api.url, job_id, wait=30)
    print(f"cancelled {time.monotonic() - asked:.3f}s after the request ({' '.join(flags)})")
    assert done["status"] == "cancelled" and done["cancelled_by"] == "api:anonymous"
    assert done["attempt"] == 1 and "errors" not in done
    # Its one slot takes new work.
    after = await record(http, api.url, await enqueue(http, api.url, "echo", 1), wait=30)
    assert after["status"] == "succeeded" and after["result"] == 1


async def test_a_running_job_cancelled_over_http_ends_cancelled_and_frees_its_slot(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    await cancel_running_over_http(fleet, http)


async def test_with_notifications_off_the_heartbeat_brings_the_cancel(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    await cancel_running_over_http(fleet, http, "--no-listen", "--heartbeat-interval", "0.5")


async def test_the_long_poll_returns_the_result_and_the_error_history(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    api = await fleet.api()
    fleet.worker("--backoff-base", "0.01", "--backoff-cap", "0.01")
    echo = await enqueue(http, api.url, "echo", {"rows": [1, 2, 3]})
    flaky = await enqueue(http, api.url, "flaky", {"failures": 2})
    done = await record(http, api.url, echo, wait=30)
    assert done["status"] == "succeeded" and done["result"] == {"rows": [1, 2, 3]}
    retried = await record(http, api.url, flaky, wait=30)
    assert retried["status"] == "succeeded" and retried["attempt"] == 3
    assert [e["attempt"] for e in retried["errors"]] == [1, 2]
    assert retried["errors"][0]["error"] == "RuntimeError: transient failure on attempt 1"
    bad = await call(http, "GET", f"{api.url}/jobs/{echo}?wait=61")
    assert bad.status == 422 and "wait" in str(bad.body)


async def test_the_api_counts_its_long_polls_in_the_waiters_gauge(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    api = await fleet.api(metrics=True)
    # Nobody serves these: the long polls wait until the worker below starts.
    ids = [await enqueue(http, api.url, "echo", n) for n in range(3)]
    polls = [asyncio.ensure_future(record(http, api.url, i, wait=30)) for i in ids]

    async def waiters() -> float:
        async with http.get(f"{api.metrics_url}/metrics") as resp:
            text = await resp.text()
        (value,) = re.findall(r"^pgfleet_job_waiters (\S+)$", text, re.M)
        return float(value)

    async def three() -> bool:
        return await waiters() == 3

    await until(three, "three long polls counted")
    fleet.worker()
    done = await asyncio.gather(*polls)
    assert [d["result"] for d in done] == [0, 1, 2]

    async def none() -> bool:
        return await waiters() == 0

    await until(none, "the gauge back at 0")
