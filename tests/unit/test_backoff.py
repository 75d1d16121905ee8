"""Retry delays: the doubling schedule, the cap, and the jitter bounds."""

from __future__ import annotations

import pytest

from pgfleet import RetryPolicy
from pgfleet.backoff import retry_delay


@pytest.mark.parametrize(
    ("base", "cap", "expected"),
    [
        (15, 10_000, [15, 30, 60, 120, 240, 480]),
        (5, 10_000, [5, 10, 20, 40, 80, 160]),
        (1, 10, [1, 2, 4, 8, 10, 10]),
        (0.5, 3600, [0.5, 1, 2, 4, 8, 16]),
    ],
)
def test_schedule_without_jitter(base: float, cap: float, expected: list[float]) -> None:
    got = [retry_delay(a, base=base, cap=cap, jitter=0) for a in range(1, 7)]
    assert got == expected


def test_a_fifteen_second_base_rides_out_a_sixteen_minute_outage() -> None:
    # 15, 30, 60, 120, 240, 480 s: six retries span 945 s, so an outage of up to
    # almost sixteen minutes is absorbed by retries instead of failing the job.
    total = sum(retry_delay(a, base=15, cap=10_000, jitter=0) for a in range(1, 7))
    assert total == 945


@pytest.mark.parametrize("r", [0.0, 0.5, 0.999999])
def test_jitter_adds_up_to_its_fraction(r: float) -> None:
    delay = retry_delay(3, base=10, cap=1000, jitter=0.2, rand=lambda: r)
    assert delay == pytest.approx(40 + 40 * 0.2 * r)
    assert 40 <= delay < 48


def test_huge_attempts_stay_capped() -> None:
    assert retry_delay(1000, base=1, cap=3600, jitter=0) == 3600


def test_attempt_must_be_positive() -> None:
    with pytest.raises(ValueError, match="attempt must be >= 1"):
        retry_delay(0, base=1, cap=1, jitter=0)


# ---------------------------------------------------------------- retry policies


def test_a_policys_give_up_on_beats_its_retry_on() -> None:
    policy = RetryPolicy(retry_on=(OSError,), give_up_on=(ConnectionRefusedError,))
    assert not policy.gives_up(TimeoutError())  # an OSError
    assert policy.gives_up(ConnectionRefusedError())  # an OSError too, but given up on
    assert policy.gives_up(ValueError())  # not in retry_on


def test_the_stricter_max_attempts_of_job_and_policy_applies() -> None:
    assert RetryPolicy(max_attempts=10).attempts(25) == 10
    assert RetryPolicy(max_attempts=10).attempts(3) == 3
    assert RetryPolicy().attempts(7) == 7


def test_a_single_exception_class_is_taken_as_a_tuple() -> None:
    assert RetryPolicy(retry_on=TimeoutError).retry_on == (TimeoutError,)  # type: ignore[arg-type]
