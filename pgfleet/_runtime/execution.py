"""Handler execution: one task per claimed job, async handlers on the event loop
and sync ones in the worker's threads, each under its timeout, every task ending
in exactly one Outcome handed to ``on_outcome``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from pgfleet import context
from pgfleet._runtime import tracing
from pgfleet._runtime.outcomes import Outcome
from pgfleet.backoff import retry_delay
from pgfleet.errors import PermanentError
from pgfleet.events import WorkerEvents
from pgfleet.jobs import Job
from pgfleet.payloads import describe_error
from pgfleet.registry import Handler, Registry

log = logging.getLogger("pgfleet")

#: Longest error text stored with an attempt.
MAX_ERROR_LENGTH = 4000
#: After the grace period, how long cancelled handlers get to unwind.
CANCEL_WAIT = 5.0


class _Deadline:
    """One timer for the jobs of a claim round that share a timeout (a timer per
    job cost a fifth of the worker's CPU per no-op job). Cancels the tasks still
    running when it fires; ``fired`` tells them apart from a shutdown's cancel."""

    __slots__ = ("fired", "handle", "tasks")

    def __init__(self) -> None:
        self.fired = False
        self.handle: asyncio.TimerHandle | None = None
        self.tasks: dict[uuid.UUID, asyncio.Task[Outcome]] = {}

    def expire(self) -> None:
        self.fired = True
        for task in list(self.tasks.values()):
            task.cancel()

    def finished(self, job_id: uuid.UUID) -> None:
        self.tasks.pop(job_id, None)
        if not self.tasks and self.handle is not None:
            self.handle.cancel()


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
    ) -> None:
        self._registry = registry
        self._concurrency = concurrency
        self._default_timeout = default_timeout
        self._backoff = (backoff_base, backoff_cap, backoff_jitter)
        self.events = events
        self._on_outcome = on_outcome
        #: The tasks of the handlers now running, by job id.
        self.running: dict[uuid.UUID, asyncio.Task[Outcome]] = {}
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self.state: context.WorkerState | None = None

    @property
    def free(self) -> int:
        return self._concurrency - len(self.running)

    def launch(self, jobs: Iterable[Job]) -> None:
        """Start a task for each job (the claim only takes names we serve)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        tracer = tracing.current_tracer()  # once per round, not per job
        deadlines: dict[float, _Deadline] = {}
        for job in jobs:
            handler = self._registry.get(job.name)
            assert handler is not None
            timeout = handler.timeout if handler.timeout is not None else self._default_timeout
            deadline = None
            if timeout is not None:
                deadline = deadlines.get(timeout)
                if deadline is None:
                    deadline = deadlines[timeout] = _Deadline()
            task = loop.create_task(self._run(handler, job, tracer, timeout, deadline))
            self.running[job.id] = task
            if deadline is not None:
                deadline.tasks[job.id] = task
            task.add_done_callback(functools.partial(self._task_done, job, deadline))
        for timeout, deadline in deadlines.items():
            deadline.handle = loop.call_at(now + timeout, deadline.expire)

    def _task_done(self, job: Job, deadline: _Deadline | None, task: asyncio.Task[Outcome]) -> None:
        """Report a task's outcome. A task cancelled (at shutdown) before its first
        step never ran ``_run`` at all: its job is handed back, not counted."""
        self.running.pop(job.id, None)
        if deadline is not None:
            deadline.finished(job.id)
        self._on_outcome(Outcome.aborted(job) if task.cancelled() else task.result())

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
        for task in pending:
            task.cancel()
        _, stuck = await asyncio.wait(pending, timeout=CANCEL_WAIT)
        if stuck:
            log.error("%d handlers ignored cancellation; their jobs will be recovered", len(stuck))
            self.running = {k: v for k, v in self.running.items() if v not in stuck}

    def close(self) -> None:
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
        start = time.perf_counter()
        try:
            assert self.state is not None
            context.enter_job(self.state, job)
            log.info(
                "job started: %s %s attempt %d/%d%s",
                job.name,
                job.id,
                job.attempt,
                job.max_attempts,
                f" queue {job.queue_name}" if job.queue_name else "",
            )
            started = job.started_at
            self.events.job_started(job, (started - job.run_at).total_seconds() if started else 0.0)
            return await self._attempt(handler, job, start, tracer, timeout, deadline)
        except BaseException as exc:  # never let a job task die without an outcome
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("internal error running job %s", job.id)
            return Outcome.aborted(job, time.perf_counter() - start)

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
        timed_out = False
        try:
            payload = handler.decode(job.payload) if handler.takes_payload else None
            with tracing.NO_SPAN if tracer is None else tracing.span(tracer, job):
                try:
                    if handler.is_async:
                        await handler.call(job, payload)
                    else:
                        await self._run_in_thread(handler, job, payload)
                finally:
                    timed_out = deadline is not None and deadline.fired
        except asyncio.CancelledError:
            if not timed_out:
                log.info("job aborted at shutdown and requeued: %s %s", job.name, job.id)
                return Outcome.aborted(job, time.perf_counter() - start)
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            error = TimeoutError()
        except Exception as exc:
            error = exc
        duration = time.perf_counter() - start
        if error is None:
            log.info("job succeeded: %s %s in %.1f ms", job.name, job.id, duration * 1000)
            return Outcome(job, "succeeded", "succeeded", duration)
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
        if isinstance(error, PermanentError) or job.attempt >= job.max_attempts:
            log.error(
                "job failed permanently: %s %s attempt %d/%d: %s",
                job.name,
                job.id,
                job.attempt,
                job.max_attempts,
                message,
                exc_info=error,
            )
            return Outcome(job, "failed", "failed", duration, error=message)
        base, cap, jitter = self._backoff
        delay = retry_delay(job.attempt, base=base, cap=cap, jitter=jitter)
        log.warning(
            "job failed and will retry: %s %s attempt %d/%d in %.1fs: %s",
            job.name,
            job.id,
            job.attempt,
            job.max_attempts,
            delay,
            message,
            exc_info=error,
        )
        return Outcome(job, "retry", "retried", duration, delay=delay, error=message)

    async def _run_in_thread(self, handler: Handler, job: Job, payload: Any) -> None:
        """Run a sync handler in the worker's threads."""
        if self._threads is None:
            self._threads = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._concurrency, thread_name_prefix="pgfleet-job"
            )
        ctx = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._threads, ctx.run, handler.call, job, payload)
        # The thread cannot be stopped: on timeout or shutdown its result is ignored.
        await future
