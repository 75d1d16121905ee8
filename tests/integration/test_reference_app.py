"""The reference fleet application (worker/app.py) used by the fleet and load tests."""

from __future__ import annotations

import asyncpg

from pgfleet import EnqueueOptions, JobStatus, Queue
from pgfleet.testing import drain
from worker import app


async def test_every_kind_behaves_as_documented(pool: asyncpg.Pool) -> None:
    queue = Queue(pool, known_names=app.registry)
    ids = {
        "noop": await queue.enqueue("noop"),
        "sleep": await queue.enqueue("sleep", {"ms": 5}),
        "cpu": await queue.enqueue("cpu", {"ms": 5}),
        "fail": await queue.enqueue("fail", None, options=EnqueueOptions(max_attempts=5)),
        "flaky": await queue.enqueue("flaky", {"failures": 1}),
        "prune": await queue.enqueue("prune_sessions"),
    }
    stats = await drain(pool, app.registry, backoff_base=60, backoff_jitter=0)
    assert stats.by_name["fail"] == {"failed": 1}  # permanent: no retries
    assert stats.by_name["flaky"] == {"retried": 1}
    await pool.execute("UPDATE pgfleet.jobs SET run_at = now() WHERE id = $1", ids["flaky"])
    await drain(pool, app.registry)
    for kind, job_id in ids.items():
        job = await queue.get(job_id)
        assert job is not None
        want = JobStatus.FAILED if kind == "fail" else JobStatus.SUCCEEDED
        assert job.status is want, (kind, job.last_error)
    flaky = await queue.get(ids["flaky"])
    assert flaky is not None and flaky.attempt == 2


async def test_send_email_records_its_effect_once(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    payload = {"address": "a@example.com", "template": "welcome"}
    first = await queue.enqueue("send_email", payload)
    await drain(pool, app.registry)
    # The same email again (a retry, a duplicate request, a recovered job) ...
    again = await queue.enqueue("send_email", payload)
    stats = await drain(pool, app.registry)
    assert stats.succeeded == 1
    rows = await pool.fetch("SELECT idempotency_key, job_id FROM fleet.sent_emails")
    # ... is recorded, and therefore sent, only once.
    assert [(r["idempotency_key"], r["job_id"]) for r in rows] == [("welcome:a@example.com", first)]
    job = await queue.get(again)
    assert job is not None and job.status is JobStatus.SUCCEEDED


async def test_the_reference_crons_validate_against_the_registry(pool: asyncpg.Pool) -> None:
    from pgfleet import Worker

    worker = Worker(pool, app.registry, crons=app.crons)  # validates at construction
    assert worker.served_names == sorted(app.registry.names())
