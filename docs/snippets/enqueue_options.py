"""Enqueue options, job keys, batches and transactional enqueues."""

import asyncio
import os
from datetime import UTC, datetime, timedelta

import pgfleet
from pgfleet import EnqueueOptions, EnqueueRequest, JobKeyMode


async def main() -> None:
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"])
    try:
        queue = pgfleet.Queue(pool)
        email = {"to": "ada@example.com", "subject": "Welcome"}

        # Later: after a delay (seconds or a timedelta), or at an aware datetime.
        await queue.enqueue("send_email", email, options=EnqueueOptions(delay=30))
        tomorrow = datetime.now(UTC) + timedelta(days=1)
        await queue.enqueue("send_email", email, options=EnqueueOptions(run_at=tomorrow))

        # Lower priority numbers run first; max_attempts counts the first attempt.
        await queue.enqueue(
            "send_email", email, options=EnqueueOptions(priority=-10, max_attempts=5)
        )

        # A named queue runs at most one of its jobs at a time, fleet-wide.
        await queue.enqueue(
            "charge_card", {"order": 42}, options=EnqueueOptions(queue_name="billing:42")
        )

        # A job key allows one queued-or-running job per key. DEDUPE (the default)
        # returns the existing job's id; REPLACE debounces (the timer restarts).
        first = await queue.enqueue(
            "rebuild_index", {"shop": 7}, options=EnqueueOptions(job_key="index:7")
        )
        again = await queue.enqueue(
            "rebuild_index", {"shop": 7}, options=EnqueueOptions(job_key="index:7")
        )
        assert again == first
        debounced = EnqueueOptions(delay=60, job_key="index:7", job_key_mode=JobKeyMode.REPLACE)
        assert await queue.enqueue("rebuild_index", {"shop": 7}, options=debounced) == first

        # A batch is one transaction: every job goes in, or none does.
        ids = await queue.enqueue_many([EnqueueRequest("resize", {"image": n}) for n in range(100)])

        # Enqueue inside your own transaction: the job exists only if it commits.
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT 1")  # your own writes, e.g. INSERT INTO orders ...
            await queue.enqueue("send_receipt", {"order": 42}, connection=conn)

        print(f"{len(ids)} resize jobs; index job {first}")
    finally:
        await pool.close()


asyncio.run(main())
