"""Every producer behind one shape, for tests that must hold for each of them.

A :class:`Kind` enqueues a list of requests inside a transaction of its own driver
(one ``enqueue`` call for a lone request, ``enqueue_many`` otherwise) and commits or
rolls it back. ``Queue`` on asyncpg is the reference; the others are psycopg (sync
and async) and SQLAlchemy (sync, and asyncio on psycopg and on asyncpg). Sync
producers run in a thread, as an application's request handler would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import asyncpg
import psycopg
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from pgfleet import EnqueueRequest, Queue
from pgfleet.contrib import psycopg as pg3
from pgfleet.contrib import sqlalchemy as sa


class Rollback(Exception):
    """Raised inside a transaction block to roll it back."""


def _call(producer: Any, conn: Any, requests: Sequence[EnqueueRequest]) -> Any:
    if len(requests) == 1:
        req = requests[0]
        return producer.enqueue(conn, req.name, req.payload, options=req.options)
    return producer.enqueue_many(conn, list(requests))


def _ids(result: Any) -> list[UUID]:
    return result if isinstance(result, list) else [result]


@dataclass(frozen=True)
class Kind:
    name: str

    def __str__(self) -> str:
        return self.name

    async def enqueue(
        self,
        dsn: str,
        requests: Sequence[EnqueueRequest],
        *,
        commit: bool = True,
        **settings: Any,
    ) -> list[UUID]:
        """Enqueue ``requests`` in one transaction; commit it or roll it back. Errors
        of the producer propagate."""
        found: list[UUID] = []
        with contextlib.suppress(Rollback):
            await self._run(dsn, requests, commit, found, settings)
        return found

    async def _run(
        self,
        dsn: str,
        requests: Sequence[EnqueueRequest],
        commit: bool,
        found: list[UUID],
        settings: dict[str, Any],
    ) -> None:
        def done() -> None:
            if not commit:
                raise Rollback

        if self.name == "queue":
            conn = await asyncpg.connect(dsn)
            try:
                queue = Queue(conn, **settings)  # type: ignore[arg-type]  # a connection serves as the pool
                async with conn.transaction():
                    if len(requests) == 1:
                        r = requests[0]
                        found.append(
                            await queue.enqueue(
                                r.name, r.payload, options=r.options, connection=conn
                            )
                        )
                    else:
                        found.extend(await queue.enqueue_many(list(requests), connection=conn))
                    done()
            finally:
                await conn.close()
        elif self.name == "psycopg":

            def sync() -> None:
                producer = pg3.Producer(**settings)
                with psycopg.connect(dsn) as conn, conn.transaction():
                    found.extend(_ids(_call(producer, conn, requests)))
                    done()

            await asyncio.to_thread(sync)
        elif self.name == "psycopg-async":
            producer = pg3.AsyncProducer(**settings)
            async with (
                await psycopg.AsyncConnection.connect(dsn) as aconn,
                aconn.transaction(),
            ):
                found.extend(_ids(await _call(producer, aconn, requests)))
                done()
        elif self.name == "sqlalchemy":

            def sync() -> None:
                engine = create_engine(_url(dsn, "psycopg"))
                producer = sa.Producer(**settings)
                try:
                    with Session(engine) as session, session.begin():
                        found.extend(_ids(_call(producer, session, requests)))
                        done()
                finally:
                    engine.dispose()

            await asyncio.to_thread(sync)
        elif self.name in ("sqlalchemy-async", "sqlalchemy-asyncpg"):
            driver = "psycopg" if self.name == "sqlalchemy-async" else "asyncpg"
            engine = create_async_engine(_url(dsn, driver))
            sa_producer = sa.AsyncProducer(**settings)
            try:
                async with AsyncSession(engine) as session, session.begin():
                    found.extend(_ids(await _call(sa_producer, session, requests)))
                    done()
            finally:
                await engine.dispose()
        else:  # pragma: no cover - a typo in a parametrisation
            raise AssertionError(self.name)


def _url(dsn: str, driver: str) -> str:
    _scheme, sep, rest = dsn.partition("://")
    assert sep, dsn
    return f"postgresql+{driver}://{rest}"


REFERENCE = Kind("queue")
PRODUCERS = [
    Kind("psycopg"),
    Kind("psycopg-async"),
    Kind("sqlalchemy"),
    Kind("sqlalchemy-async"),
    Kind("sqlalchemy-asyncpg"),
]
EVERY = [REFERENCE, *PRODUCERS]
