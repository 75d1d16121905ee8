"""Enqueue from psycopg 3, sync or async, inside the application's own transaction.

::

    from pgfleet.contrib.psycopg import Producer

    producer = Producer()
    with psycopg.connect(dsn) as conn, conn.transaction():
        order_id = create_order(conn)
        producer.enqueue(conn, "send_receipt", {"order": order_id})
    # committed together; had the block raised, neither the order nor the job exists

:class:`Producer` (for ``psycopg.Connection``) and :class:`AsyncProducer` (for
``psycopg.AsyncConnection``) check, encode and write exactly as
:class:`pgfleet.Queue` does, from the same plans (:mod:`pgfleet.db.plans`), with
every :class:`~pgfleet.EnqueueOptions` field, and raise the same errors. They write
on the connection they are given and never commit it: a job becomes visible to
workers when the caller's transaction commits (on an autocommit connection, when
the statement does). Wakeups ride inside that transaction. Needs the ``psycopg``
extra (psycopg 3.2 or later).

``wait`` returns a job once it has finished (its ``result`` and ``errors``
included) by reading it on the given connection every ``poll_interval`` seconds,
outside any transaction of the caller's (each read sees the latest commit). Many
waiters in one asyncio process are cheaper through :meth:`pgfleet.Queue.wait`,
which shares one LISTEN connection between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import Any
from uuid import UUID

import psycopg

from pgfleet._runtime import tracing
from pgfleet.db import psycopg_driver as driver
from pgfleet.db.plans import (
    DEFAULT_MAX_ATTEMPTS,
    Batch,
    Enqueuer,
    Statement,
    cancel_steps,
    get_steps,
    notify_statement,
)
from pgfleet.errors import InvalidOptions, JobNotFound
from pgfleet.jobs import EnqueueOptions, EnqueueRequest, Job, NotifyMode
from pgfleet.payloads import DEFAULT_MAX_PAYLOAD_BYTES

__all__ = ["AsyncProducer", "Producer"]

#: Seconds between a producer's reads of a job it waits for.
WAIT_POLL_INTERVAL = 0.2

_GET = driver.translate_psycopg("get")
_CANCEL = driver.translate_psycopg("cancel")


class _Producing:
    """What both producers share: settings, checks and the plans to run."""

    def __init__(
        self,
        *,
        notify: NotifyMode | str = NotifyMode.COALESCED,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        default_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        known_names: Any = None,
        check_payloads: bool = False,
    ) -> None:
        try:
            self.notify_mode = NotifyMode(notify)
        except ValueError:
            allowed = ", ".join(m.value for m in NotifyMode)
            raise InvalidOptions(
                f"unknown notify mode {notify!r}: expected one of {allowed}"
            ) from None
        self._enqueuer = Enqueuer(
            max_payload_bytes=max_payload_bytes,
            default_max_attempts=default_max_attempts,
            known_names=known_names,
            check_payloads=check_payloads,
        )

    def _single(
        self, name: str, payload: Any, options: EnqueueOptions | None, trace: str | None = None
    ) -> tuple[UUID, Statement] | Batch:
        """The statement of one job, or (a keyed job) a batch of one."""
        opts = self._enqueuer.options(options)
        if opts.job_key is not None or opts.after:
            return self._enqueuer.batch([EnqueueRequest(name, payload, opts)])
        notify = opts.runs_now and self.notify_mode is not NotifyMode.OFF
        return self._enqueuer.single(name, payload, opts, notify=notify, trace=trace)

    @staticmethod
    def _span(name: str, count: int = 1) -> AbstractContextManager[str | None]:
        """The enqueue's producer span (see pgfleet._runtime.tracing), yielding the
        trace context to store; nothing while no tracer provider is installed."""
        tracer = tracing.current_tracer()
        if tracer is None:
            return contextlib.nullcontext()
        return tracing.enqueue_span(tracer, name, count)

    def _notifies(self, batch: Batch) -> bool:
        return batch.any_runs_now and self.notify_mode is not NotifyMode.OFF


class Producer(_Producing):
    """Enqueue on a ``psycopg.Connection``, in its transaction.

    Settings as :class:`pgfleet.Queue`'s: ``notify``, ``max_payload_bytes``,
    ``default_max_attempts``, ``known_names`` (strict mode) and ``check_payloads``.
    One producer serves any number of connections and threads.
    """

    def enqueue(
        self,
        connection: psycopg.Connection[Any],
        name: str,
        payload: Any = None,
        *,
        options: EnqueueOptions | None = None,
    ) -> UUID:
        """Enqueue one job on ``connection`` and return its id (an existing job's id
        when its job_key deduplicates)."""
        with self._span(str(name)) as trace:
            plan = self._single(name, payload, options, trace)
            if isinstance(plan, Batch):
                ids = driver.run_batch(connection, plan, notify=self._notifies(plan), trace=trace)
                return ids[0]  # type: ignore[no-any-return]
            job_id, statement = plan
            driver.run_statement(connection, statement, driver.ENQUEUE)
            return job_id

    def enqueue_many(
        self, connection: psycopg.Connection[Any], requests: Iterable[EnqueueRequest]
    ) -> list[UUID]:
        """Enqueue a batch atomically (a savepoint inside the caller's transaction)
        and return the ids in request order."""
        batch = self._enqueuer.batch(requests)
        if not batch.size:
            return []
        with self._span(tracing.batch_name(batch.names()), batch.size) as trace:
            return driver.run_batch(connection, batch, notify=self._notifies(batch), trace=trace)

    def notify(self, connection: psycopg.Connection[Any]) -> None:
        """Wake the workers: when the connection's transaction commits, or at once
        on an autocommit connection (for jobs enqueued with ``notify="off"``)."""
        driver.run_statement(connection, notify_statement(), driver.ENQUEUE)

    def get(self, connection: psycopg.Connection[Any], job_id: UUID | str) -> Job | None:
        """The job with that id, or None."""
        return driver.run(connection, get_steps(job_id), _GET)

    def cancel(
        self, connection: psycopg.Connection[Any], job_id: UUID | str, *, by: str | None = None
    ) -> Job:
        """Cancel a queued job, or ask a running one to stop, as
        :meth:`pgfleet.Queue.cancel` does."""
        return driver.run(connection, cancel_steps(job_id, by), _CANCEL)

    def wait(
        self,
        connection: psycopg.Connection[Any],
        job_id: UUID | str,
        *,
        timeout: float | None = None,
        poll_interval: float = WAIT_POLL_INTERVAL,
    ) -> Job:
        """Block until the job has finished and return it; :class:`TimeoutError`
        after ``timeout`` seconds, :class:`pgfleet.JobNotFound` without such a job."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = driver.run(connection, get_steps(job_id), _GET)
            left = _check_wait(job, job_id, deadline, poll_interval)
            if left is None:
                assert job is not None
                return job
            time.sleep(left)


class AsyncProducer(_Producing):
    """Enqueue on a ``psycopg.AsyncConnection``, in its transaction (see
    :class:`Producer`)."""

    async def enqueue(
        self,
        connection: psycopg.AsyncConnection[Any],
        name: str,
        payload: Any = None,
        *,
        options: EnqueueOptions | None = None,
    ) -> UUID:
        with self._span(str(name)) as trace:
            plan = self._single(name, payload, options, trace)
            if isinstance(plan, Batch):
                ids = await driver.arun_batch(
                    connection, plan, notify=self._notifies(plan), trace=trace
                )
                return ids[0]  # type: ignore[no-any-return]
            job_id, statement = plan
            await driver.arun_statement(connection, statement, driver.ENQUEUE)
            return job_id

    async def enqueue_many(
        self, connection: psycopg.AsyncConnection[Any], requests: Iterable[EnqueueRequest]
    ) -> list[UUID]:
        batch = self._enqueuer.batch(requests)
        if not batch.size:
            return []
        with self._span(tracing.batch_name(batch.names()), batch.size) as trace:
            return await driver.arun_batch(
                connection, batch, notify=self._notifies(batch), trace=trace
            )

    async def notify(self, connection: psycopg.AsyncConnection[Any]) -> None:
        await driver.arun_statement(connection, notify_statement(), driver.ENQUEUE)

    async def get(self, connection: psycopg.AsyncConnection[Any], job_id: UUID | str) -> Job | None:
        return await driver.arun(connection, get_steps(job_id), _GET)

    async def cancel(
        self, connection: psycopg.AsyncConnection[Any], job_id: UUID | str, *, by: str | None = None
    ) -> Job:
        return await driver.arun(connection, cancel_steps(job_id, by), _CANCEL)

    async def wait(
        self,
        connection: psycopg.AsyncConnection[Any],
        job_id: UUID | str,
        *,
        timeout: float | None = None,
        poll_interval: float = WAIT_POLL_INTERVAL,
    ) -> Job:
        """The finished job (see :meth:`Producer.wait`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = await driver.arun(connection, get_steps(job_id), _GET)
            left = _check_wait(job, job_id, deadline, poll_interval)
            if left is None:
                assert job is not None
                return job
            await asyncio.sleep(left)


def _check_wait(
    job: Job | None, job_id: UUID | str, deadline: float | None, poll_interval: float
) -> float | None:
    """None when ``job`` has finished, else how long to sleep before the next read;
    raises when there is no such job or the deadline has passed."""
    if job is None:
        raise JobNotFound(job_id)
    if job.status.finished:
        return None
    if deadline is None:
        return poll_interval
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError(f"job {job.id} has not finished (it is {job.status.value})")
    return min(poll_interval, left)
