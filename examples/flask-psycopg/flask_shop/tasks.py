"""The shop's jobs: `pgfleet worker --app flask_shop.tasks:registry` runs them.

They are plain functions, as the rest of a sync app: a worker runs each in one of
its threads."""

import os
from typing import TypedDict

import psycopg

import pgfleet

registry = pgfleet.Registry()


class OrderRef(TypedDict):
    order: int


@registry.job("send_receipt")
def send_receipt(job: pgfleet.Job, payload: OrderRef) -> None:
    # A real shop would email the receipt here. This one counts it, so that you (and
    # the tests) can see each order's receipt sent exactly once.
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "UPDATE orders SET receipts_sent = receipts_sent + 1 WHERE id = %s",
            (payload["order"],),
        )


@registry.job("ask_for_review")
def ask_for_review(job: pgfleet.Job, payload: OrderRef) -> None:
    print(f"how was order {payload['order']}?")
