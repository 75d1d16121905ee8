import asyncio
import os
from dataclasses import dataclass

import pgfleet

registry = pgfleet.Registry()


@dataclass
class SendEmail:
    to: str
    subject: str


@registry.job("send_email")
async def send_email(job: pgfleet.Job, payload: SendEmail) -> None:
    print(f"sending {payload.subject!r} to {payload.to}")


async def main() -> None:
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"])
    try:
        await pgfleet.migrate(pool)  # creates the pgfleet schema once
        queue = pgfleet.Queue(pool)
        await queue.enqueue("send_email", SendEmail(to="ada@example.com", subject="Hi"))
        # A worker runs the handlers; burst=True returns once the queue is empty.
        # In production: `pgfleet worker --app myapp:registry`, or worker.run(shutdown=...).
        stats = await pgfleet.Worker(pool, registry).run(burst=True)
        print(f"succeeded: {stats.succeeded}")
    finally:
        await pool.close()


asyncio.run(main())
