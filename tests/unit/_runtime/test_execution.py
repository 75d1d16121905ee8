"""The worker's hold (prefetch) in JobRunner, in process: which jobs leave it, and
what their outcomes tell the next claim round."""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import threading

from pgfleet import Job, Registry, context
from pgfleet._runtime.execution import JobRunner
from pgfleet._runtime.outcomes import Outcome
from pgfleet.events import WorkerEvents
from pgfleet.testing import make_job


def _runner(
    concurrency: int, outcomes: list[Outcome], registry: Registry | None = None
) -> JobRunner:
    registry = Registry() if registry is None else registry

    @registry.job("noop")
    async def noop(job: Job) -> None:
        return None

    runner = JobRunner(
        registry,
        concurrency=concurrency,
        default_timeout=None,
        backoff_base=1.0,
        backoff_cap=1.0,
        backoff_jitter=0.0,
        events=WorkerEvents(),
        on_outcome=outcomes.append,
        prefetch=8,
        prefetch_window=1.0,
    )
    runner.state = context.WorkerState(
        dt.datetime.now(dt.UTC), threading.Event(), asyncio.get_running_loop().create_future()
    )
    return runner


async def _settled(outcomes: list[Outcome], n: int) -> None:
    while len(outcomes) < n:
        await asyncio.sleep(0)


async def test_jobs_claimed_to_be_held_that_find_a_free_slot_carry_their_start() -> None:
    # The claim left their started_at empty: whether they start at once (a slot
    # came free while the round was out) or later from the hold, an outcome that
    # beats the next round's mark must say when the job started.
    outcomes: list[Outcome] = []
    runner = _runner(2, outcomes)
    direct, at_once, held = make_job("noop"), make_job("noop"), make_job("noop")
    runner.launch([direct], [at_once, held])
    assert runner.held == 1
    await _settled(outcomes, 3)
    started = {o.job.id: o.started for o in outcomes}
    assert started[direct.id] is None  # its claim recorded the start
    assert started[at_once.id] is not None
    assert started[held.id] is not None
    assert runner.held == 0 and not runner.unmarked  # finished: nothing left to mark


async def test_nothing_is_claimed_ahead_until_a_handler_has_set_the_pace() -> None:
    outcomes: list[Outcome] = []
    runner = _runner(1, outcomes)
    assert runner.wanted(refill=False) == (1, 1)  # no pace yet: no prefetch
    runner.launch([make_job("noop")])
    await _settled(outcomes, 1)
    assert runner.ahead() == 8  # no-op pace: the cap
    assert runner.wanted(refill=False) == (9, 1)


async def test_a_held_job_is_marked_started_once_its_handler_runs_not_at_its_launch() -> None:
    # The round sent right after a launch would otherwise mark jobs whose tasks have
    # not run yet, most of which finish before the next round: an update per job.
    outcomes: list[Outcome] = []
    registry = Registry()
    release = asyncio.Event()

    @registry.job("slow")
    async def slow(job: Job) -> None:
        await release.wait()

    runner = _runner(2, outcomes, registry)

    slow_job, noop_job = make_job("slow"), make_job("noop")
    runner.launch([], [slow_job, noop_job])
    assert runner.take_started() == []  # launched, not yet run
    await _settled(outcomes, 1)  # the no-op ran and finished: its outcome says it
    assert runner.take_started() == [slow_job.id]  # running: the next round marks it
    release.set()
    await _settled(outcomes, 2)
    assert not runner.unmarked


async def test_a_task_cancelled_before_its_first_step_reports_its_job_handed_back() -> None:
    # Each task reports its own outcome as it ends; one cancelled before its first
    # step never runs at all, so the cancel reports it (aborted: handed back).
    outcomes: list[Outcome] = []
    runner = _runner(2, outcomes)
    job = make_job("noop")
    runner.launch([job])
    runner.cancel_task(job.id, runner.running[job.id])
    await asyncio.wait_for(_settled(outcomes, 1), 5)
    await asyncio.sleep(0)
    assert [(o.job.id, o.action, o.label) for o in outcomes] == [(job.id, "aborted", "aborted")]
    assert runner.running == {}


async def test_a_finished_job_starts_the_next_held_one_in_the_same_step() -> None:
    # No loop turn between a handler's end, its outcome and the next held job's
    # start: the held job is started from the finished job's own task.
    outcomes: list[Outcome] = []
    runner = _runner(1, outcomes)
    first, held = make_job("noop"), make_job("noop")
    runner.launch([first], [held])
    first_task = runner.running[first.id]
    starts: list[asyncio.Task[object] | None] = []
    start = runner._start

    def spying(jobs: object) -> None:
        starts.append(asyncio.current_task())
        start(jobs)  # type: ignore[arg-type]

    runner._start = spying  # type: ignore[method-assign]
    await _settled(outcomes, 2)
    assert starts == [first_task]
    assert [o.job.id for o in outcomes] == [first.id, held.id]


async def test_jobs_with_one_timeout_started_close_together_share_one_timer() -> None:
    outcomes: list[Outcome] = []
    registry = Registry()
    gate = asyncio.Event()

    @registry.job("slow", timeout=30)
    async def slow(job: Job) -> None:
        await gate.wait()

    runner = _runner(4, outcomes, registry)
    a, b = make_job("slow"), make_job("slow")
    runner.launch([a])
    runner.launch([b])
    (deadline,) = runner._deadlines.values()
    assert set(deadline.tasks) == {a.id, b.id} and deadline.handle is not None
    gate.set()
    await _settled(outcomes, 2)
    assert [o.action for o in outcomes] == ["succeeded", "succeeded"]
    assert deadline.tasks == {}
    runner.close()
    assert runner._deadlines == {}


_SET_BY_A_HANDLER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "set_by_a_handler", default=None
)


async def test_what_a_handler_sets_in_its_context_never_reaches_the_next_job() -> None:
    # The next held job starts from the finished job's own task, but from a copy of
    # the launching loop's context, not of the finished handler's.
    outcomes: list[Outcome] = []
    registry = Registry()
    seen: list[str | None] = []

    @registry.job("leaky")
    async def leaky(job: Job) -> None:
        seen.append(_SET_BY_A_HANDLER.get())
        _SET_BY_A_HANDLER.set(str(job.id))

    runner = _runner(1, outcomes, registry)
    runner.launch([make_job("leaky")], [make_job("leaky"), make_job("leaky")])
    await _settled(outcomes, 3)
    assert seen == [None, None, None]
    assert _SET_BY_A_HANDLER.get() is None
