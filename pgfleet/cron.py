"""Cron schedules: daily, monthly and interval jobs, enqueued once per occurrence
across the whole fleet.

Every worker may run the same list of :class:`CronJob`. Each schedule has a row in
``pgfleet.crons`` holding the latest occurrence handed out; a worker enqueues an
occurrence only in the transaction that moves that row's ``last_occurrence``
forward to it (a compare-and-set), so each (schedule, occurrence) is enqueued by
exactly one worker, and a worker whose clock lags can never enqueue an occurrence
again. Time is the database's ``now()``.

Occurrences are pure functions of the schedule and a point in time
(:func:`latest_occurrence`, :func:`next_occurrence`, :func:`due_occurrence`):

- Daily and monthly schedules are wall-clock times in UTC or an IANA time zone. A
  local time skipped by a forward daylight-saving transition moves forward by the
  gap (02:30 on a New York spring-forward day runs at 03:30 EDT); a local time
  repeated by a backward transition runs once, at the earlier instant.
- A monthly day the month lacks runs on the month's last day: day 31 runs on
  30 April and on 28 or 29 February; day 29 runs on 28 February in common years.
- Interval schedules are multiples of the interval since the Unix epoch (UTC) and
  ignore time zones: every 15 minutes runs at :00, :15, :30 and :45.
"""

from __future__ import annotations

import calendar
import dataclasses
import enum
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgfleet._runtime.services import Periodic
from pgfleet.db import Q
from pgfleet.db.boundary import translate_errors
from pgfleet.errors import InvalidOptions, PayloadDecodeError, PayloadError
from pgfleet.jobs import EnqueueOptions, JobKeyMode, validate_name
from pgfleet.payloads import encode_payload
from pgfleet.queue import NotifyMode, Queue
from pgfleet.registry import Registry

if TYPE_CHECKING:
    from pgfleet.worker import WorkerConfig

log = logging.getLogger("pgfleet")

__all__ = [
    "CronJob",
    "CronService",
    "DailySchedule",
    "MonthlySchedule",
    "Weekday",
    "due_occurrence",
    "latest_occurrence",
    "next_occurrence",
    "previous_occurrence",
]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_RESOLUTION = timedelta(microseconds=1)


class Weekday(enum.IntEnum):
    """Days of the week, numbered like :meth:`datetime.date.weekday` (Monday is 0).

    :meth:`DailySchedule.weekdays` takes these or the plain integers 0-6 (so
    ``calendar.MONDAY`` ... ``calendar.SUNDAY`` work too).
    """

    MONDAY = 0
    TUESDAY = 1
    WEDNESDAY = 2
    THURSDAY = 3
    FRIDAY = 4
    SATURDAY = 5
    SUNDAY = 6

    @property
    def short(self) -> str:
        return self.name[:3].lower()


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_range(value: object, what: str, low: int, high: int) -> None:
    if not _is_int(value) or not low <= value <= high:  # type: ignore[operator]
        raise InvalidOptions(f"{what} must be an integer from {low} to {high}, got {value!r}")


def _weekday(value: object) -> Weekday:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 6:
        raise InvalidOptions(
            f"weekday must be an integer from 0 (Monday) to 6 (Sunday) or a "
            f"pgfleet.Weekday, got {value!r}"
        )
    return Weekday(value)


@dataclass(frozen=True, slots=True)
class DailySchedule:
    """Every day (or on chosen weekdays) at ``hour``:``minute`` local time."""

    hour: int
    minute: int
    #: The weekdays it runs on, in order; None means every day.
    days: tuple[Weekday, ...] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        _check_range(self.hour, "DailySchedule hour", 0, 23)
        _check_range(self.minute, "DailySchedule minute", 0, 59)
        if self.days is not None:
            days = tuple(sorted({_weekday(d) for d in self.days}))
            if not days:
                raise InvalidOptions("weekdays must name at least one day")
            object.__setattr__(self, "days", None if len(days) == 7 else days)

    def weekdays(self, *days: int | Iterable[int]) -> DailySchedule:
        """The same time, only on ``days``: integers 0 (Monday) to 6 (Sunday) or
        :class:`Weekday` values, given one by one or as an iterable. The weekday is
        the one of the local date in the schedule's time zone."""
        flat: list[object] = []
        for d in days:
            if isinstance(d, Iterable) and not isinstance(d, str | bytes):
                flat.extend(d)
            else:
                flat.append(d)
        if not flat:
            raise InvalidOptions("weekdays must name at least one day")
        return DailySchedule(self.hour, self.minute, days=tuple(_weekday(d) for d in flat))

    def runs_on(self, day: date) -> bool:
        return self.days is None or day.weekday() in self.days

    def describe(self) -> str:
        text = f"daily {self.hour:02d}:{self.minute:02d}"
        if self.days is not None:
            text += " on " + ",".join(d.short for d in self.days)
        return text


