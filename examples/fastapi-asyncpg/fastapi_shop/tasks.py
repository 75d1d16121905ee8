"""The shop's jobs. `pgfleet worker --app fastapi_shop.tasks:registry` runs them
beside the app, or the app runs a worker of its own (SHOP_WORKER=embedded)."""

from typing import TypedDict

import asyncpg

import pgfleet

registry = pgfleet.Registry()

#: The worker's pool, shared with the handlers (set when the worker starts).
db: dict[str, asyncpg.Pool] = {}


class Receipt(TypedDict):
    order: int


@registry.on_startup
async def share_the_pool(pool: asyncpg.Pool) -> None:
    db["pool"] = pool


@registry.job("send_receipt")
async def send_receipt(job: pgfleet.Job, payload: Receipt) -> None:
    # A real shop would email the receipt here. This one counts it, so that you (and
    # the tests) can see each order's receipt sent exactly once.
    await db["pool"].execute(
        "UPDATE orders SET receipts_sent = receipts_sent + 1 WHERE id = $1", payload["order"]
    )
