"""Retry delays: exponential with a cap and jitter. Pure functions of their inputs."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable


def retry_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    jitter: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based).

    ``base * 2 ** (attempt - 1)``, capped at ``cap``, plus a random fraction of up
    to ``jitter`` of that delay, so jobs that failed together do not return together.
    """
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    # Cap the exponent first: 2 ** 1000 would overflow a float multiplication.
    exponent = min(attempt - 1, 62)
    delay = min(cap, base * float(2**exponent))
    return delay + delay * jitter * rand()


#: Snoozes a job may take before it fails, unless its handler's policy says otherwise.
DEFAULT_MAX_SNOOZES = 100


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a handler's failures are retried (``Registry.job(..., retry=...)``).

    What decides, first match wins:

    1. :class:`pgfleet.PermanentError` (and a payload that does not decode) fails
       the job at once, whatever the policy.
    2. An exception matching ``give_up_on`` fails the job at once.
    3. When ``retry_on`` is given, an exception matching none of it fails the job
       at once.
    4. Otherwise the job is retried while it has attempts left: the smaller of the
       job's own ``max_attempts`` (set at enqueue, default 25; the limit the
       database also applies to jobs whose worker died) and this policy's
       ``max_attempts``. The stricter limit wins.

    ``backoff(attempt)`` (1-based: the attempt that just failed) gives the delay in
    seconds before the next one; without it the worker's backoff settings apply.
    ``max_snoozes`` caps :class:`pgfleet.Snooze` (default 100): past it the job fails.
    """

    max_attempts: int | None = None
    backoff: Callable[[int], float] | None = None
    retry_on: tuple[type[BaseException], ...] = ()
    give_up_on: tuple[type[BaseException], ...] = ()
    max_snoozes: int = DEFAULT_MAX_SNOOZES

    def __post_init__(self) -> None:
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or not 1 <= self.max_attempts <= 1000
        ):
            raise ValueError(
                f"max_attempts must be an integer from 1 to 1000, got {self.max_attempts!r}"
            )
        if self.backoff is not None and not callable(self.backoff):
            raise ValueError("backoff must be a callable taking the attempt number")
        for what in ("retry_on", "give_up_on"):
            value = getattr(self, what)
            if isinstance(value, type):
                value = (value,)
                object.__setattr__(self, what, value)
            if not all(isinstance(t, type) and issubclass(t, BaseException) for t in value):
                raise ValueError(f"{what} must be a tuple of exception classes")
        if (
            isinstance(self.max_snoozes, bool)
            or not isinstance(self.max_snoozes, int)
            or self.max_snoozes < 0
        ):
            raise ValueError(
                f"max_snoozes must be a non-negative integer, got {self.max_snoozes!r}"
            )

    def gives_up(self, error: BaseException) -> bool:
        """True when ``error`` ends the job at once (rules 2 and 3)."""
        if self.give_up_on and isinstance(error, self.give_up_on):
            return True
        return bool(self.retry_on) and not isinstance(error, self.retry_on)

    def attempts(self, job_max_attempts: int) -> int:
        """The attempts the job may use (rule 4)."""
        if self.max_attempts is None:
            return job_max_attempts
        return min(job_max_attempts, self.max_attempts)