@dataclass(frozen=True, slots=True)
class MonthlySchedule:
    """Every month on ``day`` at ``hour``:``minute`` local time.

    A day the month lacks (29-31) runs on the month's last day instead: day 31
    runs on 30 April, and on 28 February (29 in leap years).
    """

    day: int
    hour: int
    minute: int

    def __post_init__(self) -> None:
        _check_range(self.day, "MonthlySchedule day", 1, 31)
        _check_range(self.hour, "MonthlySchedule hour", 0, 23)
        _check_range(self.minute, "MonthlySchedule minute", 0, 59)

    def day_in(self, year: int, month: int) -> date:
        """The date this schedule runs on in that month (clamped to its last day)."""
        return date(year, month, min(self.day, calendar.monthrange(year, month)[1]))

    def describe(self) -> str:
        return f"monthly day {self.day} {self.hour:02d}:{self.minute:02d}"


Schedule = DailySchedule | MonthlySchedule | timedelta


def _zone(cron_id: str, name: str) -> tzinfo:
    if name == "UTC":
        return UTC
    if not isinstance(name, str) or not name:
        raise InvalidOptions(f"cron {cron_id!r}: time zone must be an IANA name, got {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidOptions(
            f"cron {cron_id!r}: unknown time zone {name!r}: use an IANA name such as "
            "'America/New_York' (the tzdata package provides the database where the "
            "system has none)"
        ) from None


