"""Retry delays: exponential with a cap and jitter. Pure functions of their inputs."""

from __future__ import annotations

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
