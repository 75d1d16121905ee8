"""Enqueue statements for a driver of your own.

:class:`pgfleet.Queue` runs its statements on asyncpg. A program tied to another
driver (psycopg under gevent, say, as in ``loadtest/``) can send the very same
statements: :func:`enqueue_statements` returns, for a batch of jobs with default
options, the statements :class:`~pgfleet.Queue` would send, with their arguments
in order, and the new jobs' ids. The text comes from pgfleet's named queries, so
it follows the schema; nothing here connects or executes.

Placeholders are PostgreSQL's own ``$1..$n`` (psycopg: use a ``RawCursor``). Run
the statements in order, in one transaction when there are several. Only default
options are covered (the common enqueue); scheduled, prioritised, named-queue and
keyed jobs need :class:`~pgfleet.Queue`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from pgfleet import _ids
from pgfleet.db.queries import Q
from pgfleet.errors import InvalidOptions
from pgfleet.jobs import DEFAULT_OPTIONS, EnqueueRequest, validate_name
from pgfleet.payloads import DEFAULT_MAX_PAYLOAD_BYTES, encode_payload, encode_payload_array
from pgfleet.queue import DEFAULT_MAX_ATTEMPTS

__all__ = ["EnqueueStatements", "Statement", "enqueue_statements", "wakeup"]


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement's text (``$n`` placeholders) and its arguments."""

    sql: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True)
class EnqueueStatements:
    """What enqueues a batch: the jobs' ids (in request order) and the statements."""

    ids: list[UUID]
    statements: list[Statement] = field(default_factory=list)


def enqueue_statements(
    requests: Sequence[EnqueueRequest],
    *,
    notify: bool = False,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> EnqueueStatements:
    """The statements that enqueue ``requests`` (default options only), as
    ``Queue.enqueue``/``enqueue_many`` send them. ``notify``: wake workers when the
    transaction commits (a lone job carries the wakeup in its insert; a batch gets
    a second statement). Names and payloads are checked as ``Queue`` checks them."""
    for index, req in enumerate(requests):
        if not isinstance(req, EnqueueRequest):
            raise InvalidOptions(f"item {index} is {type(req).__name__}, not EnqueueRequest")
        if req.options is not DEFAULT_OPTIONS:
            raise InvalidOptions(
                f"item {index}: enqueue_statements covers default options only; "
                "use Queue for scheduled, prioritised, queued or keyed jobs"
            )
        validate_name(req.name)
    if not requests:
        return EnqueueStatements([])
    if len(requests) == 1:
        req = requests[0]
        job_id = _ids.uuid7()
        query = Q.job_insert_plain_notify if notify else Q.job_insert_plain
        text = encode_payload(req.payload, max_payload_bytes)
        return EnqueueStatements(
            [job_id], [Statement(query.sql, (job_id, req.name, text, max_attempts))]
        )
    ids = _ids.uuid7_batch(len(requests))
    names = [req.name for req in requests]
    payloads = encode_payload_array([req.payload for req in requests], max_payload_bytes)
    statements = [Statement(Q.job_insert_many_plain.sql, (ids, names, payloads, max_attempts))]
    if notify:
        statements.append(wakeup())
    return EnqueueStatements(ids, statements)


def wakeup() -> Statement:
    """Wake the workers: inside a transaction that enqueued, delivered when (and if)
    it commits; on its own, right away."""
    return Statement(Q.notify_jobs.sql)
