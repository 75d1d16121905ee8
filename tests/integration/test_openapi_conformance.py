"""The jobs API answers as its OpenAPI document says: for each request below, against
real Postgres, the status code is one the document lists for that operation and the
body validates against the schema it gives for that code."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator, FormatChecker

from pgfleet import EnqueueOptions, Queue
from pgfleet.service.api import ApiConfig, JobsApi


class Conformance:
    """Checks answers against the document the API itself serves."""

    def __init__(self, client: TestClient[Any, Any], doc: dict[str, Any]) -> None:
        self.client = client
        self.doc = doc
        self.checked: set[tuple[str, str, str]] = set()

    async def call(
        self, method: str, template: str, path: str | None = None, **kwargs: Any
    ) -> tuple[int, Any, dict[str, str]]:
        async with self.client.request(method, path or template, **kwargs) as resp:
            body = await resp.json()
            status, headers = resp.status, dict(resp.headers)
        operation = self.doc["paths"][template][method.lower()]
        documented = operation["responses"]
        assert str(status) in documented, (
            f"{method} {template} answered {status}, not a documented code "
            f"({', '.join(documented)}): {body}"
        )
        schema = documented[str(status)]["content"]["application/json"]["schema"]
        # Refs are "#/components/schemas/...": resolve them against the document.
        validator = Draft202012Validator(
            {**schema, "components": self.doc["components"]}, format_checker=FormatChecker()
        )
        errors = [e.message for e in validator.iter_errors(body)]
        assert not errors, f"{method} {template} -> {status}: {errors}\n{body}"
        self.checked.add((method.lower(), template, str(status)))
        return status, body, headers


@pytest.fixture
async def api(pool: asyncpg.Pool) -> AsyncIterator[Conformance]:
    jobs_api = JobsApi(Queue(pool), ApiConfig(max_batch=10))
    async with TestClient(TestServer(jobs_api.application())) as client:
        async with client.get("/openapi.json") as resp:
            assert resp.status == 200
            doc = await resp.json()
        yield Conformance(client, doc)


async def test_every_answer_matches_the_document(api: Conformance, pool: asyncpg.Pool) -> None:
    status, one, headers = await api.call(
        "POST",
        "/jobs",
        json={"name": "send_email", "payload": {"to": "ada@example.com"}},
    )
    assert status == 202
    assert headers["Location"] == f"/jobs/{one['id']}"
    status, batch, _ = await api.call(
        "POST",
        "/jobs",
        json={"jobs": [{"name": "resize", "options": {"job_key": "r:1"}}, {"name": "resize"}]},
    )
    assert (status, len(batch["jobs"])) == (202, 2)

    job_path = f"/jobs/{one['id']}"
    assert (await api.call("GET", "/jobs/{id}", job_path))[0] == 200
    assert (await api.call("GET", "/jobs", params={"status": "queued", "limit": "5"}))[0] == 200
    # Without credentials a POST must be JSON (a page of another site cannot send it).
    cancel, retry = f"{job_path}/cancel", f"{job_path}/retry"
    assert (await api.call("POST", "/jobs/{id}/cancel", cancel, json={}))[0] == 200
    assert (await api.call("POST", "/jobs/{id}/cancel", cancel, json={}))[0] == 409
    assert (await api.call("POST", "/jobs/{id}/retry", retry, json={}))[0] == 200
    assert (await api.call("POST", "/jobs/{id}/retry", retry))[0] == 415
    assert (await api.call("POST", "/jobs/{id}/retry", retry, json={}))[0] == 409
    assert (await api.call("POST", "/jobs/{id}/retry", retry, json={"a": 1}))[0] == 422

    # A failed job carries its error; a keyed job in a named queue its key and queue.
    queue = Queue(pool)
    keyed = await queue.enqueue(
        "charge", {"n": 1}, options=EnqueueOptions(queue_name="billing", job_key="c:1")
    )
    await queue.permanently_fail(keyed, "card declined")
    status, failed, _ = await api.call("GET", "/jobs/{id}", f"/jobs/{keyed}")
    assert (status, failed["error"], failed["queue_name"]) == (200, "card declined", "billing")

    # Workflows: a batch with its callback, its progress, a job's relatives.
    status, accepted, headers = await api.call(
        "POST",
        "/batches",
        json={
            "jobs": [{"name": "resize"}, {"name": "resize", "options": {"after": [0]}}],
            "callback": {"name": "report", "payload": {"to": "ops"}},
        },
    )
    assert (status, [j["status"] for j in accepted["jobs"]]) == (202, ["queued", "waiting"])
    batch_path = headers["Location"]
    assert (await api.call("GET", "/batches/{id}", batch_path))[0] == 200
    member = accepted["jobs"][1]["id"]
    status, relatives, _ = await api.call(
        "GET", "/jobs/{id}/dependencies", f"/jobs/{member}/dependencies"
    )
    assert (status, len(relatives["parents"]), len(relatives["children"])) == (200, 1, 1)
    assert (await api.call("POST", "/batches", json={"jobs": [{"name": "x"}]}))[0] == 422
    assert (await api.call("GET", "/batches/{id}", f"/batches/{uuid.uuid4()}"))[0] == 404

    for unknown in (str(uuid.uuid4()), "not-a-uuid"):
        for method, template, suffix in (
            ("GET", "/jobs/{id}", ""),
            ("GET", "/jobs/{id}/dependencies", "/dependencies"),
            ("POST", "/jobs/{id}/cancel", "/cancel"),
            ("POST", "/jobs/{id}/retry", "/retry"),
        ):
            path = f"/jobs/{unknown}{suffix}"
            body: dict[str, Any] | None = {} if method == "POST" else None
            assert (await api.call(method, template, path, json=body))[0] == 404

    assert (await api.call("POST", "/jobs", data=b"{", headers=_JSON))[0] == 400
    assert (await api.call("POST", "/jobs", data=b"{}", headers={"Content-Type": "text/plain"}))[
        0
    ] == 415
    assert (await api.call("POST", "/jobs", json={"name": "x", "colour": 1}))[0] == 422
    assert (await api.call("POST", "/jobs", json={"name": "bad name"}))[0] == 422
    assert (await api.call("POST", "/jobs", json={"jobs": [{"name": "x"}] * 11}))[0] == 413
    assert (await api.call("GET", "/jobs", params={"limit": "0"}))[0] == 422
    # Flow control: limits and pauses.
    limits_path = "/limits/charge"
    put = {"concurrency": 2, "rate": 10, "per": 1.5, "per_key": True}
    assert (await api.call("PUT", "/limits/{name}", limits_path, json=put))[0] == 200
    assert (await api.call("PUT", "/limits/{name}", limits_path, json={"rate": 0}))[0] == 422
    assert (await api.call("PUT", "/limits/{name}", "/limits/bad%20name", json=put))[0] == 422
    assert (await api.call("PUT", "/limits/{name}", limits_path, data=b"{"))[0] in (400, 415)
    assert (await api.call("POST", "/pause", json={"name": "charge"}))[0] == 200
    assert (await api.call("POST", "/pause", json={"queue_name": "billing"}))[0] == 200
    assert (await api.call("POST", "/pause", json={}))[0] == 422
    assert (await api.call("GET", "/limits"))[0] == 200
    assert (await api.call("POST", "/resume", json={"name": "charge"}))[0] == 200
    assert (await api.call("POST", "/resume", json={"queue_name": "billing"}))[0] == 200
    assert (await api.call("DELETE", "/limits/{name}", limits_path))[0] == 200
    assert (await api.call("DELETE", "/limits/{name}", "/limits/bad%20name"))[0] == 422
    assert (await api.call("GET", "/healthz"))[0] == 200
    assert (await api.call("GET", "/readyz"))[0] == 200
    assert (await api.call("GET", "/openapi.json"))[0] == 200

    operations = {(m, t) for m, t, _ in api.checked}
    documented = {(m, p) for p, item in api.doc["paths"].items() for m in item}
    assert operations == documented, "every documented operation was exercised"


async def test_refusals_when_the_schema_is_missing_match_the_document(
    api: Conformance, pool: asyncpg.Pool
) -> None:
    await pool.execute("DROP SCHEMA pgfleet CASCADE")
    status, body, headers = await api.call("POST", "/jobs", json={"name": "x"})
    assert status == 503
    assert "pgfleet migrate" in body["error"]
    assert "Retry-After" not in headers
    assert (await api.call("GET", "/readyz"))[0] == 503


_JSON = {"Content-Type": "application/json"}
