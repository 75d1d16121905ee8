"""Handler execution: one task per claimed job, async handlers on the event loop
and sync ones in the worker's threads, each under its timeout, every task ending
in exactly one Outcome handed to ``on_outcome``."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pgfleet import context
from pgfleet._runtime import tracing
from pgfleet._runtime.outcomes import Outcome
from pgfleet.backoff import DEFAULT_MAX_SNOOZES, RetryPolicy, retry_delay
from pgfleet.errors import PayloadError, PermanentError, Snooze
from pgfleet.events import WorkerEvents
from pgfleet.jobs import MAX_DELAY_SECONDS, Job
from pgfleet.payloads import describe_error, encode_result, storable_text
from pgfleet.registry import Handler, Registry

log = logging.getLogger("pgfleet")

#: Longest error text stored with an attempt.
MAX_ERROR_LENGTH = 4000
#: After the grace period, how long cancelled handlers get to unwind.
CANCEL_WAIT = 5.0
#: Jobs with the same timeout started within this many seconds share one timer:
#: it fires this much after the first one's timeout at most (a timer per job
#: cost a fifth of the worker's CPU per no-op job).
DEADLINE_SLACK = 0.005


class _Deadline:
    """One timer for the jobs started within ``DEADLINE_SLACK`` of each other that
    share a timeout. Cancels the tasks still running when it fires (at ``at``, a
    ``loop.time()``, never before any of its jobs' timeout); ``fired`` tells them
    apart from a shutdown's cancel."""

    __slots__ = ("at", "fired", "handle", "runner", "tasks", "timeout")

    def __init__(self, runner: JobRunner, timeout: float, at: float) -> None:
        self.runner = runner
        self.timeout = timeout
        self.at = at
        self.fired = False
        self.handle: asyncio.TimerHandle | None = None
        self.tasks: dict[uuid.UUID, asyncio.Task[Outcome]] = {}

    def expire(self) -> None:
        self.fired = True
        for job_id, task in list(self.tasks.items()):
            self.runner.cancel_task(job_id, task)

    def finished(self, job_id: uuid.UUID, open_: bool) -> None:
        """``job_id`` is done; ``open_``: jobs may still join (keep the timer)."""
        self.tasks.pop(job_id, None)
        if not self.tasks and not open_ and self.handle is not None:
            self.handle.cancel()
            self.handle = None


class JobRunner:
    """Runs the handlers of ``registry``; ``on_outcome`` receives each attempt's
    outcome (on the event loop, from the task's done callback)."""

    def __init__(
        self,
        registry: Registry,
        *,
        concurrency: int,
        default_timeout: float | None,
        backoff_base: float,
        backoff_cap: float,
        backoff_jitter: float,
        events: WorkerEvents,
        on_outcome: Callable[[Outcome], None],
        prefetch: int = 0,
        prefetch_window: float = 0.0,
    ) -> None:
        self._registry = registry
        self._concurrency = concurrency
        self._prefetch = prefetch
        self._window = prefetch_window
        #: Jobs claimed ahead of a free slot, oldest first, with when each was
        #: claimed (time.monotonic()); started as slots free up.
        self._held: collections.deque[tuple[Job, float]] = collections.deque()
        #: When each job started from ``_held`` was claimed: its pickup delay
        #: includes the wait.
        self._held_since: dict[uuid.UUID, float] = {}
        #: Held jobs started since the last claim round took them (take_started).
        self._unmarked: set[uuid.UUID] = set()
        #: Moving average of handler durations (None until one finishes): how
        #: much work a held job stands for.
        self._mean_duration: float | None = None
        self._default_timeout = default_timeout
        self._backoff = (backoff_base, backoff_cap, backoff_jitter)
        self.events = events
        self._on_outcome = on_outcome
        #: The tasks of the handlers now running, by job id.
        self.running: dict[uuid.UUID, asyncio.Task[Outcome]] = {}
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self.state: context.WorkerState | None = None
        #: Jobs whose handler task the cancel watcher cancelled (after their
        #: cancel grace period): their CancelledError ends them cancelled.
        self.cancelling: set[uuid.UUID] = set()
        #: Jobs whose sync handler is running in a thread (cannot be cancelled).
        self.in_threads: set[uuid.UUID] = set()
        #: The deadline jobs with each timeout join (see DEADLINE_SLACK).
        self._deadlines: dict[float, _Deadline] = {}
        #: Each running job and its deadline, for a task cancelled before its first
        #: step (it never runs ``_run``, which reports the others).
        self._launched: dict[uuid.UUID, tuple[Job, _Deadline | None]] = {}
        #: Whether INFO is on for the jobs of the latest round (checked once a round).
        self._info = True
        #: The tracer for the jobs of the latest round (None: no provider installed).
        self._tracer: Any = None
        #: The context each job's task starts from a copy of (see ``launch``).
        self._base = contextvars.copy_context()

    @property
    def free(self) -> int:
        return self._concurrency - len(self.running)

    @property
    def held(self) -> int:
        """Jobs claimed ahead, waiting for a slot."""
        return len(self._held)

    def held_ids(self) -> list[uuid.UUID]:
        return [job.id for job, _ in self._held]

    def ahead(self) -> int:
        """How many jobs to hold beyond the slots: at most ``prefetch``, and only
        as many as the slots should start within ``prefetch_window`` at the
        handlers' recent pace. Nothing before the first handler has finished."""
        mean = self._mean_duration
        if not self._prefetch or mean is None:
            return 0
        if mean <= 0:
            return self._prefetch
        return min(self._prefetch, int(self._window * self._concurrency / mean))

    def wanted(self, refill: bool, arriving: int = 0) -> tuple[int, int]:
        """How many jobs the next claim round should take, and how many of them
        start at once: one per slot that nothing fills, plus enough to bring the
        jobs held ahead back to ``ahead()``, topped up only once they are half
        gone and ``refill`` (a slot just came free: handlers finish), so that
        slots busy with long handlers never collect a backlog of held jobs.
        ``arriving``: jobs a round has claimed that are not launched yet."""
        idle = self._concurrency - len(self.running) - len(self._held) - arriving
        ahead = self.ahead()
        if idle > 0:
            return idle + ahead, idle
        if refill and -idle <= ahead // 2:
            return ahead + idle, 0
        return 0, 0

    def take_held(self, claimed_before: float | None = None) -> list[Job]:
        """Give up the held jobs (all, or those claimed before ``claimed_before``,
        ``time.monotonic()``) so that they can be handed back unstarted."""
        held = self._held
        taken: list[Job] = []
        while held and (claimed_before is None or held[0][1] < claimed_before):
            taken.append(held.popleft()[0])
        return taken

    def held_wait(self, hold: float) -> float | None:
        """Seconds until the oldest held job has waited ``hold`` seconds."""
        if not self._held:
            return None
        return max(0.0, self._held[0][1] + hold - time.monotonic())

    def launch(self, jobs: Sequence[Job], ahead: Sequence[Job] = ()) -> None:
        """Start a task for each job (the claim only takes names we serve): first
        ``jobs``, claimed to start now, then ``ahead``, claimed to be held; what
        finds no free slot is held until slots free up."""
        # Every job's task starts from a copy of the context of the loop that
        # launches jobs, also when a finished job's own task starts the next one:
        # what a handler set in its context never reaches another job.
        self._base = contextvars.copy_context()
        # Once a round, not per job: a refill starts one job at a time.
        self._tracer = tracing.current_tracer()
        self._info = log.isEnabledFor(logging.INFO)
        free = max(self.free, 0)
        if len(jobs) > free:  # only if the claim raced a refill: rare
            self._hold(jobs[free:])
            jobs = jobs[:free]
        free -= len(jobs)
        if ahead:
            if free:
                claimed = time.monotonic()
                jobs = [*jobs, *self._leave_hold((job, claimed) for job in ahead[:free])]
                ahead = ahead[free:]
            self._hold(ahead)
        if jobs:
            self._start(jobs)

    def _hold(self, jobs: Iterable[Job]) -> None:
        now = time.monotonic()
        self._held.extend((job, now) for job in jobs)

    @property
    def unmarked(self) -> bool:
        """Held jobs have started that no round has marked started yet."""
        return bool(self._unmarked)

    def take_started(self) -> list[uuid.UUID]:
        """The held jobs started since the last call, still running: the next
        round marks them started, so that a rescue counts their attempt."""
        if not self._unmarked:
            return []
        started = list(self._unmarked)
        self._unmarked.clear()
        return started

    def restore_started(self, started: Iterable[uuid.UUID]) -> None:
        """The round that carried them failed: mark them with the next one."""
        running = self.running
        self._unmarked.update(i for i in started if i in running)

    def _leave_hold(self, entries: Iterable[tuple[Job, float]]) -> list[Job]:
        """Jobs claimed to be held that start now: their claim left started_at
        empty, so once their handler runs the next round marks them (or their
        outcome carries the start)."""
        since = self._held_since
        jobs = []
        for job, claimed in entries:
            since[job.id] = claimed
            jobs.append(job)
        return jobs

    def _refill(self) -> None:
        count = min(self.free, len(self._held))
        if count > 0:
            held = self._held
            self._start(self._leave_hold(held.popleft() for _ in range(count)))

    def _deadline(self, timeout: float, now: float, loop: asyncio.AbstractEventLoop) -> _Deadline:
        """The timer a job started ``now`` with ``timeout`` joins: the open one while
        it fires no earlier than this job's timeout and at most DEADLINE_SLACK
        later, else a new one (the old one's timer goes once its jobs are done)."""
        deadline = self._deadlines.get(timeout)
        if deadline is not None and now + timeout <= deadline.at:
            return deadline
        if deadline is not None and not deadline.tasks and deadline.handle is not None:
            deadline.handle.cancel()
            deadline.handle = None
        deadline = _Deadline(self, timeout, now + timeout + DEADLINE_SLACK)
        self._deadlines[timeout] = deadline
        deadline.handle = loop.call_at(deadline.at, deadline.expire)
        return deadline

    def _start(self, jobs: Iterable[Job]) -> None:
        """One task per job. Its outcome is reported by the task itself as it ends
        (``_finish``), in the same step: no done callback and no loop turn between
        a handler's end, its outcome and the start of the next held job."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        tracer = self._tracer
        registry = self._registry
        running = self.running
        launched = self._launched
        base = self._base
        for job in jobs:
            handler = registry.get(job.name)
            assert handler is not None
            timeout = handler.timeout if handler.timeout is not None else self._default_timeout
            deadline = None if timeout is None else self._deadline(timeout, now, loop)
            task = loop.create_task(
                self._run(handler, job, tracer, timeout, deadline), context=base.copy()
            )
            running[job.id] = task
            launched[job.id] = (job, deadline)
            if deadline is not None:
                deadline.tasks[job.id] = task

    def cancel_task(self, job_id: uuid.UUID, task: asyncio.Task[Any]) -> None:
        """Cancel a job's task. One cancelled before its first step never runs
        ``_run``, so never reports: its job is then handed back, not counted."""
        task.cancel()
        task.add_done_callback(functools.partial(self._unstarted, job_id))

    def _unstarted(self, job_id: uuid.UUID, task: asyncio.Task[Any]) -> None:
        if self.running.get(job_id) is task:  # else it ran and reported
            job, deadline = self._launched[job_id]
            self._finish(job, deadline, Outcome.aborted(job))

    def _finish(self, job: Job, deadline: _Deadline | None, outcome: Outcome) -> None:
        """Report a job's outcome (from its task's last step), and start the next
        held job in the freed slot at once."""
        self.running.pop(job.id, None)
        self._launched.pop(job.id, None)
        if deadline is not None:
            deadline.finished(job.id, self._deadlines.get(deadline.timeout) is deadline)
        if self._held_since:
            self._held_since.pop(job.id, None)
        if self._unmarked:
            self._unmarked.discard(job.id)  # its outcome says more than a mark
        state = self.state
        if state is not None and state.cancelled:
            state.cancelled.discard(job.id)
            self.cancelling.discard(job.id)
        if outcome.action != "aborted":
            mean = self._mean_duration
            d = outcome.duration
            self._mean_duration = d if mean is None else mean + 0.1 * (d - mean)
        self._on_outcome(outcome)
        held = self._held
        if held and len(self.running) < self._concurrency:
            # The slot this job freed, as a rule the only one: its next job starts
            # here, without the batch refill's generator and list per job.
            entry = held.popleft()
            self._held_since[entry[0].id] = entry[1]
            self._start((entry[0],))
            if held and len(self.running) < self._concurrency:
                self._refill()  # more slots free (a cancel, a shrunk hold): rare

    async def drain(self, grace: float) -> None:
        """Give running handlers ``grace`` seconds, then cancel the rest (their
        jobs are handed back) and wait a little for them to unwind."""
        if not self.running:
            return
        pending: set[asyncio.Task[Outcome]] = set(self.running.values())
        if grace > 0:
            _, pending = await asyncio.wait(pending, timeout=grace)
        if not pending:
            return
        log.info("cancelling %d handlers still running after the grace period", len(pending))
        ids = {task: job_id for job_id, task in self.running.items()}
        for task in pending:
            job_id = ids.get(task)
            if job_id is None:
                task.cancel()
            else:
                self.cancel_task(job_id, task)
        _, stuck = await asyncio.wait(pending, timeout=CANCEL_WAIT)
        if stuck:
            log.error("%d handlers ignored cancellation; their jobs will be recovered", len(stuck))
            self.running = {k: v for k, v in self.running.items() if v not in stuck}

    def close(self) -> None:
        for deadline in self._deadlines.values():
            if deadline.handle is not None and not deadline.tasks:
                deadline.handle.cancel()
        self._deadlines.clear()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ one job

    async def _run(
        self,
        handler: Handler,
        job: Job,
        tracer: Any,
        timeout: float | None,
        deadline: _Deadline | None,
    ) -> Outcome:
        """The job's task: runs the attempt and reports its outcome as it ends."""
        start = time.perf_counter()
        try:
            outcome = await self._begin(handler, job, tracer, timeout, deadline, start)
        except BaseException as exc:  # never let a job task die without an outcome
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("internal error running job %s", job.id)
            outcome = Outcome.aborted(job, time.perf_counter() - start)
        try:
            self._finish(job, deadline, outcome)
        except Exception:
            log.exception("internal error reporting the outcome of job %s", job.id)
        return outcome

    async def _begin(
        self,
        handler: Handler,
        job: Job,
        tracer: Any,
        timeout: float | None,
        deadline: _Deadline | None,
        start: float,
    ) -> Outcome:
        assert self.state is not None
        context.enter_job(self.state, job)
        if self._info:
            log.info(
                "job started: %s %s attempt %d/%d%s",
                job.name,
                job.id,
                job.attempt,
                job.max_attempts,
                f" queue {job.queue_name}" if job.queue_name else "",
            )
        started = job.started_at
        pickup = (started - job.run_at).total_seconds() if started else 0.0
        claimed = self._held_since.pop(job.id, None) if self._held_since else None
        if claimed is not None:  # held ahead: its wait for a slot counts
            pickup += time.monotonic() - claimed
            # Marked from its first step, not its launch: a round sent before
            # the task first ran (the one right after the launch, as a rule)
            # would mark a job that a no-op handler finishes before the next.
            self._unmarked.add(job.id)
        if self.state.cancelled and job.id in self.state.cancelled:
            # Cancelled while held ahead: it never starts.
            log.info("job cancelled before it started: %s %s", job.name, job.id)
            outcome = Outcome(job, "cancelled", "cancelled", 0.0)
            if claimed is not None:
                outcome.started = start
            return outcome
        self.events.job_started(job, pickup)
        outcome = await self._attempt(handler, job, start, tracer, timeout, deadline)
        if claimed is not None:
            # The database may not know yet when it started: the outcome says.
            outcome.started = start
        return outcome

    async def _attempt(
        self,
        handler: Handler,
        job: Job,
        start: float,
        tracer: Any,
        timeout: float | None,
        deadline: _Deadline | None,
    ) -> Outcome:
        """Run the handler; its deadline cancels it when its timeout passes. A
        TimeoutError the handler raises itself is its own error, not its timeout."""
        error: BaseException | None = None
        snooze: Snooze | None = None
        timed_out = False
        value: Any = None
        try:
            payload = handler.decode(job.payload) if handler.takes_payload else None
            with tracing.NO_SPAN if tracer is None else tracing.span(tracer, job):
                try:
                    if handler.is_async:
                        value = await handler.call(job, payload)
                    else:
                        value = await self._run_in_thread(handler, job, payload)
                finally:
                    timed_out = deadline is not None and deadline.fired
        except asyncio.CancelledError:
            if not timed_out and job.id not in self.cancelling:
                log.info("job aborted at shutdown and requeued: %s %s", job.name, job.id)
                return Outcome.aborted(job, time.perf_counter() - start)
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            error = asyncio.CancelledError() if not timed_out else TimeoutError()
        except Snooze as exc:
            snooze = exc
        except Exception as exc:
            error = exc
        duration = time.perf_counter() - start
        state = self.state
        if state is not None and state.cancelled and job.id in state.cancelled:
            # Cancelled while it ran: whatever it returned or raised, the job ends
            # cancelled (a cancel that reaches the worker after the handler
            # returned finds it succeeded).
            log.info("job cancelled while running: %s %s", job.name, job.id)
            return Outcome(job, "cancelled", "cancelled", duration)
        if error is None and snooze is None:
            return _succeeded(job, value, duration, self._info)
        policy = handler.retry
        if snooze is not None:
            return _snoozed(job, snooze, policy, duration)
        assert error is not None
        return self._failed(handler, job, error, timed_out, timeout, duration)

    def _failed(
        self,
        handler: Handler,
        job: Job,
        error: BaseException,
        timed_out: bool,
        timeout: float | None,
        duration: float,
    ) -> Outcome:
        """The outcome of a handler that raised ``error`` (or timed out): retried,
        or failed for good, as the job's attempts and the handler's policy say."""
        policy = handler.retry
        if timed_out:
            message = f"TimeoutError: handler ran longer than its timeout of {timeout}s"
        else:
            message = describe_error(error, MAX_ERROR_LENGTH)
        if handler.infallible:
            log.warning(
                "infallible job %s %s raised (recorded as succeeded): %s",
                job.name,
                job.id,
                message,
                exc_info=error,
            )
            return Outcome(job, "succeeded", "succeeded", duration)
        limit = job.max_attempts if policy is None else policy.attempts(job.max_attempts)
        if (
            isinstance(error, PermanentError)
            or (policy is not None and policy.gives_up(error))
            or job.attempt >= limit
        ):
            log.error(
                "job failed permanently: %s %s attempt %d/%d: %s",
                job.name,
                job.id,
                job.attempt,
                limit,
                message,
                exc_info=error,
            )
            return Outcome(job, "failed", "failed", duration, error=message)
        delay = self._retry_delay(policy, job)
        log.warning(
            "job failed and will retry: %s %s attempt %d/%d in %.1fs: %s",
            job.name,
            job.id,
            job.attempt,
            limit,
            delay,
            message,
            exc_info=error,
        )
        return Outcome(job, "retry", "retried", duration, delay=delay, error=message)

    def _retry_delay(self, policy: RetryPolicy | None, job: Job) -> float:
        if policy is not None and policy.backoff is not None:
            try:
                delay = float(policy.backoff(job.attempt))
                if math.isfinite(delay) and 0 <= delay <= MAX_DELAY_SECONDS:
                    return delay
                raise ValueError(f"{delay!r} is not a delay in seconds")
            except Exception:
                log.exception(
                    "the retry policy's backoff of %s failed; the worker's backoff applies",
                    job.name,
                )
        base, cap, jitter = self._backoff
        return retry_delay(job.attempt, base=base, cap=cap, jitter=jitter)

    async def _run_in_thread(self, handler: Handler, job: Job, payload: Any) -> Any:
        """Run a sync handler in the worker's threads."""
        if self._threads is None:
            self._threads = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._concurrency, thread_name_prefix="pgfleet-job"
            )
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._threads, ctx.run, handler.call, job, payload)
        # The thread cannot be stopped: on timeout or shutdown its result is ignored.
        self.in_threads.add(job.id)
        try:
            return await future
        finally:
            self.in_threads.discard(job.id)


