"""The claim loop's planner: what each turn does, from plain state."""

from __future__ import annotations

import pytest

from pgfleet._runtime import claim_planner as planner
from pgfleet._runtime.claim_planner import LoopState, Step, Turn

QUIET = LoopState(
    stopping=False,
    pending=0,
    unmarked=False,
    running=0,
    wanted=4,
    start=4,
    idle=False,
    deferred=False,
    connected=True,
    held_wait=None,
    poll=1.5,
)


def test_free_slots_send_a_round_that_claims_what_they_want() -> None:
    assert planner.plan(QUIET) == Turn(Step.SEND, limit=4, start=4)


def test_finished_outcomes_are_sent_even_when_no_slot_wants_a_job() -> None:
    state = QUIET._replace(pending=3, wanted=0, start=0, running=4)
    assert planner.plan(state) == Turn(Step.SEND, limit=0, start=0)


def test_held_jobs_started_since_the_last_round_are_marked_by_a_round() -> None:
    state = QUIET._replace(unmarked=True, wanted=0, start=0, running=4)
    assert planner.plan(state).step is Step.SEND


def test_busy_slots_wait_until_woken_or_the_oldest_held_job_is_due_back() -> None:
    state = QUIET._replace(wanted=0, start=0, running=4, held_wait=0.25)
    assert planner.plan(state) == Turn(Step.WAIT, wake_within=0.25)
    assert planner.plan(state._replace(held_wait=None)) == Turn(Step.WAIT, wake_within=None)


def test_after_a_round_that_found_too_few_jobs_the_loop_polls() -> None:
    assert planner.plan(QUIET._replace(idle=True)) == Turn(Step.POLL, wake_within=1.5)


def test_an_idle_loop_with_outcomes_sends_them_at_once() -> None:
    assert planner.plan(QUIET._replace(idle=True, pending=1)).step is Step.SEND


def test_a_deferred_answer_with_outcomes_behind_it_is_pipelined() -> None:
    state = QUIET._replace(deferred=True, pending=2, wanted=1, start=1)
    assert planner.plan(state) == Turn(Step.SEND, limit=1, start=1, pipelined=True)


@pytest.mark.parametrize(
    "change",
    [
        {"pending": 0},  # nothing to send ahead of it
        {"connected": False},  # no connection to send it on
        {"stopping": True, "wanted": 0, "start": 0},  # the drain: settle, hand back
    ],
)
def test_a_deferred_answer_is_settled_first_when_nothing_can_go_out_ahead_of_it(
    change: dict[str, object],
) -> None:
    state = QUIET._replace(**{"deferred": True, "pending": 2, **change})  # type: ignore[arg-type]
    assert planner.plan(state) is planner.SETTLE


def test_stopping_returns_once_nothing_runs_and_nothing_is_left_to_write() -> None:
    stopping = QUIET._replace(stopping=True, wanted=0, start=0)
    assert planner.plan(stopping) is planner.STOP
    assert planner.plan(stopping._replace(pending=1)) == Turn(Step.SEND)
    assert planner.plan(stopping._replace(running=1)).step is Step.WAIT


def test_an_answer_waits_for_the_next_round_only_when_outcomes_are_behind_it() -> None:
    assert planner.defers(stopping=False, pending=1, unmarked=False)
    assert planner.defers(stopping=False, pending=0, unmarked=True)
    assert not planner.defers(stopping=False, pending=0, unmarked=False)
    assert not planner.defers(stopping=True, pending=1, unmarked=True)


def test_a_burst_ends_when_a_round_leaves_slots_free_and_nothing_is_left() -> None:
    done = {"burst": True, "idle": True, "running": 0, "held": 0, "pending": 0}
    assert planner.burst_finished(**done)  # type: ignore[arg-type]
    for key, value in [("burst", False), ("idle", False), ("running", 1), ("held", 1)]:
        assert not planner.burst_finished(**{**done, key: value})  # type: ignore[arg-type]
    assert not planner.burst_finished(**{**done, "pending": 1})  # type: ignore[arg-type]


def test_backoff_doubles_from_a_twentieth_of_a_second_up_to_thirty() -> None:
    assert [planner.backoff(n) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert planner.backoff(9) == 25.6 and planner.backoff(10) == 30.0
    assert planner.backoff(1000) == planner.MAX_BACKOFF


def test_a_connection_that_was_working_is_replaced_at_once_an_unreachable_one_backs_off() -> None:
    assert planner.outage_backoff(reached=True, unreachable=0) == planner.BACKOFF_STEP
    assert planner.outage_backoff(reached=False, unreachable=3) == 0.4


def test_health_says_why_the_loop_does_not_reach_the_database() -> None:
    assert planner.health(failures=0, waited=None, timeout=30) is None
    assert planner.health(failures=0, waited=9.0, timeout=30) is None
    assert planner.health(failures=0, waited=11.0, timeout=30) == (
        "claim round waiting for the database for 11s"
    )
    assert planner.health(failures=0, waited=1.5, timeout=1) == (
        "claim round waiting for the database for 2s"
    )
    assert planner.health(failures=2, waited=None, timeout=30) == (
        "claim loop cannot reach the database (2 failed rounds)"
    )


def test_a_refused_round_is_logged_with_outcomes_and_otherwise_once_in_a_hundred() -> None:
    assert planner.should_log_refusal(outcomes=1, refused=7)
    assert [n for n in range(1, 301) if planner.should_log_refusal(outcomes=0, refused=n)] == [
        1,
        100,
        200,
        300,
    ]
