"""What the claim loop does next, decided from plain state: no I/O, no clock.

The loop (``claimer.py``) reads its state into a :class:`LoopState`, asks
:func:`plan` for the next :class:`Turn`, and carries it out. The other functions
decide what follows a round: whether its answer waits for the next round to go out
(:func:`defers`), whether a burst run is over, how long to back off."""

from __future__ import annotations

import enum
from typing import NamedTuple

#: The longest backoff after a failed or refused round, in seconds.
MAX_BACKOFF = 30.0
#: The first backoff step; it doubles with each failure, up to ``MAX_BACKOFF``.
BACKOFF_STEP = 0.05


class Step(enum.Enum):
    #: Settle the previous round's answer now (start its jobs, report its
    #: outcomes), then plan again: nothing will go out ahead of it.
    SETTLE = "settle"
    #: Return: stopping, nothing runs and nothing is left to write.
    STOP = "stop"
    #: Every slot is busy (or the hold is full): wait for a wake-up, forgetting
    #: those that came before, or until the oldest held job is due back.
    WAIT = "wait"
    #: The last round found fewer jobs than it asked for: wait for a wake-up,
    #: or the poll interval, before asking again.
    POLL = "poll"
    #: Send a round.
    SEND = "send"


class LoopState(NamedTuple):
    """What the planner needs to know, read from the loop and its executor (a
    tuple: the loop builds one or two per turn)."""

    #: The drain began: claim nothing more, write what is left.
    stopping: bool
    #: Outcomes waiting for a round.
    pending: int
    #: Held jobs started that no round has marked started yet.
    unmarked: bool
    #: Handlers running.
    running: int
    #: How many jobs the next round should claim, and start at once
    #: (``JobRunner.wanted``; both 0 while stopping).
    wanted: int
    start: int
    #: The last round claimed fewer jobs than it asked for.
    idle: bool
    #: A round's answer is not settled yet.
    deferred: bool
    #: The claim connection is open (held and not closed).
    connected: bool
    #: Seconds until the oldest held job has been held too long (None: none held).
    held_wait: float | None
    #: The poll interval, in seconds.
    poll: float


class Turn(NamedTuple):
    """One turn of the loop: what it does, and for a round what it sends."""

    step: Step
    #: SEND: jobs to claim, and how many of them start at once.
    limit: int = 0
    start: int = 0
    #: SEND: the round goes out before the previous answer is settled.
    pipelined: bool = False
    #: WAIT, POLL: wake by then at the latest (None: only when woken).
    wake_within: float | None = None


SETTLE = Turn(Step.SETTLE)
STOP = Turn(Step.STOP)


def plan(s: LoopState) -> Turn:
    """The next turn of the loop, from its state."""
    has_work = s.pending > 0 or s.unmarked
    if s.deferred and (s.stopping or not has_work or not s.connected):
        # Nothing to send ahead of it (or no connection to send it on).
        return SETTLE
    if s.stopping and not s.running and not s.pending:
        return STOP
    if not has_work:
        if s.wanted == 0:
            return Turn(Step.WAIT, wake_within=s.held_wait)
        if s.idle:
            return Turn(Step.POLL, wake_within=s.poll)
    return Turn(Step.SEND, limit=s.wanted, start=s.start, pipelined=s.deferred)


def defers(*, stopping: bool, pending: int, unmarked: bool) -> bool:
    """Whether a round's answer waits for the next round to go out: handlers
    finished while it was out, so theirs are sent first and its jobs start while
    the next round is in flight (the database does not wait for the client)."""
    return not stopping and (pending > 0 or unmarked)


def burst_finished(*, burst: bool, idle: bool, running: int, held: int, pending: int) -> bool:
    """A burst run is over once a round leaves slots free and nothing runs, is
    held or waits to be written."""
    return burst and idle and not running and not held and not pending


def backoff(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failure in a row."""
    return min(MAX_BACKOFF, BACKOFF_STEP * 2.0 ** min(failures, 10))


def outage_backoff(*, reached: bool, unreachable: int) -> float:
    """Seconds to wait after a lost round. A connection that was working and then
    closed (``reached``: a server restart, pg_terminate_backend, a pooler
    recycling it) is replaced at once; the backoff grows only while the database
    cannot be reached at all (``unreachable`` rounds in a row, this one counted)."""
    return BACKOFF_STEP if reached else backoff(unreachable)


def health(*, failures: int, waited: float | None, timeout: float) -> str | None:
    """None while the loop reaches the database, else why it does not.
    ``waited``: seconds the current round has been out (None between rounds)."""
    if failures:
        return f"claim loop cannot reach the database ({failures} failed rounds)"
    if waited is not None and waited > max(timeout / 3, 1.0):
        return f"claim round waiting for the database for {waited:.0f}s"
    return None


def should_log_refusal(*, outcomes: int, refused: int) -> bool:
    """A refused round is logged when it carried outcomes, and otherwise the first
    time and every hundredth."""
    return bool(outcomes) or refused == 1 or refused % 100 == 0
