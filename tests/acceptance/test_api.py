"""``pgfleet api`` as a real process over real HTTP and real Postgres: 202 + Location
after commit, status records, backlog refusals, bad input, auth, metrics and shutdown."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from pgfleet import EnqueueOptions, Queue
from tests.acceptance.api_support import (
    APP,
    Fleet,
    Reply,
    call,
    jobs_table,
    until,
)
from tests.apps.runtime_app import ensure_schema
from tests.procs import free_port

RESCUE_FLAGS = ("--heartbeat-interval", "0.5", "--dead-worker-timeout", "2")


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


async def post_job(http: aiohttp.ClientSession, url: str, body: Any, **kw: Any) -> Reply:
    return await call(http, "POST", f"{url}/jobs", json=body, **kw)


async def status_of(http: aiohttp.ClientSession, url: str, job_id: str) -> dict[str, Any]:
    reply = await call(http, "GET", f"{url}/jobs/{job_id}")
    assert reply.status == 200, reply.body
    body: dict[str, Any] = reply.body
    return body


async def wait_for_status(
    http: aiohttp.ClientSession, url: str, job_id: str, status: str
) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        record = await status_of(http, url, job_id)
        assert record["status"] in ("queued", "running", status), record
        return record if record["status"] == status else None

    return await until(reached, f"job {job_id} to be {status}")


class TableGate:
    """Holds an EXCLUSIVE lock on public.executions, where every runtime_app
    handler records its start: a job claimed meanwhile stays running, blocked in
    its handler, until the gate opens."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.tx = conn.transaction()

    @classmethod
    async def close(cls, database: str, pool: asyncpg.Pool) -> TableGate:
        await ensure_schema(pool)
        gate = cls(await asyncpg.connect(database))
        await gate.tx.start()
        await gate.conn.execute("LOCK TABLE public.executions IN EXCLUSIVE MODE")
        return gate

    async def open(self) -> None:
        if not self.conn.is_closed():
            await self.tx.rollback()
            await self.conn.close()


# ------------------------------------------------ accepted means committed: 202, Location


