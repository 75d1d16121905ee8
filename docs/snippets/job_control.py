"""Job control: results you wait for, retry policies, snoozes, error history, and
cancelling a running job."""

import asyncio
import os

import pgfleet
from pgfleet import Job, RetryPolicy, Snooze

registry = pgfleet.Registry()


class RateLimited(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__(f"rate limited, retry after {retry_after}s")
        self.retry_after = retry_after


@registry.job("build_report")
async def build_report(job: Job, payload: dict[str, int]) -> dict[str, int]:
    # The return value (any JSON value, up to 256 KiB) is stored as job.result.
    return {"customer": payload["customer"], "rows": 1200}


@registry.job(
    "call_provider",
    # Retry timeouts up to 5 attempts, 0.1 s apart; never retry a ValueError.
    retry=RetryPolicy(
        max_attempts=5,
        backoff=lambda attempt: 0.1,
        retry_on=(TimeoutError,),
        give_up_on=(ValueError,),
    ),
)
async def call_provider(job: Job) -> str:
    if job.snoozes == 0:
        # "Come back in a moment": runs again later without using an attempt.
        raise Snooze(0.2)
    if job.attempt < 3:
        raise TimeoutError(f"the provider did not answer (attempt {job.attempt})")
    return "sent"


@registry.job("export")
async def export(job: Job) -> None:
    while not pgfleet.cancel_requested():  # an operator may cancel the running job
        await asyncio.sleep(0.05)
    print("export: cancelled, cleaning up")


async def main() -> None:
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"])
    stop = asyncio.Event()
    try:
        await pgfleet.migrate(pool)
        queue = pgfleet.Queue(pool)
        worker = pgfleet.Worker(pool, registry, pgfleet.WorkerConfig(cancel_grace_period=5))
        running = asyncio.create_task(worker.run(shutdown=stop.wait()))

        report = await queue.wait(await queue.enqueue("build_report", {"customer": 7}), timeout=30)
        rows, customer = report.result["rows"], report.result["customer"]
        print(f"report: {report.status.value}, {rows} rows for customer {customer}")

        call = await queue.wait(await queue.enqueue("call_provider"), timeout=30)
        print(f"call: {call.status.value} on attempt {call.attempt} after {call.snoozes} snooze")
        for error in call.errors:  # every failed attempt, oldest first
            print(f"  attempt {error.attempt}: {error.error}")

        export_id = await queue.enqueue("export")
        while (await queue.statuses([export_id]))[export_id] is not pgfleet.JobStatus.RUNNING:
            await asyncio.sleep(0.05)
        await queue.cancel(export_id, by="ops")  # the running handler is told to stop
        stopped = await queue.wait(export_id, timeout=30)
        print(f"export: {stopped.status.value} by {stopped.cancelled_by}")

        stop.set()
        await running
    finally:
        await pool.close()


asyncio.run(main())
