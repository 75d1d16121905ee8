"""Waiting for jobs to finish (``Queue.wait``): every waiter on one pool in a
process shares one LISTEN connection on the done channel, whichever ``Queue`` it
waits through, and one poll per interval covers the notifications that never
arrive (a lost connection, a finish that raced the waiter's registration). A
notification only makes a waiter return sooner.

The unit of sharing is the pool: the listener borrows one of the pool's
connections while anyone waits, so it lives and dies with that pool (closing
another pool never cuts it), and it sees what the pool's connections see (their
database, role and settings)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

from pgfleet._runtime.listener import Listener
from pgfleet.db import DONE_CHANNEL
from pgfleet.db.deadlines import DEFAULT_DATABASE_TIMEOUT, BoundedPool
from pgfleet.db.store import Store
from pgfleet.errors import JobNotFound
from pgfleet.jobs import Job

log = logging.getLogger("pgfleet")

#: Seconds between polls of the waited-for jobs' statuses (the fallback).
WAIT_POLL_INTERVAL = 1.0
#: Seconds before marking again a waited-for job whose row was locked (doubled
#: while it stays locked, up to the poll interval).
REMARK_DELAY = 0.01

#: The waiters of each pool in use, by the id of the driver's pool (a hub holds
#: its pool, so the id is not reused while it is here). A hub leaves when its
#: last waiter does.
_SHARED: dict[int, Waiters] = {}
#: Calls of ``Waiters.wait`` waiting now in this process (the waiters gauge).
_callers = 0


def _raw(pool: Any) -> Any:
    return pool.raw if isinstance(pool, BoundedPool) else pool


def shared_waiters(pool: Any) -> Waiters:
    """The waiters of ``pool`` in this process, created at the first wait."""
    key = id(_raw(pool))
    waiters = _SHARED.get(key)
    if waiters is None:
        waiters = _SHARED[key] = Waiters(pool, Store(pool), shared=True)
    return waiters


def waiters_of(pool: Any) -> Waiters | None:
    """The waiters of ``pool`` in this process while anyone waits on it, else None."""
    return _SHARED.get(id(_raw(pool)))


def waiting_now() -> int:
    """``Queue.wait`` calls waiting now in this process, on every pool."""
    return _callers


class Waiters:
    """The waiters of one pool: futures by job id, resolved with the finished job.
    The listener runs while anyone waits (its connection goes back to the pool
    with the last waiter, so closing the pool never waits for it). ``shared``: the
    pool's hub of :func:`shared_waiters`, which leaves it when the last waiter
    has gone."""

    def __init__(
        self,
        pool: Any,
        store: Store,
        *,
        poll_interval: float = WAIT_POLL_INTERVAL,
        timeout: float = DEFAULT_DATABASE_TIMEOUT,
        shared: bool = False,
    ) -> None:
        # The listener holds a connection of the driver's pool itself (a bounded
        # pool's acquire bounds a call, not a connection kept for long).
        self._pool = _raw(pool)
        self._shared = shared
        self._store = store
        self.poll_interval = poll_interval
        self._timeout = timeout
        self._futures: dict[uuid.UUID, list[asyncio.Future[Job]]] = {}
        #: Waited for since the last round: marked awaited, then checked.
        self._new: set[uuid.UUID] = set()
        #: Announced finished by a notification: checked next round.
        self._announced: set[uuid.UUID] = set()
        self._check_all = False
        #: The wait before marking again the jobs the last round found locked.
        self._remark = 0.0
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.listener: Listener | None = None
        #: Rounds done, and those that polled every waited-for job (for tests).
        self.rounds = 0
        self.polls = 0
        #: Rounds that found a waited-for job locked and marked it again later.
        self.remarks = 0

    @property
    def waiting(self) -> int:
        """Jobs waited for now."""
        return len(self._futures)

    async def wait(self, job_id: uuid.UUID, timeout: float | None) -> Job:
        global _callers
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Job] = loop.create_future()
        self._futures.setdefault(job_id, []).append(future)
        self._new.add(job_id)
        self._kick.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="pgfleet-waiters")
        _callers += 1
        try:
            async with asyncio.timeout(timeout):
                return await future
        finally:
            _callers -= 1
            futures = self._futures.get(job_id)
            if futures is not None:
                with contextlib.suppress(ValueError):
                    futures.remove(future)
                if not futures:
                    del self._futures[job_id]

    def _on_done(self, payload: str) -> None:
        if not payload:
            self._check_all = True
        else:
            futures = self._futures
            for text in payload.split(","):
                try:
                    uid = uuid.UUID(text)
                except ValueError:
                    continue
                if uid in futures:
                    self._announced.add(uid)
        self._kick.set()

    def _on_reconnect(self, _source: str) -> None:
        # Anything may have finished while the listener was away.
        self._check_all = True
        self._kick.set()

    async def _run(self) -> None:
        listener = self.listener = Listener(
            self._pool,
            self._on_reconnect,
            timeout=self._timeout,
            channels={DONE_CHANNEL: self._on_done},
            jobs_channel=False,
        )
        listener.start()
        try:
            # Registrations made before the listener listens are covered by the
            # status check that follows their mark, and then by the polls.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(listener.connected.wait(), self.poll_interval)
            while self._futures or self._new:
                polled = False
                if not self._kick.is_set():
                    try:
                        await asyncio.wait_for(self._kick.wait(), self.poll_interval)
                    except TimeoutError:
                        polled = True
                self._kick.clear()
                try:
                    await self._round(polled)
                    self.rounds += 1
                except Exception as exc:
                    log.warning("waiting for jobs: %s; retrying at the next poll", exc)
                    await asyncio.sleep(self.poll_interval)
        finally:
            self.listener = None
            await listener.stop()
            if self._futures or self._new:
                # Someone started waiting while this one wound down.
                self._task = asyncio.get_running_loop().create_task(
                    self._run(), name="pgfleet-waiters"
                )
            elif self._shared and _SHARED.get(id(self._pool)) is self:
                del _SHARED[id(self._pool)]

    async def _round(self, polled: bool) -> None:
        new, self._new = self._new, set()
        try:
            skipped = await self._store.job_await(ids=list(new)) if new else []
        except BaseException:
            self._new |= new
            raise
        skipped = [uid for uid in skipped if uid in self._futures]
        if skipped:
            # Locked by a transaction of someone else (a claim round, mostly, for a
            # few milliseconds): marked again after a short wait, longer each time
            # the same happens (up to the poll interval), instead of at the next poll.
            self._new.update(skipped)
            self._remark = min(self._remark * 2 or REMARK_DELAY, self.poll_interval)
            self.remarks += 1
            asyncio.get_running_loop().call_later(self._remark, self._kick.set)
        else:
            self._remark = 0.0
        if polled or self._check_all:
            self._check_all = False
            self._announced.clear()
            if polled:
                self.polls += 1
            check = set(self._futures)
        else:
            check = new | self._announced
            self._announced = set()
        check &= self._futures.keys()
        if not check:
            return
        statuses = await self._store.job_status_many(ids=list(check))
        for uid in check - statuses.keys():
            self._settle(uid, None)
        finished = [uid for uid, status in statuses.items() if status.finished]
        if finished:
            for job in await self._store.job_get_many(ids=finished):
                self._settle(job.id, job)

    def _settle(self, uid: uuid.UUID, job: Job | None) -> None:
        for future in self._futures.pop(uid, []):
            if future.done():
                continue
            if job is None:
                future.set_exception(JobNotFound(uid))
            else:
                future.set_result(job)