def _succeeded(job: Job, value: Any, duration: float, info: bool = True) -> Outcome:
    """The outcome of a handler that returned ``value``: succeeded with it as the
    result, or failed permanently when it cannot be stored."""
    result = None
    if value is not None:
        try:
            result = encode_result(value)
        except PayloadError as exc:
            message = storable_text(
                f"ResultError: handler {job.name!r} returned a value that cannot be "
                f"stored as the job's result (retrying cannot fix it): {exc}"
            )[:MAX_ERROR_LENGTH]
            log.error("job failed permanently: %s %s: %s", job.name, job.id, message)
            return Outcome(job, "failed", "failed", duration, error=message)
    if info:
        log.info("job succeeded: %s %s in %.1f ms", job.name, job.id, duration * 1000)
    return Outcome(job, "succeeded", "succeeded", duration, result=result)


def _snoozed(job: Job, snooze: Snooze, policy: RetryPolicy | None, duration: float) -> Outcome:
    """The outcome of a handler that raised :class:`Snooze`: back in line after its
    delay without using an attempt, or failed once it snoozed its limit."""
    cap = DEFAULT_MAX_SNOOZES if policy is None else policy.max_snoozes
    if job.snoozes < cap:
        log.info(
            "job snoozed: %s %s for %.1fs (snooze %d)",
            job.name,
            job.id,
            snooze.delay,
            job.snoozes + 1,
        )
        return Outcome(job, "snooze", "snoozed", duration, delay=snooze.delay)
    message = (
        f"Snooze: the {job.name!r} handler snoozed {job.snoozes} times, its limit "
        f"(RetryPolicy.max_snoozes={cap}); failed instead of snoozing again"
    )
    log.error("job failed permanently: %s %s: %s", job.name, job.id, message)
    return Outcome(job, "failed", "failed", duration, error=message)
