"""The cron runner: the worker service that hands out the occurrences of its cron
schedules, once per occurrence across the fleet (see :mod:`pgfleet.cron`).

It records each schedule's definition in ``pgfleet.crons`` and enqueues an
occurrence only in the transaction that moves the schedule's ``last_occurrence``
forward to it (a compare-and-set through the data layer). Time is the database's
``now()``. It imports nothing from the worker: the worker wires it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from pgfleet._runtime.services import Periodic
from pgfleet.cron.occurrences import (
    aware,
    due_occurrence,
    latest_occurrence,
    next_occurrence,
    previous_occurrence,
)
from pgfleet.cron.schedules import CronJob, seconds_text
from pgfleet.db.deadlines import AppPool
from pgfleet.db.store import CronState, Store
from pgfleet.errors import InvalidOptions, PayloadDecodeError
from pgfleet.payloads import encode_payload
from pgfleet.queue import NotifyMode, Queue
from pgfleet.registry import Registry

log = logging.getLogger("pgfleet")

__all__ = ["CronService", "Outcome"]


class Settings(Protocol):
    """What the runner reads of the worker's configuration (a WorkerConfig)."""

    def seconds(self, name: str) -> float: ...


class Outcome(enum.StrEnum):
    """What one attempt to hand out an occurrence did."""

    #: This worker enqueued a new job for the occurrence.
    ENQUEUED = "enqueued"
    #: The occurrence is handed out, but an earlier job holding the key is still
    #: queued or running, so no new job was created.
    DEDUPLICATED = "deduplicated"
    #: Another worker already handed out this occurrence (or a later one).
    TAKEN = "taken"
    #: The stored definition under this id is not this worker's.
    SUPERSEDED = "superseded"
    #: The schedule's row was gone (deleted by hand); ``run_once`` records it again.
    MISSING = "missing"


@dataclass
class _Entry:
    cron: CronJob
    definition: str
    #: The latest occurrence known to be handed out (None: unknown).
    last: datetime | None = None
    foreign: set[str] = field(default_factory=set)


