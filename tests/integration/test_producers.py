"""Every producer (psycopg sync and async, SQLAlchemy sync and asyncio) enqueues
inside the application's transaction exactly as Queue does: a rolled-back job does
not exist and never runs, a committed one runs once; every option lands as Queue
stores it; bad input raises what Queue raises."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import psycopg
import pytest

from pgfleet import (
    DatabaseUnavailable,
    DuplicateJobKey,
    EnqueueOptions,
    EnqueueRequest,
    InvalidJobState,
    InvalidName,
    InvalidOptions,
    Job,
    JobKeyMode,
    JobNotFound,
    JobStatus,
    PayloadError,
    PayloadTooLarge,
    Queue,
    Registry,
    SchemaNotReady,
    UnknownJobName,
    WorkerConfig,
)
from pgfleet.contrib import psycopg as pg3
from tests.helpers import listening, notifications_before_marker
from tests.integration.conftest import FAST, Recorder, running_worker
from tests.producers import EVERY, PRODUCERS, REFERENCE, Kind
from tools.devkit import until


def _requests(tag: str) -> list[list[EnqueueRequest]]:
    """One lone job, and a batch with a plain, an optioned and a keyed job."""
    return [
        [EnqueueRequest("work", {"tag": tag, "n": 0})],
        [
            EnqueueRequest("work", {"tag": tag, "n": 1}),
            EnqueueRequest("work", {"tag": tag, "n": 2}, EnqueueOptions(priority=-1)),
            EnqueueRequest("work", {"tag": tag, "n": 3}, EnqueueOptions(job_key=f"{tag}-key")),
        ],
    ]


@pytest.mark.parametrize("kind", PRODUCERS, ids=str)
async def test_a_job_commits_or_rolls_back_with_the_callers_transaction(
    kind: Kind, pool: asyncpg.Pool, database: str
) -> None:
    rolled = [
        job_id
        for requests in _requests("rolled")
        for job_id in await kind.enqueue(database, requests, commit=False)
    ]
    committed = [
        job_id
        for requests in _requests("committed")
        for job_id in await kind.enqueue(database, requests, commit=True)
    ]
    assert len(rolled) == len(committed) == 4
    queue = Queue(pool)
    assert [await queue.get(job_id) for job_id in rolled] == [None] * 4
    assert (await queue.counts())[JobStatus.QUEUED] == 4

    ran: list[tuple[Any, int]] = []
    registry = Registry()

    @registry.job("work")
    async def work(job: Job, payload: dict[str, Any]) -> None:
        ran.append((job.id, payload["n"]))

    recorder = Recorder()
    async with running_worker(pool, registry, WorkerConfig(**FAST), events=recorder):
        await recorder.until(lambda: len(recorder.finished) >= 4)
        assert await queue.runnable_backlog() == 0
    assert sorted(ran, key=lambda r: r[1]) == list(zip(committed, range(4), strict=True))
    assert {(await queue.get(i)).status for i in committed} == {JobStatus.SUCCEEDED}  # type: ignore[union-attr]


def _row(job: Job | None) -> tuple[Any, ...]:
    assert job is not None
    return (job.name, job.payload, job.priority, job.max_attempts, job.queue_name, job.job_key,
            job.status)  # fmt: skip


@pytest.mark.parametrize("kind", PRODUCERS, ids=str)
async def test_every_option_is_stored_as_queue_stores_it(
    kind: Kind, pool: asyncpg.Pool, database: str
) -> None:
    at = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    variants = [
        EnqueueOptions(),
        EnqueueOptions(priority=7, max_attempts=3, queue_name="billing"),
        EnqueueOptions(run_at=at),
        EnqueueOptions(delay=timedelta(hours=2)),
        EnqueueOptions(job_key="k", job_key_mode=JobKeyMode.REPLACE, run_at=at),
    ]
    queue = Queue(pool)
    for options in variants:
        for source in (REFERENCE, kind):
            (job_id,) = await source.enqueue(
                database, [EnqueueRequest("opt", {"o": repr(options)}, options)]
            )
            job = await queue.get(job_id)
            if source is REFERENCE:
                expected = job
                if options.job_key:  # the producer's job replaces this one
                    await queue.cancel(job_id)
            else:
                assert _row(job) == _row(expected), options
                assert job is not None and expected is not None
                if options.run_at or options.delay is None:
                    assert job.run_at == expected.run_at or options.delay is None
                else:
                    assert abs(job.run_at - expected.run_at) < timedelta(minutes=1)


@pytest.mark.parametrize("kind", PRODUCERS, ids=str)
async def test_every_producer_enqueues_jobs_that_wait_for_their_parents(
    kind: Kind, pool: asyncpg.Pool, database: str
) -> None:
    (parent,) = await REFERENCE.enqueue(database, [EnqueueRequest("p", 1)])
    child, grandchild = await kind.enqueue(
        database,
        [
            EnqueueRequest("c", 2, EnqueueOptions(after=(parent,))),
            EnqueueRequest("g", 3, EnqueueOptions(after=(0,))),
        ],
    )
    (alone,) = await kind.enqueue(
        database, [EnqueueRequest("a", 4, EnqueueOptions(after=(parent,)))]
    )
    queue = Queue(pool)
    statuses = await queue.statuses([child, grandchild, alone])
    assert set(statuses.values()) == {JobStatus.WAITING}
    await queue.complete(parent)
    statuses = await queue.statuses([child, grandchild, alone])
    assert statuses == {
        child: JobStatus.QUEUED,
        grandchild: JobStatus.WAITING,
        alone: JobStatus.QUEUED,
    }


@pytest.mark.parametrize("kind", PRODUCERS, ids=str)
async def test_a_job_key_dedupes_across_producers(
    kind: Kind, pool: asyncpg.Pool, database: str
) -> None:
    keyed = EnqueueOptions(job_key="once")
    (first,) = await REFERENCE.enqueue(database, [EnqueueRequest("k", 1, keyed)])
    (again,) = await kind.enqueue(database, [EnqueueRequest("k", 2, keyed)])
    assert again == first
    assert (await Queue(pool).get(first)).payload == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", PRODUCERS, ids=str)
async def test_a_committed_enqueue_wakes_the_workers_and_a_rolled_back_one_does_not(
    kind: Kind, pool: asyncpg.Pool, database: str
) -> None:
    async with listening(database) as listener:
        await kind.enqueue(database, [EnqueueRequest("w", 1)], commit=False)
        assert await notifications_before_marker(listener, pool) == 0
        await kind.enqueue(database, [EnqueueRequest("w", 1)], commit=True)
        assert await notifications_before_marker(listener, pool) == 1
        await kind.enqueue(database, [EnqueueRequest("w", 1)], notify="off")
        assert await notifications_before_marker(listener, pool) == 0


# ---------------------------------------------------------------- bad input

SETTINGS: dict[str, Any] = {"max_payload_bytes": 256, "known_names": {"work", "other"}}

BAD_INPUT: list[tuple[str, list[EnqueueRequest], type[Exception]]] = [
    ("a name with a space", [EnqueueRequest("bad name", 1)], InvalidName),
    ("a name too long", [EnqueueRequest("x" * 129, 1)], InvalidName),
    ("a name that is not text", [EnqueueRequest(42, 1)], InvalidName),  # type: ignore[arg-type]
    ("a name strict mode does not know", [EnqueueRequest("nobody", 1)], UnknownJobName),
    ("a payload JSON cannot hold", [EnqueueRequest("work", object())], PayloadError),
    ("a payload with NUL", [EnqueueRequest("work", "a\x00b")], PayloadError),
    ("a payload over the limit", [EnqueueRequest("work", "x" * 300)], PayloadTooLarge),
    ("options of the wrong type", [EnqueueRequest("work", 1, {"priority": 1})], InvalidOptions),  # type: ignore[arg-type]
    (
        "a bad item in a batch",
        [EnqueueRequest("work", 1), EnqueueRequest("work", 2, EnqueueOptions()), "x"],  # type: ignore[list-item]
        InvalidOptions,
    ),
    (
        "a job key twice in one batch",
        [
            EnqueueRequest("work", 1, EnqueueOptions(job_key="k")),
            EnqueueRequest("other", 2, EnqueueOptions(job_key="k")),
        ],
        DuplicateJobKey,
    ),
    (
        "a payload over the limit in a batch",
        [EnqueueRequest("work", 1), EnqueueRequest("work", "y" * 300)],
        PayloadTooLarge,
    ),
]


async def _error_of(kind: Kind, database: str, requests: list[EnqueueRequest]) -> Exception:
    with pytest.raises(Exception) as caught:
        await kind.enqueue(database, requests, **SETTINGS)
    return caught.value


@pytest.mark.parametrize(("what", "requests", "error"), BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
async def test_bad_input_gets_the_same_error_from_every_producer(
    what: str,
    requests: list[EnqueueRequest],
    error: type[Exception],
    pool: asyncpg.Pool,
    database: str,
) -> None:
    expected = await _error_of(REFERENCE, database, requests)
    assert type(expected) is error, expected
    for kind in PRODUCERS:
        got = await _error_of(kind, database, requests)
        assert (type(got), str(got)) == (type(expected), str(expected)), kind
    assert sum((await Queue(pool).counts()).values()) == 0  # nothing was written


@pytest.mark.parametrize(
    "settings",
    [
        {"max_payload_bytes": 1},
        {"default_max_attempts": 0},
        {"notify": "loud"},
        {"check_payloads": True},
    ],
    ids=str,
)
def test_bad_settings_get_the_same_error_from_every_producer(settings: dict[str, Any]) -> None:
    with pytest.raises(InvalidOptions) as reference:
        Queue(None, **settings)  # type: ignore[arg-type]  # refused before the pool is used
    for make in (pg3.Producer, pg3.AsyncProducer):
        with pytest.raises(InvalidOptions) as caught:
            make(**settings)
        assert str(caught.value) == str(reference.value)


@pytest.mark.parametrize("kind", EVERY, ids=str)
async def test_a_database_without_the_schema_is_reported_as_such(
    kind: Kind, pool: asyncpg.Pool, database: str
) -> None:
    await pool.execute("DROP SCHEMA pgfleet CASCADE")
    for requests in _requests("x"):
        with pytest.raises(SchemaNotReady, match="run pgfleet.migrate"):
            await kind.enqueue(database, requests)


async def test_a_closed_connection_is_database_unavailable(database: str) -> None:
    sync = pg3.Producer()
    conn = psycopg.connect(database)
    conn.close()
    with pytest.raises(DatabaseUnavailable, match="enqueue: database unavailable"):
        await asyncio.to_thread(sync.enqueue, conn, "work", 1)
    aconn = await psycopg.AsyncConnection.connect(database)
    await aconn.close()
    with pytest.raises(DatabaseUnavailable, match="enqueue_many: database unavailable"):
        await pg3.AsyncProducer().enqueue_many(aconn, [EnqueueRequest("a"), EnqueueRequest("b")])
    raw = await asyncpg.connect(database)
    await raw.close()
    with pytest.raises(DatabaseUnavailable, match="enqueue: database unavailable"):
        await Queue(raw).enqueue("work", 1, connection=raw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- get and cancel


async def test_get_and_cancel_answer_as_queue_does(pool: asyncpg.Pool, database: str) -> None:
    queue = Queue(pool)
    job_id = await queue.enqueue("work", {"a": 1})
    producer = pg3.AsyncProducer()
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as aconn:
        assert await producer.get(aconn, job_id) == await queue.get(job_id)
        assert await producer.get(aconn, "not-a-uuid") is None
        cancelled = await producer.cancel(aconn, str(job_id))
        assert cancelled.status is JobStatus.CANCELLED
        assert cancelled == await queue.get(job_id)
        with pytest.raises(InvalidJobState) as refused:
            await producer.cancel(aconn, job_id)
        with pytest.raises(InvalidJobState) as reference:
            await queue.cancel(job_id)
        assert str(refused.value) == str(reference.value)
        with pytest.raises(JobNotFound):
            await producer.cancel(aconn, "00000000-0000-0000-0000-000000000000")

    def sync() -> None:
        with psycopg.connect(database, autocommit=True) as conn:
            other = pg3.Producer().enqueue(conn, "work")
            assert pg3.Producer().get(conn, other) is not None
            assert pg3.Producer().cancel(conn, other).status is JobStatus.CANCELLED

    await asyncio.to_thread(sync)


async def test_the_producers_wait_for_a_job_to_finish_and_return_it(
    pool: asyncpg.Pool, database: str
) -> None:
    queue = Queue(pool)
    first, second, never = [await queue.enqueue("work", {"n": n}) for n in (1, 2, 3)]

    async def wait_async() -> Job:
        async with await psycopg.AsyncConnection.connect(database, autocommit=True) as aconn:
            with pytest.raises(TimeoutError):
                await pg3.AsyncProducer().wait(aconn, never, timeout=0.05)
            return await pg3.AsyncProducer().wait(aconn, first, timeout=30, poll_interval=0.01)

    def wait_sync() -> Job:
        with psycopg.connect(database, autocommit=True) as conn:
            with pytest.raises(JobNotFound):
                pg3.Producer().wait(conn, "00000000-0000-0000-0000-000000000000", timeout=1)
            return pg3.Producer().wait(conn, second, timeout=30, poll_interval=0.01)

    waiting = asyncio.gather(wait_async(), asyncio.to_thread(wait_sync))
    await queue.complete(first)
    await queue.cancel(second, by="test")
    done_async, done_sync = await waiting
    assert done_async.status is JobStatus.SUCCEEDED and done_async == await queue.get(first)
    assert done_sync.status is JobStatus.CANCELLED and done_sync.cancelled_by == "test"


async def test_a_batch_on_a_connection_that_has_not_begun_joins_its_implicit_transaction(
    pool: asyncpg.Pool, database: str
) -> None:
    """psycopg's transaction() would commit a batch sent first thing on a
    non-autocommit connection; the producer leaves that to the caller."""
    batch = [EnqueueRequest("a", 1), EnqueueRequest("b", 2, EnqueueOptions(job_key="kk"))]

    def sync() -> None:
        with psycopg.connect(database) as conn:
            pg3.Producer().enqueue_many(conn, batch)
            conn.rollback()
            pg3.Producer().enqueue_many(conn, batch)
            conn.commit()

    await asyncio.to_thread(sync)
    async with await psycopg.AsyncConnection.connect(database) as aconn:
        await pg3.AsyncProducer().enqueue_many(aconn, batch[:1])
        await aconn.rollback()
    assert (await Queue(pool).counts())[JobStatus.QUEUED] == 2


async def test_the_producers_read_every_kind_of_result_as_queue_does(
    pool: asyncpg.Pool, database: str
) -> None:
    """A result is any JSON value: a string, a number, a list, an object, null.
    psycopg parses json by itself and handed a JSON string over as bare text
    (``done``), which then failed to parse; the producers read what Queue reads."""
    registry = Registry()

    @registry.job("answer")
    async def answer(job: Job, payload: dict[str, Any]) -> Any:
        return payload["value"]

    values: list[Any] = ["done", "", '"quoted"', 12, 1.5, [1, "a"], {"k": [None]}, None, True]
    queue = Queue(pool)
    ids = [await queue.enqueue("answer", {"value": v}) for v in values]

    async def finished() -> bool:
        jobs = [await queue.get(i) for i in ids]
        return all(j is not None and j.status is JobStatus.SUCCEEDED for j in jobs)

    async with running_worker(pool, registry, WorkerConfig(**FAST)):
        await until(finished, timeout=30, what="every answer job to succeed")
    expected = [await queue.get(i) for i in ids]
    assert [j.result for j in expected if j is not None] == values
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as aconn:
        assert [await pg3.AsyncProducer().get(aconn, i) for i in ids] == expected

    def sync() -> list[Job | None]:
        with psycopg.connect(database, autocommit=True) as conn:
            return [pg3.Producer().get(conn, i) for i in ids]

    assert await asyncio.to_thread(sync) == expected
