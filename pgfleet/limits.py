"""Flow control's value types and checks: limits per job name, pauses. No I/O here.

A limit is stored in the database (``pgfleet.limits``), so every worker of the
fleet obeys the same numbers and an operator can change them at run time
(:meth:`pgfleet.Queue.set_limits`). The claim reads them in every round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from pgfleet.errors import InvalidOptions
from pgfleet.jobs import validate_name

__all__ = ["MAX_LIMIT", "MAX_PER_SECONDS", "MIN_PER_SECONDS", "Limit", "LimitSpec", "Paused"]

#: The largest concurrency or rate accepted (the schema's CHECK says the same).
MAX_LIMIT = 1_000_000
#: A rate's window: from a millisecond to a day.
MIN_PER_SECONDS = 0.001
MAX_PER_SECONDS = 86_400.0


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """Checked limit values for one job name (at least one of concurrency and rate).

    ``concurrency``: at most this many of the name running at once (held-ahead
    jobs included); ``rate`` per ``per`` seconds: at most this many attempts
    started in any window of that length; ``per_key``: each limit applies to
    each ``limit_key`` of the name on its own."""

    concurrency: int | None
    rate: int | None
    per: float
    per_key: bool

    @classmethod
    def check(
        cls,
        *,
        concurrency: object = None,
        rate: object = None,
        per: object = 1.0,
        per_key: object = False,
        where: str = "",
    ) -> LimitSpec:
        prefix = f"{where}: " if where else ""
        for label, value in (("concurrency", concurrency), ("rate", rate)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidOptions(
                    f"{prefix}{label} must be a whole number from 1 to {MAX_LIMIT}, got {value!r}"
                )
            if not 1 <= value <= MAX_LIMIT:
                raise InvalidOptions(
                    f"{prefix}{label} must be from 1 to {MAX_LIMIT}, got {value!r}"
                )
        if concurrency is None and rate is None:
            raise InvalidOptions(
                f"{prefix}give concurrency, rate or both (clear_limits removes a limit)"
            )
        seconds = per.total_seconds() if isinstance(per, timedelta) else per
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise InvalidOptions(f"{prefix}per must be seconds or a timedelta, got {per!r}")
        if not math.isfinite(seconds) or not MIN_PER_SECONDS <= seconds <= MAX_PER_SECONDS:
            raise InvalidOptions(
                f"{prefix}per must be from {MIN_PER_SECONDS} s to {MAX_PER_SECONDS:.0f} s "
                f"(a day), got {per!r}"
            )
        if not isinstance(per_key, bool):
            raise InvalidOptions(f"{prefix}per_key must be True or False, got {per_key!r}")
        return cls(
            concurrency=concurrency,  # type: ignore[arg-type]  # checked above
            rate=rate,  # type: ignore[arg-type]
            per=float(seconds),
            per_key=per_key,
        )


@dataclass(frozen=True, slots=True)
class Limit:
    """A job name's stored flow control, as :meth:`pgfleet.Queue.limits` reads it.

    ``source`` is ``"operator"`` (set through the API, CLI or console: code
    defaults never overwrite it) or ``"code"`` (a ``Registry.job`` default a worker
    wrote). ``paused_at`` is set while the name is paused."""

    name: str
    concurrency: int | None
    rate: int | None
    per: float
    per_key: bool
    source: str
    paused_at: datetime | None
    updated_at: datetime

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


@dataclass(frozen=True, slots=True)
class Paused:
    """A paused job name (``kind == "name"``) or named queue (``kind == "queue"``)."""

    kind: str
    name: str
    paused_at: datetime


def check_target(name: object, queue_name: object) -> tuple[str, str]:
    """``(kind, name)`` of a pause or resume: exactly one of a job name and a queue."""
    if (name is None) == (queue_name is None):
        raise InvalidOptions("give a job name or queue_name=..., not both and not neither")
    if name is not None:
        return "name", validate_name(name)
    return "queue", validate_name(queue_name, "queue name")
