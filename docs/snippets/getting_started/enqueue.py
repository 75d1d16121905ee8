"""enqueue.py: put one job into the queue."""

import asyncio
import os

from tasks import SendEmail

import pgfleet


async def main() -> None:
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"])
    try:
        queue = pgfleet.Queue(pool)
        job_id = await queue.enqueue(
            "send_email", SendEmail(to="ada@example.com", subject="Welcome")
        )
        print(f"enqueued job {job_id}")
    finally:
        await pool.close()


asyncio.run(main())