def _seconds_text(step: timedelta) -> str:
    seconds, micros = divmod(step // _RESOLUTION, 1_000_000)
    if not micros:
        return f"{seconds}s"
    return f"{seconds}.{micros:06d}".rstrip("0") + "s"


@dataclass(frozen=True, slots=True)
class CronJob:
    """A schedule that enqueues job ``job_name`` at each occurrence.

    Build one with :meth:`daily_utc`, :meth:`daily_in_timezone`,
    :meth:`monthly_utc`, :meth:`monthly_in_timezone` or :meth:`interval`.

    ``id`` names the schedule's occurrence slots in the database: keep it stable
    across releases (changing it starts a new schedule). ``job_name`` selects the
    handler; one handler can back several schedules. Each enqueued job runs
    ``job_name`` with ``payload``, its ``run_at`` is the occurrence, and its
    ``job_key`` is ``id`` (:attr:`JobKeyMode.DEDUPE`): while the job of an earlier
    occurrence is still queued or running, a new occurrence enqueues nothing.
    See :meth:`options` to change that.
    """

    id: str
    job_name: str
    schedule: Schedule
    #: IANA zone name of daily/monthly schedules ("UTC" for the *_utc ones);
    #: None for interval schedules.
    timezone: str | None = "UTC"
    payload: Any = None
    #: Enqueue the latest due occurrence when the schedule is first recorded.
    catch_up: bool = False
    enqueue_options: EnqueueOptions | None = None
    #: Enqueue without a job key, so occurrences may run concurrently.
    overlap: bool = False
    zone: tzinfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_name(self.id, "cron id")
        validate_name(self.job_name, "job name")
        schedule = self.schedule
        if isinstance(schedule, timedelta):
            if schedule <= timedelta(0):
                raise InvalidOptions(f"cron {self.id!r}: interval must be positive, got {schedule}")
            if schedule < timedelta(milliseconds=1):
                raise InvalidOptions(f"cron {self.id!r}: interval must be at least 1 ms")
            object.__setattr__(self, "timezone", None)
            object.__setattr__(self, "zone", UTC)
        elif isinstance(schedule, DailySchedule | MonthlySchedule):
            tz = self.timezone if self.timezone is not None else "UTC"
            object.__setattr__(self, "timezone", tz)
            object.__setattr__(self, "zone", _zone(self.id, tz))
        else:
            raise InvalidOptions(
                f"cron {self.id!r}: schedule must be a DailySchedule, MonthlySchedule or "
                f"timedelta, got {type(schedule).__name__}"
            )
        try:
            encode_payload(self.payload)
        except PayloadError as exc:
            raise PayloadError(f"cron {self.id!r}: {exc}") from None
        if not isinstance(self.catch_up, bool) or not isinstance(self.overlap, bool):
            raise InvalidOptions(f"cron {self.id!r}: catch_up and overlap must be booleans")
        opts = self.enqueue_options
        if opts is not None:
            if not isinstance(opts, EnqueueOptions):
                raise InvalidOptions(
                    f"cron {self.id!r}: options must be EnqueueOptions, got {type(opts).__name__}"
                )
            if opts.run_at is not None or opts.delay is not None:
                raise InvalidOptions(
                    f"cron {self.id!r}: options must not set run_at or delay: a cron job "
                    "runs at its occurrence"
                )
            if self.overlap and opts.job_key is not None:
                raise InvalidOptions(
                    f"cron {self.id!r}: overlap=True enqueues without a job key; "
                    f"do not also pass job_key {opts.job_key!r}"
                )

    # ------------------------------------------------------------ constructors

    @classmethod
    def daily_utc(
        cls, id: str, job_name: str, schedule: DailySchedule, *, payload: Any = None
    ) -> CronJob:
        """Every day (or on ``schedule``'s weekdays) at its time in UTC."""
        _expect(id, schedule, DailySchedule, "daily_utc")
        return cls(id, job_name, schedule, "UTC", payload)

    @classmethod
    def daily_in_timezone(
        cls,
        id: str,
        job_name: str,
        schedule: DailySchedule,
        timezone: str,
        *,
        payload: Any = None,
    ) -> CronJob:
        """Every day (or on ``schedule``'s weekdays) at its wall-clock time in the
        IANA zone ``timezone`` (an unknown zone raises InvalidOptions)."""
        _expect(id, schedule, DailySchedule, "daily_in_timezone")
        return cls(id, job_name, schedule, timezone, payload)

    @classmethod
    def monthly_utc(
        cls, id: str, job_name: str, schedule: MonthlySchedule, *, payload: Any = None
    ) -> CronJob:
        """Every month on ``schedule``'s day and time in UTC."""
        _expect(id, schedule, MonthlySchedule, "monthly_utc")
        return cls(id, job_name, schedule, "UTC", payload)

    @classmethod
    def monthly_in_timezone(
        cls,
        id: str,
        job_name: str,
        schedule: MonthlySchedule,
        timezone: str,
        *,
        payload: Any = None,
    ) -> CronJob:
        """Every month on ``schedule``'s day and wall-clock time in ``timezone``."""
        _expect(id, schedule, MonthlySchedule, "monthly_in_timezone")
        return cls(id, job_name, schedule, timezone, payload)

    @classmethod
    def interval(
        cls, id: str, job_name: str, every: timedelta | float, *, payload: Any = None
    ) -> CronJob:
        """Every ``every`` (a timedelta or seconds), at multiples of it since the
        Unix epoch: no time zone, no daylight saving."""
        if isinstance(every, bool) or not isinstance(every, timedelta | int | float):
            raise InvalidOptions(
                f"cron {id!r}: interval must be a timedelta or seconds, got {every!r}"
            )
        if not isinstance(every, timedelta):
            if not math.isfinite(every) or every <= 0:
                raise InvalidOptions(f"cron {id!r}: interval must be positive, got {every!r}")
            every = timedelta(seconds=every)
        return cls(id, job_name, every, None, payload)

    # ------------------------------------------------------------ modifiers

    def catch_up_on_start(self) -> CronJob:
        """When the schedule is first recorded, enqueue its latest due occurrence
        instead of waiting for the next one."""
        return dataclasses.replace(self, catch_up=True)

    def options(self, options: EnqueueOptions | None = None, *, overlap: bool = False) -> CronJob:
        """Enqueue options for this schedule's jobs.

        ``priority``, ``max_attempts`` and ``queue_name`` apply to every job.
        ``job_key`` replaces the schedule id as the jobs' key and ``job_key_mode``
        applies to it (the default key is the schedule id, mode DEDUPE).
        ``overlap=True`` enqueues without any key, so an occurrence is enqueued even
        while earlier ones are still queued or running. ``run_at`` and ``delay`` are
        refused: a cron job runs at its occurrence.
        """
        return dataclasses.replace(self, enqueue_options=options, overlap=overlap)

    # ------------------------------------------------------------ derived

    @property
    def definition(self) -> str:
        """Canonical text of the schedule, stored to detect a changed definition."""
        schedule = self.schedule
        if isinstance(schedule, timedelta):
            return f"every {_seconds_text(schedule)}"
        return f"{schedule.describe()} {self.timezone}"

    @property
    def job_key(self) -> str | None:
        """The key its jobs carry (None with overlap)."""
        if self.overlap:
            return None
        opts = self.enqueue_options
        if opts is not None and opts.job_key is not None:
            return opts.job_key
        return self.id

    def enqueue_options_for(self, occurrence: datetime) -> EnqueueOptions:
        """The options of the job enqueued for ``occurrence``."""
        opts = self.enqueue_options or EnqueueOptions()
        key = self.job_key
        return dataclasses.replace(
            opts,
            run_at=occurrence,
            job_key=key,
            job_key_mode=opts.job_key_mode if key is not None else JobKeyMode.DEDUPE,
        )


def _expect(cron_id: str, schedule: object, kind: type, constructor: str) -> None:
    if not isinstance(schedule, kind):
        raise InvalidOptions(
            f"cron {cron_id!r}: {constructor} takes a {kind.__name__}, "
            f"got {type(schedule).__name__}"
        )


# ---------------------------------------------------------------- occurrences


def _aware(value: datetime, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidOptions(f"{what} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _at(day: date, hour: int, minute: int, zone: tzinfo) -> datetime:
    """The instant of a local wall-clock time (UTC).

    ``fold=0`` gives the usual daylight-saving rules: a time in a forward gap takes
    the offset from before the transition, so it lands after the gap, moved forward
    by its length; a repeated time resolves to its first (earlier) instant.
    """
    local = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone, fold=0)
    return local.astimezone(UTC)


def _candidates(cron: CronJob, around: datetime, forward: bool) -> Iterable[datetime]:
    """Occurrences near ``around``, in time order (backwards unless ``forward``),
    starting early or late enough to contain the answer."""
    schedule = cron.schedule
    zone = cron.zone
    local = around.astimezone(zone).date()
    if isinstance(schedule, DailySchedule):
        # A weekday filter skips at most six days; one more on each side covers
        # offsets and transitions that move a time across midnight.
        steps = range(-1, 10) if forward else range(1, -10, -1)
        for k in steps:
            day = local + timedelta(days=k)
            if schedule.runs_on(day):
                yield _at(day, schedule.hour, schedule.minute, zone)
    elif isinstance(schedule, MonthlySchedule):
        index = local.year * 12 + local.month - 1
        offsets = range(-1, 3) if forward else range(1, -3, -1)
        for k in offsets:
            year, month0 = divmod(index + k, 12)
            yield _at(schedule.day_in(year, month0 + 1), schedule.hour, schedule.minute, zone)
    else:  # pragma: no cover - intervals are computed directly
        raise AssertionError(schedule)


def latest_occurrence(cron: CronJob, at: datetime) -> datetime:
    """The latest occurrence of ``cron`` at or before ``at`` (in UTC)."""
    at = _aware(at, "at")
    schedule = cron.schedule
    if isinstance(schedule, timedelta):
        return EPOCH + ((at - EPOCH) // schedule) * schedule
    for candidate in _candidates(cron, at, forward=False):
        if candidate <= at:
            return candidate
    raise AssertionError(
        f"no occurrence of {cron.definition} found before {at}"
    )  # pragma: no cover


def next_occurrence(cron: CronJob, after: datetime) -> datetime:
    """The first occurrence of ``cron`` strictly after ``after`` (in UTC)."""
    after = _aware(after, "after")
    schedule = cron.schedule
    if isinstance(schedule, timedelta):
        return latest_occurrence(cron, after) + schedule
    for candidate in _candidates(cron, after, forward=True):
        if candidate > after:
            return candidate
    raise AssertionError(
        f"no occurrence of {cron.definition} found after {after}"
    )  # pragma: no cover


def due_occurrence(cron: CronJob, last: datetime | None, now: datetime) -> datetime | None:
    """The occurrence to enqueue at ``now`` when ``last`` is the latest one already
    handed out: the latest occurrence at or before ``now`` if it is later than
    ``last``, else None. Occurrences missed in between (no worker was running) are
    not enqueued one by one: only the latest is.
    """
    latest = latest_occurrence(cron, now)
    if last is not None and latest <= _aware(last, "last"):
        return None
    return latest


def previous_occurrence(cron: CronJob, occurrence: datetime) -> datetime:
    """The occurrence before ``occurrence`` (strictly earlier)."""
    return latest_occurrence(cron, _aware(occurrence, "occurrence") - _RESOLUTION)


# ---------------------------------------------------------------- the service


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
        pool: Any,
        registry: Registry,
        crons: Sequence[Any],
        config: WorkerConfig,
    ) -> None:
        poll = config.seconds("cron_poll_interval")
        super().__init__(poll)
        self._pool = pool
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
                    _seconds_text(cron.schedule),
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
        with translate_errors("cron"):
            value: datetime = await self._pool.fetchval(Q.cron_now.sql)
        return value

    # ------------------------------------------------------------ recording

    async def prepare(self, now: datetime | None = None) -> None:
        """Record every definition in the database.

        A new id records its latest occurrence at or before ``now`` (default: the
        database clock) as already handed out, so its first job is for the next
        occurrence; with ``catch_up_on_start()`` the latest due occurrence is left
        due instead, and the first round enqueues it. A changed definition under an
        existing id replaces the old one and starts from its next occurrence.
        """
        at = await self._now() if now is None else _aware(now, "now")
        for entry in self._entries:
            await self._record(entry, at)

    async def _record(self, entry: _Entry, now: datetime, *, catch_up: bool = True) -> None:
        cron = entry.cron
        catch_up = catch_up and cron.catch_up
        latest = latest_occurrence(cron, now)
        marker = previous_occurrence(cron, latest) if catch_up else latest
        with translate_errors("cron prepare"):
            row = await self._pool.fetchrow(
                Q.cron_register.sql, cron.id, cron.job_name, entry.definition, marker, latest
            )
            if row is None:  # already recorded as it is
                stored = await self._pool.fetchrow(Q.cron_get.sql, cron.id)
                # None: deleted in between; the next round records it again.
                entry.last = None if stored is None else stored["last_occurrence"]
                return
        entry.last = row["last_occurrence"]
        upcoming = next_occurrence(cron, max(now, row["last_occurrence"]))
        if row["inserted"]:
            log.info(
                "cron %s: new schedule %r for job %s recorded; %s",
                cron.id,
                entry.definition,
                cron.job_name,
                f"catching up on {latest.isoformat()}"
                if catch_up
                else f"first occurrence {upcoming.isoformat()}",
            )
        elif row["previous_definition"] != entry.definition:
            log.info(
                "cron %s: definition changed from %r to %r; next occurrence %s",
                cron.id,
                row["previous_definition"],
                entry.definition,
                upcoming.isoformat(),
            )
        else:
            log.info(
                "cron %s: job name changed from %s to %s",
                cron.id,
                row["previous_job_name"],
                cron.job_name,
            )

    def _superseded(self, entry: _Entry, row: Any) -> None:
        stored = f"{row['definition']!r} for job {row['job_name']}"
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
        at = await self._now() if now is None else _aware(now, "now")
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
        occurrence = _aware(occurrence, "occurrence")
        cron = entry.cron
        with translate_errors("cron"):
            async with self._pool.acquire() as conn, conn.transaction():
                advanced = await conn.fetchval(
                    Q.cron_advance.sql, cron.id, entry.definition, cron.job_name, occurrence
                )
                if advanced is None:
                    row = await conn.fetchrow(Q.cron_get.sql, cron.id)
                    return self._refused(entry, occurrence, row)
                job_id = await self._queue.enqueue(
                    cron.job_name,
                    cron.payload,
                    options=cron.enqueue_options_for(occurrence),
                    connection=conn,
                )
                inserted = await conn.fetchval(Q.cron_record_job.sql, cron.id, job_id)
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

    def _refused(self, entry: _Entry, occurrence: datetime, row: Any) -> Outcome:
        if row is None:
            entry.last = None
            return Outcome.MISSING
        stored: datetime = row["last_occurrence"]
        entry.last = max(occurrence, stored)
        if row["definition"] != entry.definition or row["job_name"] != entry.cron.job_name:
            self._superseded(entry, row)
            return Outcome.SUPERSEDED
        log.debug(
            "cron %s: occurrence %s was already enqueued by another worker",
            entry.cron.id,
            occurrence.isoformat(),
        )
        return Outcome.TAKEN
