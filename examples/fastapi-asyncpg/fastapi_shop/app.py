"""A FastAPI shop on asyncpg: an order and its receipt job commit together.

    uvicorn fastapi_shop.app:app                          # and, beside it:
    pgfleet worker --app fastapi_shop.tasks:registry      # runs the receipts

or `SHOP_WORKER=embedded uvicorn fastapi_shop.app:app` to run a worker inside the
app. See README.md.
"""

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

import asyncpg
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

import pgfleet
from fastapi_shop.tasks import registry

# The shop's own tables (a real app would keep them in its migrations).
SCHEMA = """
CREATE TABLE IF NOT EXISTS stock (
    sku       text PRIMARY KEY,
    available integer NOT NULL CHECK (available >= 0)
);
CREATE TABLE IF NOT EXISTS orders (
    id            bigserial PRIMARY KEY,
    email         text NOT NULL,
    sku           text NOT NULL REFERENCES stock,
    quantity      integer NOT NULL,
    receipt_job   uuid,
    receipts_sent integer NOT NULL DEFAULT 0
);
INSERT INTO stock VALUES ('mug', 10) ON CONFLICT DO NOTHING;
"""


@dataclass
class Shop:
    pool: asyncpg.Pool
    queue: pgfleet.Queue


# --8<-- [start:lifespan]
@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The pool and the queue live as long as the app (and, if asked, a worker)."""
    pool = await pgfleet.create_pool(os.environ["DATABASE_URL"], max_size=10)
    try:
        await pool.execute(SCHEMA)
        app.state.shop = Shop(pool, pgfleet.Queue(pool))
        if os.environ.get("SHOP_WORKER") == "embedded":
            async with running_worker(pool):
                yield
        else:
            yield
    finally:
        await pool.close()


@asynccontextmanager
async def running_worker(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """A worker in this process until the app stops; then it drains."""
    worker = pgfleet.Worker(pool, registry, pgfleet.WorkerConfig(concurrency=4))
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(shutdown=stop.wait()))
    try:
        yield
    finally:
        stop.set()
        await running


# --8<-- [end:lifespan]


app = FastAPI(title="pgfleet example shop", lifespan=lifespan)


def get_shop(request: Request) -> Shop:
    shop: Shop = request.app.state.shop
    return shop


ShopDep = Annotated[Shop, Depends(get_shop)]


class NewOrder(BaseModel):
    email: str
    sku: str
    quantity: int = Field(gt=0)


# --8<-- [start:place_order]
@app.post("/orders", status_code=201)
async def place_order(order: NewOrder, shop: ShopDep) -> dict[str, int | str]:
    async with shop.pool.acquire() as conn:
        try:
            async with conn.transaction():
                order_id: int = await conn.fetchval(
                    "INSERT INTO orders (email, sku, quantity) VALUES ($1, $2, $3) RETURNING id",
                    order.email,
                    order.sku,
                    order.quantity,
                )
                # Written in this transaction: it commits or rolls back with the order.
                job_id = await shop.queue.enqueue(
                    "send_receipt", {"order": order_id}, connection=conn
                )
                await conn.execute(
                    "UPDATE orders SET receipt_job = $2 WHERE id = $1", order_id, job_id
                )
                # Too few left: the CHECK fails, and the order and its job roll back.
                await conn.execute(
                    "UPDATE stock SET available = available - $2 WHERE sku = $1",
                    order.sku,
                    order.quantity,
                )
        except asyncpg.CheckViolationError:
            raise HTTPException(409, f"not enough {order.sku} in stock") from None
        except asyncpg.ForeignKeyViolationError:
            raise HTTPException(404, f"no product {order.sku}") from None
    return {"order": order_id, "receipt_job": str(job_id)}


# --8<-- [end:place_order]


@app.get("/orders/{order_id}")
async def get_order(order_id: int, shop: ShopDep) -> dict[str, int | str | None]:
    row = await shop.pool.fetchrow(
        "SELECT receipt_job, receipts_sent FROM orders WHERE id = $1", order_id
    )
    if row is None:
        raise HTTPException(404, f"no order {order_id}")
    job = await shop.queue.get(row["receipt_job"])
    return {
        "order": order_id,
        "receipts_sent": row["receipts_sent"],
        "receipt_status": job.status.value if job is not None else None,
    }