class CronService(Periodic):
    """Enqueues the occurrences of a worker's cron schedules.

    The constructor checks the list (unique ids, a registered handler for every
    job name, payloads that decode for their handler) and raises
    :class:`InvalidOptions` naming the problem. Interval schedules shorter than the
    worker's ``cron_poll_interval`` are capped to it, with a warning.
    :meth:`prepare` records the definitions in the database; the background loop
    then checks at least every ``cron_poll_interval`` seconds, and at each next
    occurrence.
    """

    name = "cron"

    def __init__(
        self,
        pool: AppPool,
        registry: Registry,
        crons: Sequence[Any],
        config: Settings,
    ) -> None:
        poll = config.seconds("cron_poll_interval")
        super().__init__(poll)
        self._store = Store(pool)
        self._queue = Queue(pool, notify=NotifyMode.OFF)
        #: Called with (job name, 1) for each job a schedule creates (metrics hook).
        self.on_enqueued: Callable[[str, int], None] | None = None
        self._entries: list[_Entry] = []
        self._until_next: float | None = None
        if isinstance(crons, str | bytes) or not isinstance(crons, Sequence):
            raise InvalidOptions(f"crons must be a list of CronJob, got {type(crons).__name__}")
        seen: set[str] = set()
        floor = timedelta(seconds=poll)
        for index, cron in enumerate(crons):
            if not isinstance(cron, CronJob):
                raise InvalidOptions(
                    f"crons must be CronJob values; item {index} is {type(cron).__name__}"
                )
            if cron.id in seen:
                raise InvalidOptions(
                    f"duplicate cron id {cron.id!r}: cron ids must be unique within a worker"
                )
            seen.add(cron.id)
            handler = registry.get(cron.job_name)
            if handler is None:
                raise InvalidOptions(
                    f"cron {cron.id!r}: no handler is registered for job name {cron.job_name!r}"
                )
            if handler.takes_payload:
                try:
                    handler.decode(json.loads(encode_payload(cron.payload)))
                except PayloadDecodeError as exc:
                    raise InvalidOptions(
                        f"cron {cron.id!r}: its payload does not decode for the handler of "
                        f"{cron.job_name!r}: {exc}"
                    ) from None
            if isinstance(cron.schedule, timedelta) and cron.schedule < floor:
                log.warning(
                    "cron %s: interval %s is shorter than cron_poll_interval (%ss); "
                    "it runs every %ss instead",
                    cron.id,
                    seconds_text(cron.schedule),
                    f"{poll:g}",
                    f"{poll:g}",
                )
                cron = dataclasses.replace(cron, schedule=floor)
            self._entries.append(_Entry(cron, cron.definition))

    @property
    def crons(self) -> list[CronJob]:
        """The schedules as this service runs them (intervals capped)."""
        return [e.cron for e in self._entries]

    async def _now(self) -> datetime:
        return await self._store.cron_now()

    # ------------------------------------------------------------ recording

    async def prepare(self, now: datetime | None = None) -> None:
        """Record every definition in the database.

        A new id records its latest occurrence at or before ``now`` (default: the
        database clock) as already handed out, so its first job is for the next
        occurrence; with ``catch_up_on_start()`` the latest due occurrence is left
        due instead, and the first round enqueues it. A changed definition under an
        existing id replaces the old one and starts from its next occurrence.
        """
        at = await self._now() if now is None else aware(now, "now")
        for entry in self._entries:
            await self._record(entry, at)

    async def _record(self, entry: _Entry, now: datetime, *, catch_up: bool = True) -> None:
        cron = entry.cron
        catch_up = catch_up and cron.catch_up
        latest = latest_occurrence(cron, now)
        marker = previous_occurrence(cron, latest) if catch_up else latest
        row = await self._store.cron_register(
            id=cron.id,
            job_name=cron.job_name,
            definition=entry.definition,
            last_occurrence=marker,
            latest=latest,
        )
        if row is None:  # already recorded as it is
            stored = await self._store.cron_get(id=cron.id)
            # None: deleted in between; the next round records it again.
            entry.last = None if stored is None else stored.last_occurrence
            return
        entry.last = row.last_occurrence
        upcoming = next_occurrence(cron, max(now, row.last_occurrence))
        if row.inserted:
            log.info(
                "cron %s: new schedule %r for job %s recorded; %s",
                cron.id,
                entry.definition,
                cron.job_name,
                f"catching up on {latest.isoformat()}"
                if catch_up
                else f"first occurrence {upcoming.isoformat()}",
            )
        elif row.previous_definition != entry.definition:
            log.info(
                "cron %s: definition changed from %r to %r; next occurrence %s",
                cron.id,
                row.previous_definition,
                entry.definition,
                upcoming.isoformat(),
            )
        else:
            log.info(
                "cron %s: job name changed from %s to %s",
                cron.id,
                row.previous_job_name,
                cron.job_name,
            )

    def _superseded(self, entry: _Entry, row: CronState) -> None:
        stored = f"{row.definition!r} for job {row.job_name}"
        if stored not in entry.foreign:
            entry.foreign.add(stored)
            log.warning(
                "cron %s: the database holds %s, not this worker's %r for job %s (another "
                "worker runs a changed schedule); this worker does not enqueue it",
                entry.cron.id,
                stored,
                entry.definition,
                entry.cron.job_name,
            )

    # ------------------------------------------------------------ rounds

    async def run_once(self, now: datetime | None = None) -> None:
        """Enqueue every occurrence that is due at ``now`` (default: the database
        clock) and not yet handed out."""
        self._until_next = None
        at = await self._now() if now is None else aware(now, "now")
        sampled = time.monotonic()
        for entry in self._entries:
            occurrence = due_occurrence(entry.cron, entry.last, at)
            if occurrence is None:
                continue
            try:
                outcome = await self.hand_out(entry.cron.id, occurrence)
                if outcome is Outcome.MISSING:
                    # Recorded again from now on: this worker has been running the
                    # schedule, so its latest occurrence may well have run already.
                    await self._record(entry, at, catch_up=False)
            except Exception as exc:
                log.warning(
                    "cron %s: could not enqueue occurrence %s (retried next round): %s",
                    entry.cron.id,
                    occurrence.isoformat(),
                    exc,
                )
        if not self._entries:
            return
        upcoming = min(next_occurrence(e.cron, max(at, e.last or at)) for e in self._entries)
        # Measured from when `at` was read: a slow round must not sleep past a slot.
        self._until_next = (upcoming - at).total_seconds() - (time.monotonic() - sampled)

    def next_wait(self) -> float:
        wait = self.interval * random.uniform(0.9, 1.0)
        if self._until_next is not None:
            # Wake just after the next occurrence; a little spread so a fleet does
            # not arrive at the same instant.
            spread = random.uniform(0.0, min(0.02 * self.interval, 0.1))
            wait = min(wait, max(self._until_next, 0.0) + 0.005 + spread)
        return wait

    async def hand_out(self, cron_id: str, occurrence: datetime) -> Outcome:
        """Try to enqueue ``occurrence`` of schedule ``cron_id``.

        One transaction: a compare-and-set moves the schedule's last occurrence
        forward to ``occurrence`` (refused when it is already there or later, or
        when the stored definition differs), and only then the job is enqueued. Any
        number of workers may call this for the same occurrence at once: exactly
        one gets ``ENQUEUED`` or ``DEDUPLICATED``.
        """
        entry = next((e for e in self._entries if e.cron.id == cron_id), None)
        if entry is None:
            raise InvalidOptions(f"this worker has no cron {cron_id!r}")
        occurrence = aware(occurrence, "occurrence")
        cron = entry.cron
        async with self._store.transaction("cron") as tx:
            advanced = await tx.cron_advance(
                id=cron.id,
                definition=entry.definition,
                job_name=cron.job_name,
                occurrence=occurrence,
            )
            if advanced is None:
                row = await tx.cron_get(id=cron.id)
                return self._refused(entry, occurrence, row)
            job_id = await self._queue.enqueue(
                cron.job_name,
                cron.payload,
                options=cron.enqueue_options_for(occurrence),
                connection=tx.connection,
            )
            inserted = await tx.cron_record_job(id=cron.id, job_id=job_id)
        entry.last = occurrence
        if inserted:
            if self.on_enqueued is not None:
                self.on_enqueued(cron.job_name, 1)
            log.info(
                "cron %s: enqueued job %s (%s) for occurrence %s",
                cron.id,
                job_id,
                cron.job_name,
                occurrence.isoformat(),
            )
            return Outcome.ENQUEUED
        log.info(
            "cron %s: occurrence %s not enqueued: job %s with key %r is still queued or running",
            cron.id,
            occurrence.isoformat(),
            job_id,
            cron.job_key,
        )
        return Outcome.DEDUPLICATED

    def _refused(self, entry: _Entry, occurrence: datetime, row: CronState | None) -> Outcome:
        if row is None:
            entry.last = None
            return Outcome.MISSING
        stored = row.last_occurrence
        entry.last = max(occurrence, stored)
        if row.definition != entry.definition or row.job_name != entry.cron.job_name:
            self._superseded(entry, row)
            return Outcome.SUPERSEDED
        log.debug(
            "cron %s: occurrence %s was already enqueued by another worker",
            entry.cron.id,
            occurrence.isoformat(),
        )
        return Outcome.TAKEN
