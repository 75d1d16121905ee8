"""Enqueue: single, batched, transactional, job keys, notifications, bad input."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import math
import uuid
from typing import Any, TypedDict

import asyncpg
import msgspec
import pydantic
import pytest

from pgfleet import (
    DatabaseUnavailable,
    DuplicateJobKey,
    EnqueueOptions,
    EnqueueRequest,
    InvalidName,
    InvalidOptions,
    JobKeyMode,
    JobStatus,
    NotifyMode,
    PayloadError,
    PayloadTooLarge,
    Queue,
    UnknownJobName,
)
from tests.helpers import job_count, listening, notifications_before_marker, put_in_state

UTC = dt.UTC


@dataclasses.dataclass
class Address:
    street: str
    zip: str


@dataclasses.dataclass
class SendEmail:
    address: str
    when: dt.datetime
    to: Address


class Resize(TypedDict):
    width: int
    height: int


class Invoice(pydantic.BaseModel):
    number: int
    total: float


class Ping(msgspec.Struct):
    host: str
    count: int = 1


async def test_enqueue_stores_a_queued_job_with_defaults(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("send_email", {"address": "a@b.c"})
    assert isinstance(job_id, uuid.UUID)
    assert job_id.version == 7
    job = await queue.get(job_id)
    assert job is not None
    assert job.id == job_id
    assert job.name == "send_email"
    assert job.payload == {"address": "a@b.c"}
    assert job.status is JobStatus.QUEUED
    assert (job.attempt, job.max_attempts, job.priority) == (0, 25, 0)
    assert job.queue_name is None
    assert job.job_key is None
    assert job.worker_id is None
    assert job.started_at is None
    assert job.finished_at is None
    assert job.last_error is None
    db_now = await pool.fetchval("SELECT now()")
    assert job.run_at <= db_now
    assert job.created_at <= db_now


async def test_enqueue_options_are_stored(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    at = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    job_id = await queue.enqueue(
        "report",
        None,
        options=EnqueueOptions(run_at=at, priority=-5, max_attempts=3, queue_name="billing"),
    )
    job = await queue.get(job_id)
    assert job is not None
    assert job.run_at == at
    assert (job.priority, job.max_attempts, job.queue_name) == (-5, 3, "billing")
    assert job.payload is None


async def test_delay_is_measured_on_the_database_clock(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    before = await pool.fetchval("SELECT now()")
    job_id = await queue.enqueue("later", {}, options=EnqueueOptions(delay=dt.timedelta(hours=1)))
    after = await pool.fetchval("SELECT now()")
    job = await queue.get(job_id)
    assert job is not None
    assert before + dt.timedelta(hours=1) <= job.run_at <= after + dt.timedelta(hours=1)
    seconds_id = await queue.enqueue("later", {}, options=EnqueueOptions(delay=90))
    job2 = await queue.get(seconds_id)
    assert job2 is not None
    assert job2.run_at - job2.created_at == dt.timedelta(seconds=90)


async def test_typed_payloads_are_encoded_as_json(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    when = dt.datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    cases: list[tuple[Any, Any]] = [
        (
            SendEmail("a@b.c", when, Address("Main St", "123")),
            {
                "address": "a@b.c",
                "when": "2026-05-01T12:00:00+00:00",
                "to": {"street": "Main St", "zip": "123"},
            },
        ),
        (Resize(width=3, height=4), {"width": 3, "height": 4}),
        (Invoice(number=7, total=9.5), {"number": 7, "total": 9.5}),
        (Ping(host="h"), {"host": "h", "count": 1}),
        ([1, "two", None, True, 2.5], [1, "two", None, True, 2.5]),
        ("just a string", "just a string"),
        (42, 42),
        (
            {"id": uuid.UUID(int=1), "amount": __import__("decimal").Decimal("1.10")},
            {"id": "00000000-0000-0000-0000-000000000001", "amount": "1.10"},
        ),
        ({"unicode": "żółw 🐢"}, {"unicode": "żółw 🐢"}),
    ]
    for payload, stored in cases:
        job = await queue.get(await queue.enqueue("typed", payload))
        assert job is not None and job.payload == stored, payload


async def test_enqueue_many_returns_ids_in_request_order(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    requests = [EnqueueRequest("bulk", {"n": i}) for i in range(500)]
    ids = await queue.enqueue_many(requests)
    assert len(ids) == len(set(ids)) == 500
    rows = await pool.fetch("SELECT id, payload->>'n' AS n FROM pgfleet.jobs")
    by_id = {r["id"]: int(r["n"]) for r in rows}
    assert [by_id[i] for i in ids] == list(range(500))
    assert await queue.enqueue_many([]) == []


async def test_enqueue_many_mixes_options_and_modes(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    existing = await queue.enqueue("k", {"v": "old"}, options=EnqueueOptions(job_key="dedupe-me"))
    replaced = await queue.enqueue("k", {"v": "old"}, options=EnqueueOptions(job_key="replace-me"))
    requests = [
        EnqueueRequest("plain", {"i": 0}),
        EnqueueRequest("opts", {"i": 1}, EnqueueOptions(priority=3, max_attempts=2)),
        EnqueueRequest("k", {"v": "new"}, EnqueueOptions(job_key="dedupe-me")),
        EnqueueRequest(
            "k", {"v": "new"}, EnqueueOptions(job_key="replace-me", job_key_mode=JobKeyMode.REPLACE)
        ),
        EnqueueRequest(
            "k",
            {"v": "fresh"},
            EnqueueOptions(job_key="fresh", job_key_mode=JobKeyMode.PRESERVE_RUN_AT),
        ),
        EnqueueRequest("plain", {"i": 5}),
    ]
    ids = await queue.enqueue_many(requests)
    assert ids[2] == existing
    assert ids[3] == replaced
    jobs = [await queue.get(i) for i in ids]
    assert [j.name for j in jobs if j] == ["plain", "opts", "k", "k", "k", "plain"]
    assert jobs[1] is not None
    assert (jobs[1].priority, jobs[1].max_attempts) == (3, 2)
    assert jobs[2] is not None
    assert jobs[2].payload == {"v": "old"}
    assert jobs[3] is not None
    assert jobs[3].payload == {"v": "new"}
    assert jobs[4] is not None
    assert jobs[4].job_key == "fresh"
    assert await job_count(pool) == 6


# ------------------------------------------------------------------ job keys


async def test_dedupe_keeps_the_existing_job(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    opts = EnqueueOptions(job_key="email:42")
    first = await queue.enqueue("send_email", {"v": 1}, options=opts)
    second = await queue.enqueue("send_email", {"v": 2}, options=opts)
    assert first == second
    job = await queue.get(first)
    assert job is not None
    assert job.payload == {"v": 1}
    assert await job_count(pool) == 1


async def test_replace_overwrites_payload_and_run_at(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    first = await queue.enqueue(
        "debounce", {"v": 1}, options=EnqueueOptions(job_key="d", delay=60, priority=1)
    )
    before = await queue.get(first)
    second = await queue.enqueue(
        "debounce",
        {"v": 2},
        options=EnqueueOptions(
            job_key="d", delay=3600, priority=2, job_key_mode=JobKeyMode.REPLACE
        ),
    )
    after = await queue.get(second)
    assert first == second
    assert before is not None
    assert after is not None
    assert after.payload == {"v": 2}
    assert after.priority == 2
    assert after.run_at - before.run_at > dt.timedelta(minutes=50)


async def test_preserve_run_at_overwrites_payload_only(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    first = await queue.enqueue("p", {"v": 1}, options=EnqueueOptions(job_key="p", delay=60))
    before = await queue.get(first)
    second = await queue.enqueue(
        "p",
        {"v": 2},
        options=EnqueueOptions(job_key="p", delay=3600, job_key_mode=JobKeyMode.PRESERVE_RUN_AT),
    )
    after = await queue.get(second)
    assert first == second
    assert before is not None
    assert after is not None
    assert after.payload == {"v": 2}
    assert after.run_at == before.run_at


@pytest.mark.parametrize("mode", list(JobKeyMode))
async def test_no_mode_modifies_a_running_job(pool: asyncpg.Pool, mode: JobKeyMode) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("r", {"v": 1}, options=EnqueueOptions(job_key="running-key"))
    await put_in_state(pool, job_id, "running")
    before = await pool.fetchrow("SELECT * FROM pgfleet.jobs WHERE id = $1", job_id)
    again = await queue.enqueue(
        "r", {"v": 2}, options=EnqueueOptions(job_key="running-key", job_key_mode=mode, delay=5)
    )
    after = await pool.fetchrow("SELECT * FROM pgfleet.jobs WHERE id = $1", job_id)
    assert again == job_id
    assert after is not None and before is not None
    assert dict(after) == dict(before)  # payload, run_at, lock: all untouched
    assert await job_count(pool) == 1  # and no follow-up job was created


@pytest.mark.parametrize("finished", ["succeeded", "failed", "cancelled"])
async def test_a_finished_job_frees_its_key(pool: asyncpg.Pool, finished: str) -> None:
    queue = Queue(pool)
    opts = EnqueueOptions(job_key="reusable")
    first = await queue.enqueue("f", {}, options=opts)
    await put_in_state(pool, first, finished)
    second = await queue.enqueue("f", {}, options=opts)
    assert second != first
    assert await job_count(pool) == 2


@pytest.mark.parametrize("mode", list(JobKeyMode))
async def test_fifty_concurrent_enqueues_of_one_key_yield_one_job(
    database: str, mode: JobKeyMode
) -> None:
    pool = await asyncpg.create_pool(database, min_size=50, max_size=50)
    try:
        queue = Queue(pool)
        start = asyncio.Event()

        async def one(i: int) -> uuid.UUID:
            await start.wait()
            return await queue.enqueue(
                "contended", {"i": i}, options=EnqueueOptions(job_key="same", job_key_mode=mode)
            )

        tasks = [asyncio.create_task(one(i)) for i in range(50)]
        start.set()
        ids = await asyncio.gather(*tasks)
        assert len(set(ids)) == 1
        assert await job_count(pool) == 1
        job = await queue.get(ids[0])
        assert job is not None
        assert 0 <= job.payload["i"] < 50
    finally:
        await pool.close()


async def test_duplicate_key_in_one_batch_inserts_nothing(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    requests = [
        EnqueueRequest("a", {}),
        EnqueueRequest("b", {}, EnqueueOptions(job_key="twice")),
        EnqueueRequest("c", {}, EnqueueOptions(job_key="twice", job_key_mode=JobKeyMode.REPLACE)),
    ]
    with pytest.raises(DuplicateJobKey, match="'twice' appears more than once") as info:
        await queue.enqueue_many(requests)
    assert info.value.job_key == "twice"
    assert await job_count(pool) == 0


async def test_batch_is_atomic_when_a_later_statement_fails(pool: asyncpg.Pool) -> None:
    # A trigger makes the keyed statement fail after the plain rows were inserted.
    await pool.execute(
        """
        CREATE FUNCTION public.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.name = 'poison' THEN RAISE EXCEPTION 'refused by test'; END IF;
        RETURN NEW; END $$;
        CREATE TRIGGER refuse BEFORE INSERT ON pgfleet.jobs FOR EACH ROW EXECUTE FUNCTION public.refuse();
        """
    )
    queue = Queue(pool)
    requests = [EnqueueRequest("ok", {}) for _ in range(10)]
    requests.append(EnqueueRequest("poison", {}, EnqueueOptions(job_key="k")))
    with pytest.raises(asyncpg.RaiseError, match="refused by test"):
        await queue.enqueue_many(requests)
    assert await job_count(pool) == 0


# ------------------------------------------------------------------ transactions


async def test_enqueue_in_a_rolled_back_transaction_leaves_nothing_and_wakes_no_one(
    pool: asyncpg.Pool, database: str
) -> None:
    queue = Queue(pool)
    async with listening(database) as listener:
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await queue.enqueue("in_tx", {}, connection=conn)
            await queue.enqueue_many([EnqueueRequest("in_tx", {})], connection=conn)
            assert await conn.fetchval("SELECT count(*) FROM pgfleet.jobs") == 2
            await tx.rollback()
        assert await job_count(pool) == 0
        assert await notifications_before_marker(listener, pool) == 0


async def test_enqueue_in_a_committed_transaction_notifies_once(
    pool: asyncpg.Pool, database: str
) -> None:
    queue = Queue(pool)
    async with listening(database) as listener:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("CREATE TABLE public.orders (id int)")
            await conn.execute("INSERT INTO public.orders VALUES (1)")
            for _ in range(3):
                await queue.enqueue("send_receipt", {}, connection=conn)
            await queue.enqueue_many(
                [EnqueueRequest("send_receipt", {}) for _ in range(5)], connection=conn
            )
        assert await job_count(pool) == 8
        # At most one notification per transaction, however many jobs it carried.
        assert await notifications_before_marker(listener, pool) == 1


async def test_enqueue_many_in_a_caller_transaction_uses_a_savepoint(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    async with pool.acquire() as conn, conn.transaction():
        await queue.enqueue("kept", {}, connection=conn)
        with pytest.raises(DuplicateJobKey):
            await queue.enqueue_many(
                [
                    EnqueueRequest("x", {}, EnqueueOptions(job_key="a")),
                    EnqueueRequest("x", {}, EnqueueOptions(job_key="a")),
                ],
                connection=conn,
            )
        # The caller's transaction is still usable and its earlier work intact.
        await queue.enqueue_many(
            [EnqueueRequest("x", {}, EnqueueOptions(job_key="b")), EnqueueRequest("y", {})],
            connection=conn,
        )
    assert sorted(r["name"] for r in await pool.fetch("SELECT name FROM pgfleet.jobs")) == [
        "kept",
        "x",
        "y",
    ]


# ------------------------------------------------------------------ notifications


async def test_coalesced_mode_wakes_after_commit(pool: asyncpg.Pool, database: str) -> None:
    queue = Queue(pool)  # NotifyMode.COALESCED
    async with listening(database) as listener:
        await asyncio.gather(*(queue.enqueue("burst", {}) for _ in range(200)))
        await queue.flush_notifications()
        seen = await notifications_before_marker(listener, pool)
    # At least one wakeup, and far fewer than one per job.
    assert 1 <= seen < 200
    assert await job_count(pool) == 200


async def test_transaction_mode_notifies_in_every_enqueue(
    pool: asyncpg.Pool, database: str
) -> None:
    queue = Queue(pool, notify=NotifyMode.TRANSACTION)
    async with listening(database) as listener:
        for _ in range(3):
            await queue.enqueue("each", {})
        await queue.enqueue_many([EnqueueRequest("each", {}) for _ in range(10)])
        assert await notifications_before_marker(listener, pool) == 4


async def test_off_mode_and_scheduled_jobs_do_not_notify(pool: asyncpg.Pool, database: str) -> None:
    off = Queue(pool, notify=NotifyMode.OFF)
    coalesced = Queue(pool)
    async with listening(database) as listener:
        await off.enqueue("quiet", {})
        await off.enqueue_many([EnqueueRequest("quiet", {})])
        await coalesced.enqueue("later", {}, options=EnqueueOptions(delay=3600))
        await coalesced.flush_notifications()
        assert await notifications_before_marker(listener, pool) == 0
    assert await job_count(pool) == 3


async def test_only_the_standalone_wakeup_commits_asynchronously(database: str) -> None:
    # The coalesced wakeup carries no data, so its commit skips the WAL flush wait;
    # a transaction that carries jobs must never inherit that, nor may the session.
    pool = await asyncpg.create_pool(database, min_size=1, max_size=1)
    try:
        queue = Queue(pool)
        async with listening(database) as listener:
            await queue.enqueue("woken", {})
            await queue.flush_notifications()
            assert await listener.next() == ""
        assert await pool.fetchval("SHOW synchronous_commit") == "on"
        async with pool.acquire() as conn, conn.transaction():
            await queue.enqueue_many(
                [EnqueueRequest("a", {}), EnqueueRequest("b", {}, EnqueueOptions(job_key="k"))],
                connection=conn,
            )
            await queue.enqueue("c", {}, connection=conn)
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        async with pool.acquire() as conn:
            await queue.enqueue_many(
                [EnqueueRequest("d", {}), EnqueueRequest("e", {}, EnqueueOptions(job_key="j"))],
                connection=conn,
            )
            assert await conn.fetchval("SHOW synchronous_commit") == "on"
        assert await job_count(pool) == 6
    finally:
        await pool.close()


async def test_notification_payload_is_empty(pool: asyncpg.Pool, database: str) -> None:
    queue = Queue(pool, notify=NotifyMode.TRANSACTION)
    async with listening(database) as listener:
        await queue.enqueue("secret", {"password": "hunter2"})
        assert await listener.next() == ""


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "invalid job name ''"),
        ("has space", "invalid job name 'has space'"),
        ("x" * 129, "invalid job name"),
        ("semi;colon", "invalid job name"),
        ("drop'table", "invalid job name"),
        (None, "job name must be a string, got NoneType"),
        (42, "job name must be a string, got int"),
    ],
)
async def test_invalid_names_are_refused(pool: asyncpg.Pool, name: Any, message: str) -> None:
    queue = Queue(pool)
    with pytest.raises(InvalidName, match=message.replace("(", r"\(")):
        await queue.enqueue(name, {})
    with pytest.raises(InvalidName):
        await queue.enqueue_many([EnqueueRequest("fine", {}), EnqueueRequest(name, {})])
    with pytest.raises(InvalidName, match="invalid queue name"):
        EnqueueOptions(queue_name="bad name")
    assert await job_count(pool) == 0


async def test_valid_name_characters_are_accepted(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    name = "Billing.v2:send-email_" + "x" * 106
    assert len(name) == 128
    await queue.enqueue(name, {}, options=EnqueueOptions(queue_name="tenant:42.eu-west_1"))
    assert await job_count(pool) == 1


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (object(), "not JSON-encodable"),
        ({"n": math.nan}, "cannot be encoded as JSON"),
        ({"n": math.inf}, "cannot be encoded as JSON"),
        ({1j: 1}, "cannot be encoded as JSON"),
        ({"nul": "a\x00b"}, "NUL character"),
    ],
)
async def test_unencodable_payloads_are_refused(
    pool: asyncpg.Pool, payload: Any, message: str
) -> None:
    queue = Queue(pool)
    with pytest.raises(PayloadError, match=message):
        await queue.enqueue("p", payload)
    with pytest.raises(PayloadError, match=message):
        await queue.enqueue_many([EnqueueRequest("p", {}), EnqueueRequest("p", payload)])
    assert await job_count(pool) == 0


async def test_a_literal_backslash_u0000_text_is_not_mistaken_for_nul(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    job = await queue.get(await queue.enqueue("p", {"s": "\\u0000"}))
    assert job is not None
    assert job.payload == {"s": "\\u0000"}


async def test_oversized_payloads_are_refused(pool: asyncpg.Pool) -> None:
    queue = Queue(pool, max_payload_bytes=1000)
    with pytest.raises(
        PayloadTooLarge, match=r"payload is 1\d{3} bytes encoded, over the limit of 1000"
    ):
        await queue.enqueue("big", {"blob": "x" * 1000})
    with pytest.raises(PayloadTooLarge, match="over the limit"):
        await queue.enqueue("big", {"blob": "ż" * 600})  # 611 characters, 1211 bytes
    assert await job_count(pool) == 0
    await queue.enqueue("small", {"blob": "x" * 900})
    default = Queue(pool)
    with pytest.raises(PayloadTooLarge, match="over the limit of 1048576 bytes"):
        await default.enqueue("big", "x" * (1024 * 1024))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"run_at": dt.datetime(2030, 1, 1)}, "run_at must be timezone-aware"),
        ({"run_at": "2030-01-01"}, "run_at must be a datetime"),
        ({"run_at": dt.datetime.now(UTC), "delay": 5}, "give run_at or delay, not both"),
        ({"delay": -1}, "delay must be between 0 and 100 years"),
        ({"delay": math.nan}, "delay must be between"),
        ({"delay": dt.timedelta(days=365 * 200)}, "delay must be between"),
        ({"delay": "5"}, "delay must be a timedelta or seconds"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 1000"),
        ({"max_attempts": -3}, "max_attempts must be"),
        ({"max_attempts": 1001}, "max_attempts must be"),
        ({"max_attempts": 2.5}, "max_attempts must be"),
        ({"max_attempts": True}, "max_attempts must be"),
        ({"priority": 40000}, "priority must be an integer in"),
        ({"priority": "high"}, "priority must be an integer"),
        ({"job_key": ""}, "job_key must be a string of 1 to 512"),
        ({"job_key": "k" * 513}, "job_key must be a string of 1 to 512"),
        ({"job_key": "a\x00b"}, "job_key must not contain NUL"),
        ({"job_key_mode": "sometimes"}, "unknown job_key_mode 'sometimes'"),
    ],
)
def test_bad_options_are_refused_at_construction(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidOptions, match=message):
        EnqueueOptions(**kwargs)


def test_job_key_mode_accepts_its_string_value() -> None:
    assert EnqueueOptions(job_key="k", job_key_mode="replace").job_key_mode is JobKeyMode.REPLACE  # type: ignore[arg-type]


async def test_options_of_the_wrong_type_are_refused(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    with pytest.raises(InvalidOptions, match="options must be EnqueueOptions"):
        await queue.enqueue("x", {}, options={"priority": 1})  # type: ignore[arg-type]
    with pytest.raises(InvalidOptions, match="item 0 is dict"):
        await queue.enqueue_many([{"name": "x"}])  # type: ignore[list-item]
    assert await job_count(pool) == 0


async def test_bad_queue_configuration_is_refused(pool: asyncpg.Pool) -> None:
    with pytest.raises(InvalidOptions, match="unknown notify mode 'loud'"):
        Queue(pool, notify="loud")
    with pytest.raises(InvalidOptions, match="max_payload_bytes"):
        Queue(pool, max_payload_bytes=0)
    with pytest.raises(InvalidOptions, match="max_attempts"):
        Queue(pool, default_max_attempts=0)


async def test_strict_mode_refuses_unknown_names(pool: asyncpg.Pool) -> None:
    queue = Queue(pool, known_names={"send_email"})
    await queue.enqueue("send_email", {})
    with pytest.raises(UnknownJobName, match="no handler is registered for job name 'sned_email'"):
        await queue.enqueue("sned_email", {})
    with pytest.raises(UnknownJobName):
        await queue.enqueue_many([EnqueueRequest("send_email", {}), EnqueueRequest("other", {})])
    assert await job_count(pool) == 1


async def test_enqueue_raises_when_the_database_is_down() -> None:
    # Nothing listens on this port: the pool connects lazily and enqueue must fail loudly.
    pool = await asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/none", min_size=0)
    try:
        queue = Queue(pool)
        with pytest.raises(DatabaseUnavailable, match="enqueue: database unavailable"):
            await queue.enqueue("x", {})
        with pytest.raises(DatabaseUnavailable, match="enqueue_many: database unavailable"):
            await queue.enqueue_many([EnqueueRequest("x", {})])
    finally:
        await pool.close()
