"""Payloads as pydantic models or msgspec Structs (pip install 'pgfleet[typed]')."""

import asyncio
import os

import msgspec
import pydantic

import pgfleet
from pgfleet import Job

registry = pgfleet.Registry()


class Invoice(pydantic.BaseModel):
    customer: str
    cents: int = pydantic.Field(gt=0)


class Thumbnail(msgspec.Struct):
    image: int
    sizes: list[int]


@registry.job("send_invoice")
async def send_invoice(job: Job, payload: Invoice) -> None:
    print(f"invoice for {payload.customer}: {payload.cents / 100:.2f}")


@registry.job("thumbnail")
async def thumbnail(job: Job, payload: Thumbnail) -> None:
    print(f"thumbnails of image {payload.image}: {payload.sizes}")


async def main() -> None:
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"])
    try:
        # check_payloads: refuse at enqueue what the handler could not decode.
        queue = pgfleet.Queue(pool, known_names=registry, check_payloads=True)
        await queue.enqueue("send_invoice", Invoice(customer="Ada", cents=1250))
        await queue.enqueue("thumbnail", Thumbnail(image=7, sizes=[64, 256]))
        try:
            await queue.enqueue("send_invoice", {"customer": "Bob", "cents": -1})
        except pgfleet.PayloadError as exc:
            print(f"refused: {exc}")
        stats = await pgfleet.Worker(pool, registry).run(burst=True)
        print(f"succeeded: {stats.succeeded}")
    finally:
        await pool.close()


asyncio.run(main())
