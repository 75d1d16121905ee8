"""Workflows: jobs that wait for other jobs, a batch with a callback, a chain."""

import asyncio
import os
from typing import Any

import pgfleet
from pgfleet import EnqueueOptions, EnqueueRequest, Job, Registry
from pgfleet.testing import drain

registry = Registry()


@registry.job("render_page")
async def render_page(job: Job, payload: dict[str, int]) -> None:
    print(f"page {payload['page']} rendered")


@registry.job("merge_pdf")
async def merge_pdf(job: Job, payload: dict[str, Any]) -> None:
    print("PDF merged")


@registry.job("import_row")
async def import_row(job: Job, payload: dict[str, int]) -> None:
    if payload["row"] == 3:
        raise pgfleet.PermanentError("row 3 is malformed")


@registry.job("email_summary")
async def email_summary(job: Job, payload: dict[str, Any]) -> None:
    batch = payload["batch"]  # filled in by pgfleet when the callback becomes due
    print(f"imported {batch['succeeded']} of {batch['size']}, {batch['failed']} failed")


async def main() -> None:
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"])
    try:
        queue = pgfleet.Queue(pool)

        # Dependencies: merge_pdf waits (status "waiting") until every page succeeded.
        pages = await queue.enqueue_many(
            [EnqueueRequest("render_page", {"page": n}) for n in range(3)]
        )
        merge = await queue.enqueue("merge_pdf", {}, options=EnqueueOptions(after=pages))

        # In one batch, `after` may name other jobs of the batch by their index.
        await queue.enqueue_many(
            [
                EnqueueRequest("render_page", {"page": 99}),
                EnqueueRequest("merge_pdf", {}, EnqueueOptions(after=(0,))),
            ]
        )

        # A batch with a callback: it runs once, after every member finished,
        # with the members' outcomes in its payload.
        batch_id, _member_ids = await queue.enqueue_batch(
            [EnqueueRequest("import_row", {"row": n}) for n in range(10)],
            callback=EnqueueRequest("email_summary", {"to": "ops@example.com"}),
        )

        # A chain: each step waits for the one before; a failure cancels the rest.
        await queue.enqueue_chain([EnqueueRequest("render_page", {"page": n}) for n in (1, 2, 3)])

        await drain(pool, registry)

        progress = await queue.batch_progress(batch_id)
        print(f"batch: {progress.succeeded} succeeded, {progress.failed} failed")
        parents = await queue.parents(merge)
        print(f"merge_pdf waited on {len(parents)} jobs")
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(main())