async def test_accepted_job_answers_202_location_and_a_queued_record(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()

    reply = await post_job(http, api.url, {"name": "record", "payload": {"to": "a@b.c"}})

    assert reply.status == 202
    job_id = reply.body["id"]
    assert reply.body == {"id": job_id, "status": "queued"}
    assert reply.headers["Location"] == f"/jobs/{job_id}"
    # The answer came after the commit: the row is there for anyone to see.
    row = await pool.fetchrow(
        "SELECT name, status::text AS status, payload FROM pgfleet.jobs WHERE id = $1",
        uuid.UUID(job_id),
    )
    assert row is not None
    assert (row["name"], row["status"], row["payload"]) == ("record", "queued", '{"to": "a@b.c"}')
    record = await call(http, "GET", api.url + reply.headers["Location"])
    assert record.status == 200
    assert record.body["id"] == job_id
    assert record.body["status"] == "queued"
    assert "payload" not in record.body
    assert await api.stop() == 0


async def test_status_moves_from_queued_through_running_to_succeeded(
    fleet: Fleet, http: aiohttp.ClientSession, database: str, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    gate = await TableGate.close(database, pool)
    try:
        job_id = (await post_job(http, api.url, {"name": "record"})).body["id"]
        queued = await status_of(http, api.url, job_id)
        assert queued["status"] == "queued"
        assert queued["attempt"] == 0
        assert "started_at" not in queued

        worker = fleet.worker()
        running = await wait_for_status(http, api.url, job_id, "running")
        assert running["attempt"] == 1
        assert running["started_at"]
        assert uuid.UUID(running["worker_id"])
        assert "finished_at" not in running
    finally:
        await gate.open()

    done = await wait_for_status(http, api.url, job_id, "succeeded")
    assert done["attempt"] == 1
    assert done["finished_at"] >= done["started_at"] >= done["created_at"]
    assert "error" not in done
    assert "worker_id" not in done
    assert all(not isinstance(v, dict | list) for v in done.values()), "the record is flat"
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0
    assert await api.stop() == 0


async def test_backlog_over_its_cap_gets_503_with_retry_after_and_nothing_is_written(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(
        "--backlog-cap", "3", "--backlog-cap-per-name", "2", "--retry-after", "7",
        "--backlog-horizon", "600",
    )  # fmt: skip
    # A job due past the horizon is not backlog yet: the three after it still fit.
    later = {"name": "a", "options": {"delay": 3600}}
    assert (await post_job(http, api.url, later)).status == 202
    for name in ("a", "a", "b"):
        assert (await post_job(http, api.url, {"name": name})).status == 202
    before = await jobs_table(pool)

    refusals = {
        "per name": {"name": "a"},
        "total": {"name": "c"},
        "total, as a batch": {"jobs": [{"name": "c"}]},
    }
    for case, body in refusals.items():
        reply = await post_job(http, api.url, body)
        assert reply.status == 503, (case, reply.body)
        assert reply.headers.get("Retry-After") == "7", case
        assert "backlog" in reply.body["error"], case
    too_big = await post_job(http, api.url, {"jobs": [{"name": "x"}] * 4})
    assert too_big.status == 413, "a batch larger than the cap could never be admitted"
    assert "Retry-After" not in too_big.headers
    assert await jobs_table(pool) == before

    # Jobs in the request count whenever they are due, so a scheduled one is refused too.
    assert (await post_job(http, api.url, {"name": "c", "options": {"delay": 60}})).status == 503
    assert await jobs_table(pool) == before

    # A cancelled job frees its place.
    a_job = await pool.fetchval(
        "SELECT id FROM pgfleet.jobs WHERE name = 'a' AND run_at <= now() LIMIT 1"
    )
    assert (await call(http, "POST", f"{api.url}/jobs/{a_job}/cancel", json={})).status == 200
    assert (await post_job(http, api.url, {"name": "c"})).status == 202
    assert await api.stop() == 0


async def test_jobs_scheduled_within_the_horizon_count_against_the_cap(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api("--backlog-cap", "2", "--backlog-horizon", "600")
    soon = {"name": "a", "options": {"delay": 60}}
    # One request at a time: two jobs due in a minute fill the cap, as if due now.
    assert (await post_job(http, api.url, soon)).status == 202
    assert (await post_job(http, api.url, soon)).status == 202
    before = await jobs_table(pool)
    refused = await post_job(http, api.url, soon)
    assert refused.status == 503, refused.body
    assert refused.body["detail"] == {"backlog": 2, "cap": 2}
    assert await jobs_table(pool) == before
    assert await api.stop() == 0


async def test_per_name_cap_names_the_job_and_takes_the_old_flag(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api("--backlog-cap-per-kind", "1")  # the deprecated spelling
    assert (await post_job(http, api.url, {"name": "a"})).status == 202
    assert (await post_job(http, api.url, {"name": "b"})).status == 202
    reply = await post_job(http, api.url, {"name": "a"})
    assert reply.status == 503, reply.body
    # "kind" is the detail's old key for the same name, kept for existing clients.
    assert reply.body["detail"] == {"name": "a", "kind": "a", "backlog": 1, "cap": 1}
    assert await api.stop() == 0


async def test_unknown_or_malformed_ids_are_404(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    for job_id in (str(uuid.uuid4()), "not-a-uuid", "42"):
        for method, path in (
            ("GET", f"/jobs/{job_id}"),
            ("POST", f"/jobs/{job_id}/cancel"),
            ("POST", f"/jobs/{job_id}/retry"),
        ):
            empty: dict[str, Any] | None = {} if method == "POST" else None
            reply = await call(http, method, api.url + path, json=empty)
            assert reply.status == 404, (method, path, reply.body)
            assert job_id in reply.body["error"]
    assert await jobs_table(pool) == []
    assert await api.stop() == 0


async def test_a_failing_job_retries_and_ends_failed_with_its_attempts(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    fleet.worker("--backoff-base", "0.05", "--backoff-cap", "0.5")
    flaky_forever = await post_job(
        http,
        api.url,
        {"name": "flaky", "payload": {"failures": 99}, "options": {"max_attempts": 3}},
    )
    permanent = await post_job(http, api.url, {"name": "fail"})
    recovers = await post_job(
        http, api.url, {"name": "flaky", "payload": {"failures": 1}, "options": {"max_attempts": 3}}
    )

    failed = await wait_for_status(http, api.url, flaky_forever.body["id"], "failed")
    assert (failed["attempt"], failed["max_attempts"]) == (3, 3)
    assert failed["error"] == "RuntimeError: transient failure on attempt 3"
    assert failed["finished_at"]
    attempts = await pool.fetch(
        "SELECT attempt FROM public.executions WHERE job_id = $1 ORDER BY attempt",
        uuid.UUID(failed["id"]),
    )
    assert [r["attempt"] for r in attempts] == [1, 2, 3]

    dead = await wait_for_status(http, api.url, permanent.body["id"], "failed")
    assert dead["attempt"] == 1, "a permanent error is not retried"
    assert dead["error"] == "PermanentError: this job always fails"

    ok = await wait_for_status(http, api.url, recovers.body["id"], "succeeded")
    assert ok["attempt"] == 2
    assert "error" not in ok

    # Operators: a finished job cannot be cancelled; a succeeded one is not retried.
    refused = await call(http, "POST", f"{api.url}/jobs/{dead['id']}/cancel", json={})
    assert refused.status == 409
    assert refused.body["detail"] == {
        "id": dead["id"],
        "status": "failed",
        "allowed": ["queued", "waiting", "running"],
    }
    refused = await call(http, "POST", f"{api.url}/jobs/{ok['id']}/retry", json={})
    assert refused.status == 409
    assert "succeeded" in refused.body["error"]
    again = await call(http, "POST", f"{api.url}/jobs/{dead['id']}/retry", json={})
    assert again.status == 200
    assert (again.body["status"], again.body["attempt"]) == ("queued", 0)
    assert "error" not in again.body
    assert await api.stop() == 0


async def test_shutdown_finishes_requests_in_flight_and_refuses_new_ones(
    fleet: Fleet, http: aiohttp.ClientSession, database: str, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    # An uncommitted job holding job_key "gate": the API's insert of the same key
    # must wait for this transaction, so its request stays in flight until we decide.
    holder = await asyncpg.connect(database)
    tx = holder.transaction()
    await tx.start()
    await Queue(pool).enqueue("record", options=EnqueueOptions(job_key="gate"), connection=holder)
    in_flight = asyncio.create_task(
        post_job(http, api.url, {"name": "record", "options": {"job_key": "gate"}})
    )
    try:

        async def api_waits_on_the_key() -> bool:
            waiting = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            return bool(waiting)

        await until(api_waits_on_the_key, "the in-flight enqueue to wait on the job key")
        api.proc.signal(signal.SIGTERM)

        async def draining() -> bool:
            reply = await call(http, "GET", f"{api.url}/readyz")
            return reply.status == 503 and reply.body == {"status": "shutting down"}

        await until(draining, "the API to start draining")
        refused = await post_job(http, api.url, {"name": "record"})
        assert refused.status == 503
        assert refused.body == {"error": "shutting down"}
        assert "Retry-After" not in refused.headers
        assert not in_flight.done()
        assert api.proc.alive
    finally:
        await tx.rollback()
        await holder.close()

    accepted = await in_flight
    assert accepted.status == 202
    assert accepted.body["status"] == "queued"
    assert await api.proc.wait() == 0
    rows = await pool.fetch("SELECT id::text, job_key FROM pgfleet.jobs")
    assert [(r["id"], r["job_key"]) for r in rows] == [(accepted.body["id"], "gate")]


async def test_two_workers_run_jobs_in_parallel(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    # Each job runs until its worker is asked to stop; each worker runs one job at
    # a time. Two jobs running at once can only be on two workers.
    body = {"jobs": [{"name": "long", "payload": {"s": 600, "polite": True}}] * 2}
    ids = [job["id"] for job in (await post_job(http, api.url, body)).body["jobs"]]
    workers = [fleet.worker("--concurrency", "1"), fleet.worker("--concurrency", "1")]

    async def both_running() -> bool:
        records = [await status_of(http, api.url, i) for i in ids]
        return all(r["status"] == "running" for r in records)

    await until(both_running, "both jobs to be running")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    assert [await w.wait() for w in workers] == [0, 0]
    for job_id in ids:
        assert (await status_of(http, api.url, job_id))["status"] == "succeeded"
    runs = await pool.fetch(
        "SELECT pid, started_at, finished_at FROM public.executions ORDER BY seq"
    )
    assert len(runs) == 2
    first, second = runs
    assert {first["pid"], second["pid"]} == {w.pid for w in workers}
    assert first["started_at"] < second["finished_at"]
    assert second["started_at"] < first["finished_at"], "the two runs overlap in time"
    assert await api.stop() == 0


async def test_accepted_jobs_survive_the_api_and_workers_being_killed(
    fleet: Fleet, http: aiohttp.ClientSession, database: str, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    worker = fleet.worker(*RESCUE_FLAGS)
    gate = await TableGate.close(database, pool)
    try:
        claimed = (await post_job(http, api.url, {"name": "record"})).body["id"]
        await wait_for_status(http, api.url, claimed, "running")
        await worker.kill()
        waiting = (await post_job(http, api.url, {"name": "record"})).body["id"]
        await api.proc.kill()
    finally:
        await gate.open()

    api = await fleet.api()
    worker = fleet.worker(*RESCUE_FLAGS)
    rescued = await wait_for_status(http, api.url, claimed, "succeeded")
    assert rescued["attempt"] == 2, "the killed worker's attempt counts; the rescue runs it again"
    assert (await wait_for_status(http, api.url, waiting, "succeeded"))["attempt"] == 1
    by_new_worker = await pool.fetchval(
        "SELECT count(*) FROM public.executions WHERE pid = $1 AND finished_at IS NOT NULL",
        worker.pid,
    )
    assert by_new_worker == 2
    worker.signal(signal.SIGTERM)
    assert await worker.wait() == 0
    assert await api.stop() == 0


# ---------------------------------------------------------------- bad input

LONG_NAME = "x" * 129

BAD_REQUESTS: list[tuple[str, dict[str, Any], int, str]] = [
    ("malformed JSON", {"data": '{"name": "a",'}, 400, "malformed JSON"),
    ("NaN", {"data": '{"name": "a", "payload": NaN}'}, 400, "NaN"),
    ("not UTF-8", {"data": b'{"name": "\xff"}'}, 400, "not UTF-8"),
    ("empty body", {"data": b""}, 400, "empty"),
    ("form content type", {"form": "name=a"}, 415, "content type"),
    ("text content type", {"text": '{"name": "a"}'}, 415, "content type"),
    ("latin-1 charset", {"charset": "latin-1"}, 415, "charset"),
    ("array body", {"json": [{"name": "a"}]}, 422, "JSON object"),
    ("unknown top-level field", {"json": {"name": "a", "colour": 1}}, 422, "colour"),
    ("unknown option", {"json": {"name": "a", "options": {"retries": 3}}}, 422, "retries"),
    ("missing name", {"json": {"payload": {}}}, 422, "name: is required"),
    ("invalid name", {"json": {"name": "send email!"}}, 422, "invalid job name"),
    ("name too long", {"json": {"name": LONG_NAME}}, 422, "invalid job name"),
    ("name not a string", {"json": {"name": ["a"]}}, 422, "must be a string"),
    ("options not an object", {"json": {"name": "a", "options": 5}}, 422, "options:"),
    ("negative delay", {"json": {"name": "a", "options": {"delay": -1}}}, 422, "options.delay"),
    ("absurd delay", {"json": {"name": "a", "options": {"delay": 1e12}}}, 422, "options.delay"),
    (
        "naive run_at",
        {"json": {"name": "a", "options": {"run_at": "2030-01-01T00:00:00"}}},
        422,
        "options.run_at",
    ),
    (
        "run_at and delay",
        {"json": {"name": "a", "options": {"run_at": "2030-01-01T00:00:00Z", "delay": 5}}},
        422,
        "not both",
    ),
    ("float priority", {"json": {"name": "a", "options": {"priority": 0.5}}}, 422, "priority"),
    ("zero attempts", {"json": {"name": "a", "options": {"max_attempts": 0}}}, 422, "max_attempts"),
    (
        "bad job_key_mode",
        {"json": {"name": "a", "options": {"job_key": "k", "job_key_mode": "x"}}},
        422,
        "job_key_mode",
    ),
    ("bad queue name", {"json": {"name": "a", "options": {"queue_name": "a b"}}}, 422, "queue"),
    ("NUL in payload", {"json": {"name": "a", "payload": "a\x00b"}}, 422, "NUL"),
    ("payload too large", {"json": {"name": "a", "payload": "x" * 1200}}, 413, "payload"),
    ("body too large", {"json": {"name": "a", "payload": ["x" * 1000] * 5}}, 413, "request body"),
    ("empty batch", {"json": {"jobs": []}}, 422, "must not be empty"),
    ("batch not a list", {"json": {"jobs": {"name": "a"}}}, 422, "array"),
    ("batch too large", {"json": {"jobs": [{"name": "a"}] * 4}}, 413, "limit of 3"),
    (
        "one bad job in a batch",
        {"json": {"jobs": [{"name": "a"}, {"name": "b", "options": {"delay": -5}}]}},
        422,
        "jobs[1].options.delay",
    ),
    (
        "job_key twice in a batch",
        {"json": {"jobs": [{"name": "a", "options": {"job_key": "k"}}] * 2}},
        422,
        "jobs[1].options.job_key",
    ),
    ("batch with a name", {"json": {"jobs": [{"name": "a"}], "name": "a"}}, 422, "name"),
]


async def send_bad(http: aiohttp.ClientSession, url: str, how: dict[str, Any]) -> Reply:
    if "json" in how:
        return await call(http, "POST", f"{url}/jobs", json=how["json"])
    if "form" in how:
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        return await call(http, "POST", f"{url}/jobs", data=how["form"], headers=headers)
    if "text" in how:
        headers = {"Content-Type": "text/plain"}
        return await call(http, "POST", f"{url}/jobs", data=how["text"], headers=headers)
    if "charset" in how:
        headers = {"Content-Type": f"application/json; charset={how['charset']}"}
        return await call(http, "POST", f"{url}/jobs", data=b'{"name": "a"}', headers=headers)
    headers = {"Content-Type": "application/json"}
    return await call(http, "POST", f"{url}/jobs", data=how["data"], headers=headers)


async def test_bad_requests_get_a_json_error_naming_the_problem_and_write_nothing(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api(
        "--max-body-bytes", "4096", "--max-payload-bytes", "1000", "--max-batch", "3"
    )
    wrong = []
    for case, how, status, names in BAD_REQUESTS:
        reply = await send_bad(http, api.url, how)
        error = reply.body.get("error", "") if isinstance(reply.body, dict) else ""
        if reply.status != status or names not in error:
            wrong.append(
                f"{case}: expected {status} naming {names!r}, got {reply.status} {error!r}"
            )
    assert wrong == []
    assert await jobs_table(pool) == []

    for method, path, status in (
        ("GET", "/jobs?limit=0", 422),
        ("GET", "/jobs?status=dead", 422),
        ("GET", "/jobs?sort=id", 422),
        ("GET", "/nowhere", 404),
        ("DELETE", "/jobs", 405),
        ("PUT", f"/jobs/{uuid.uuid4()}", 405),
        ("GET", "/metrics", 404),  # metrics never on the public port
    ):
        reply = await call(http, method, api.url + path)
        assert reply.status == status, (method, path, reply.body)
        assert reply.body["error"]
    assert await api.stop() == 0


async def test_bearer_token_guards_every_jobs_endpoint(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    token = "s3cret-" + uuid.uuid4().hex
    # Fifteen failures in a row from one client: past the default five, it would be paused.
    api = await fleet.api("--auth-free-failures", "20", env={"PGFLEET_API_TOKEN": token})
    some_id = str(uuid.uuid4())
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {token}"}):
        for method, path in (
            ("POST", "/jobs"),
            ("GET", "/jobs"),
            ("GET", f"/jobs/{some_id}"),
            ("POST", f"/jobs/{some_id}/cancel"),
            ("POST", f"/jobs/{some_id}/retry"),
        ):
            body = {"name": "record"} if method == "POST" else None
            reply = await call(http, method, api.url + path, json=body, headers=headers)
            assert reply.status == 401, (headers, method, path)
            assert reply.headers["WWW-Authenticate"].startswith("Bearer")
            assert "bearer token" in reply.body["error"]
    assert await jobs_table(pool) == []
    assert (await call(http, "GET", f"{api.url}/healthz")).status == 200

    auth = {"Authorization": f"Bearer {token}"}
    accepted = await post_job(http, api.url, {"name": "record"}, headers=auth)
    assert accepted.status == 202
    got = await call(http, "GET", f"{api.url}/jobs/{accepted.body['id']}", headers=auth)
    assert got.status == 200
    assert await api.stop() == 0


async def test_without_a_token_the_api_is_open(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    api = await fleet.api()
    reply = await post_job(http, api.url, {"name": "record"}, headers={"Authorization": "x"})
    assert reply.status == 202
    assert await api.stop() == 0


async def test_strict_mode_refuses_names_without_a_handler(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api("--strict", "--app", APP)
    refused = await post_job(http, api.url, {"jobs": [{"name": "record"}, {"name": "recrod"}]})
    assert refused.status == 422
    assert "jobs[1].name: unknown job name 'recrod'" in refused.body["error"]
    assert await jobs_table(pool) == []
    assert (await post_job(http, api.url, {"name": "record"})).status == 202
    assert await api.stop() == 0


async def test_payloads_that_cannot_decode_are_refused_at_the_door(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api("--app", APP)
    bad = {"jobs": [{"name": "serial", "payload": {"n": 1}}, {"name": "serial", "payload": []}]}
    refused = await post_job(http, api.url, bad)
    assert refused.status == 422
    assert refused.body["error"].startswith(
        "jobs[1].payload: does not decode for the handler of 'serial'"
    )
    assert refused.body["detail"] == {"field": "jobs[1].payload"}
    assert await jobs_table(pool) == []
    assert (await post_job(http, api.url, {"name": "serial", "payload": {"n": 1}})).status == 202
    assert await api.stop() == 0
    unchecked = await fleet.api("--app", APP, "--no-payload-check")
    assert (await post_job(http, unchecked.url, {"name": "serial", "payload": []})).status == 202
    assert await unchecked.stop() == 0


# ---------------------------------------------------------------- batches, keys, listing


async def test_batch_is_one_transaction_answered_with_every_id(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    existing = await post_job(http, api.url, {"name": "record", "options": {"job_key": "k"}})
    await pool.execute(
        "UPDATE pgfleet.jobs SET status = 'running', attempt = 1, started_at = now(), "
        "lock_token = gen_random_uuid() WHERE id = $1",
        uuid.UUID(existing.body["id"]),
    )
    reply = await post_job(
        http,
        api.url,
        {
            "jobs": [
                {"name": "record", "payload": {"n": 1}},
                {"name": "record", "options": {"job_key": "k"}},
                {"name": "other", "options": {"delay": 3600, "priority": 5}},
            ]
        },
    )
    assert reply.status == 202
    assert "Location" not in reply.headers, "a batch names every job in its body instead"
    jobs = reply.body["jobs"]
    assert [j["status"] for j in jobs] == ["queued", "running", "queued"]
    assert jobs[1]["id"] == existing.body["id"], "the job_key deduplicated to the running job"
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.jobs") == 3

    listed = await call(http, "GET", f"{api.url}/jobs?name=record&limit=10")
    assert listed.status == 200
    assert {j["id"] for j in listed.body["jobs"]} == {jobs[0]["id"], jobs[1]["id"]}
    only_running = await call(http, "GET", f"{api.url}/jobs?status=running")
    assert [j["id"] for j in only_running.body["jobs"]] == [existing.body["id"]]
    assert await api.stop() == 0


async def test_metrics_live_on_their_own_port_with_route_templates(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    api = await fleet.api(metrics=True)
    one = await post_job(http, api.url, {"name": "record"})
    await post_job(http, api.url, {"jobs": [{"name": "record"}, {"name": "record"}, {"name": "x"}]})
    await call(http, "GET", f"{api.url}/jobs/{one.body['id']}")
    await post_job(http, api.url, {"name": "bad name"})

    async with http.get(f"{api.metrics_url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert 'pgfleet_jobs_enqueued_total{kind="record"} 3.0' in text
    assert 'pgfleet_jobs_enqueued_total{kind="x"} 1.0' in text
    assert 'pgfleet_api_requests_total{code="202",route="/jobs"} 2.0' in text
    assert 'pgfleet_api_requests_total{code="422",route="/jobs"} 1.0' in text
    assert 'pgfleet_api_requests_total{code="200",route="/jobs/{id}"} 1.0' in text
    assert 'pgfleet_api_request_duration_seconds_count{route="/jobs"} 3.0' in text
    assert one.body["id"] not in text, "job ids never become labels"
    for path in ("/healthz", "/readyz"):
        async with http.get(api.metrics_url + path) as resp:
            assert resp.status == 200
    assert (await call(http, "GET", f"{api.url}/metrics")).status == 404
    assert await api.stop() == 0


# ---------------------------------------------------------------- the database and the process


async def test_database_down_gives_503_and_the_api_keeps_running(
    fleet: Fleet, http: aiohttp.ClientSession
) -> None:
    nowhere = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    api = await fleet.api(dsn=nowhere)
    reply = await post_job(http, api.url, {"name": "record"})
    assert reply.status == 503
    assert reply.body["error"] == "database unavailable"
    assert reply.headers["Retry-After"] == "1"
    assert (await call(http, "GET", f"{api.url}/jobs/{uuid.uuid4()}")).status == 503
    ready = await call(http, "GET", f"{api.url}/readyz")
    assert (ready.status, ready.body["status"]) == (503, "not ready")
    assert (await call(http, "GET", f"{api.url}/healthz")).status == 200
    assert await api.stop() == 0


@pytest.mark.parametrize(
    "target",
    [
        "postgres@127.0.0.1:5432/pgfleet_no_such_database",
        "pgfleet_no_such_role@127.0.0.1:5432/postgres",
    ],
)
async def test_a_missing_database_or_role_gives_503_with_retry_after_not_500(
    fleet: Fleet, http: aiohttp.ClientSession, target: str
) -> None:
    api = await fleet.api(dsn=f"postgresql://{target}", metrics=True)
    reply = await post_job(http, api.url, {"name": "record"})
    assert (reply.status, reply.body["error"]) == (503, "database unavailable")
    assert reply.headers["Retry-After"] == "1", "it may be created any moment: worth retrying"
    assert (await call(http, "GET", f"{api.url}/jobs/{uuid.uuid4()}")).status == 503
    # The public port says not ready; why, only the private metrics port (and the log).
    ready = await call(http, "GET", f"{api.url}/readyz")
    assert ready.status == 503 and ready.body == {"status": "not ready"}
    private = await call(http, "GET", f"{api.metrics_url}/readyz")
    assert private.status == 503 and "does not exist" in private.body["reason"]
    assert "Traceback" not in api.proc.output()
    assert await api.stop() == 0


async def test_missing_schema_gives_503_without_retry_after(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    api = await fleet.api()
    await pool.execute("DROP SCHEMA pgfleet CASCADE")
    reply = await post_job(http, api.url, {"name": "record"})
    assert reply.status == 503
    assert "pgfleet migrate" in reply.body["error"]
    assert "Retry-After" not in reply.headers, "retrying cannot help until someone migrates"
    ready = await call(http, "GET", f"{api.url}/readyz")
    assert ready.status == 503
    assert await api.stop() == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "http"], "--port must be an integer"),
        (["--port", "70000"], "--port must be from 1 to 65535"),
        (["--backlog-cap", "-1"], "--backlog-cap must be from 0"),
        (["--shutdown-timeout", "soon"], "--shutdown-timeout must be a number"),
        (["--strict"], "--strict needs --app"),
        (["--strict", "--app", "no_such_module:registry"], "cannot import 'no_such_module'"),
        (["--auth-token", " "], "--auth-token is empty"),
        (["--notify", "sometimes"], "--notify must be one of coalesced, transaction, off"),
        (["--dsn", "mysql://localhost/db"], "must start with postgresql://"),
    ],
)
async def test_bad_configuration_exits_non_zero_with_a_clear_message(
    fleet: Fleet, flags: list[str], message: str
) -> None:
    proc = fleet.spawn("api", "api", "--dsn", fleet.database, "--metrics-port", "0", *flags)
    assert await proc.wait() != 0
    assert message in proc.output()


async def test_port_in_use_is_a_clear_error(fleet: Fleet, http: aiohttp.ClientSession) -> None:
    first = await fleet.api()
    port = first.url.rsplit(":", 1)[1]
    second = fleet.spawn("api", "api", "--dsn", fleet.database, "--port", port)
    assert await second.wait() != 0
    assert f"cannot listen on 127.0.0.1:{port} for jobs API" in second.output()
    assert await first.stop() == 0


async def test_an_operator_limits_pauses_and_resumes_through_the_api(
    fleet: Fleet, http: aiohttp.ClientSession, pool: asyncpg.Pool
) -> None:
    token = "s3cret-" + uuid.uuid4().hex
    api = await fleet.api("--auth-free-failures", "20", env={"PGFLEET_API_TOKEN": token})
    auth = {"Authorization": f"Bearer {token}"}
    for method, path in (
        ("GET", "/limits"),
        ("PUT", "/limits/charge_card"),
        ("DELETE", "/limits/charge_card"),
        ("POST", "/pause"),
        ("POST", "/resume"),
    ):
        reply = await call(http, method, api.url + path, json={"name": "x"})
        assert reply.status == 401, (method, path)
    bad = await call(
        http, "PUT", f"{api.url}/limits/charge_card", json={"concurrency": 0}, headers=auth
    )
    assert bad.status == 422 and "concurrency" in bad.body["error"]
    assert await Queue(pool).limits() == []
    stored = await call(
        http,
        "PUT",
        f"{api.url}/limits/charge_card",
        json={"concurrency": 5, "rate": 100, "per": 60},
        headers=auth,
    )
    assert stored.status == 200, stored.body
    assert (stored.body["concurrency"], stored.body["rate"], stored.body["source"]) == (
        5,
        100,
        "operator",
    )
    accepted = await post_job(
        http, api.url, {"name": "charge_card", "options": {"limit_key": "acct-1"}}, headers=auth
    )
    assert accepted.status == 202, accepted.body
    paused = await call(
        http, "POST", f"{api.url}/pause", json={"name": "charge_card"}, headers=auth
    )
    assert paused.status == 200, paused.body
    listed = await call(http, "GET", f"{api.url}/limits", headers=auth)
    (row,) = listed.body["limits"]
    assert (row["paused"], row["waiting"]) == (True, {"paused": 1})
    both = await call(
        http, "POST", f"{api.url}/resume", json={"name": "a", "queue_name": "b"}, headers=auth
    )
    assert both.status == 422
    resumed = await call(
        http, "POST", f"{api.url}/resume", json={"name": "charge_card"}, headers=auth
    )
    assert resumed.body["resumed"] is True
    cleared = await call(http, "DELETE", f"{api.url}/limits/charge_card", headers=auth)
    assert cleared.body == {"name": "charge_card", "cleared": True}
    assert await Queue(pool).limits() == []
    assert await pool.fetchval("SELECT limit_key FROM pgfleet.jobs") == "acct-1"
    assert await api.stop() == 0
