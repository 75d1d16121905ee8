"""Enqueue on a SQLAlchemy ``Session`` or ``Connection`` (sync or asyncio), in its
transaction.

::

    from pgfleet.contrib.sqlalchemy import Producer

    producer = Producer()
    with Session(engine) as session, session.begin():
        session.add(order)
        session.flush()
        producer.enqueue(session, "send_receipt", {"order": order.id})
    # committed together, or (the block raised) neither

The job is written on the DBAPI connection under the session, inside the
transaction SQLAlchemy holds there (begun for you when the session or connection
had not begun one: the commit that follows commits the job too). The sync side needs
the psycopg 3 dialect (``postgresql+psycopg://``); the asyncio side takes
``postgresql+psycopg://`` or ``postgresql+asyncpg://``. Checks, statements and errors
are :class:`pgfleet.Queue`'s (:mod:`pgfleet.db.plans`). Needs the ``sqlalchemy`` extra.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

import asyncpg
import psycopg

from pgfleet._runtime import tracing
from pgfleet.contrib import psycopg as with_psycopg
from pgfleet.db.plans import Batch
from pgfleet.db.sqlalchemy_driver import AsyncBind, SyncBind, async_connection, sync_connection
from pgfleet.db.store import Store
from pgfleet.jobs import EnqueueOptions, EnqueueRequest, Job

__all__ = ["AsyncProducer", "Producer"]


class Producer:
    """Enqueue on a SQLAlchemy ``Session`` or ``Connection`` (psycopg 3 dialect).

    Settings as :class:`pgfleet.Queue`'s (``notify``, ``max_payload_bytes``,
    ``default_max_attempts``, ``known_names``, ``check_payloads``)."""

    def __init__(self, **settings: Any) -> None:
        self._producer = with_psycopg.Producer(**settings)

    def enqueue(
        self,
        bind: SyncBind,
        name: str,
        payload: Any = None,
        *,
        options: EnqueueOptions | None = None,
    ) -> UUID:
        return self._producer.enqueue(sync_connection(bind), name, payload, options=options)

    def enqueue_many(self, bind: SyncBind, requests: Iterable[EnqueueRequest]) -> list[UUID]:
        return self._producer.enqueue_many(sync_connection(bind), requests)

    def get(self, bind: SyncBind, job_id: UUID | str) -> Job | None:
        return self._producer.get(sync_connection(bind), job_id)

    def cancel(self, bind: SyncBind, job_id: UUID | str) -> Job:
        return self._producer.cancel(sync_connection(bind), job_id)


class AsyncProducer:
    """Enqueue on a SQLAlchemy ``AsyncSession`` or ``AsyncConnection`` (psycopg 3 or
    asyncpg dialect); settings as :class:`Producer`'s."""

    def __init__(self, **settings: Any) -> None:
        self._psycopg = with_psycopg.AsyncProducer(**settings)
        self._asyncpg = _AsyncpgProducer(**settings)

    async def enqueue(
        self,
        bind: AsyncBind,
        name: str,
        payload: Any = None,
        *,
        options: EnqueueOptions | None = None,
    ) -> UUID:
        raw = await async_connection(bind)
        if isinstance(raw, psycopg.AsyncConnection):
            return await self._psycopg.enqueue(raw, name, payload, options=options)
        return await self._asyncpg.enqueue(raw, name, payload, options=options)

    async def enqueue_many(self, bind: AsyncBind, requests: Iterable[EnqueueRequest]) -> list[UUID]:
        raw = await async_connection(bind)
        if isinstance(raw, psycopg.AsyncConnection):
            return await self._psycopg.enqueue_many(raw, requests)
        return await self._asyncpg.enqueue_many(raw, requests)

    async def get(self, bind: AsyncBind, job_id: UUID | str) -> Job | None:
        raw = await async_connection(bind)
        if isinstance(raw, psycopg.AsyncConnection):
            return await self._psycopg.get(raw, job_id)
        return await Store(raw).get(job_id)

    async def cancel(self, bind: AsyncBind, job_id: UUID | str) -> Job:
        raw = await async_connection(bind)
        if isinstance(raw, psycopg.AsyncConnection):
            return await self._psycopg.cancel(raw, job_id)
        return await Store(raw).cancel(job_id)


class _AsyncpgProducer(with_psycopg._Producing):
    """The same plans on an asyncpg connection (SQLAlchemy's asyncpg dialect), run
    by the data layer's asyncpg store as :class:`pgfleet.Queue` runs them."""

    async def enqueue(
        self, conn: asyncpg.Connection, name: str, payload: Any, *, options: EnqueueOptions | None
    ) -> UUID:
        with self._span(str(name)) as trace:
            plan = self._single(name, payload, options, trace)
            store = Store(conn)
            if isinstance(plan, Batch):
                ids = await store.enqueue_batch(plan, notify=self._notifies(plan), trace=trace)
                return ids[0]
            job_id, statement = plan
            await store.enqueue_one(statement)
            return job_id

    async def enqueue_many(
        self, conn: asyncpg.Connection, requests: Iterable[EnqueueRequest]
    ) -> list[UUID]:
        batch = self._enqueuer.batch(requests)
        if not batch.size:
            return []
        with self._span(tracing.batch_name(batch.names()), batch.size) as trace:
            return await Store(conn).enqueue_batch(batch, notify=self._notifies(batch), trace=trace)
