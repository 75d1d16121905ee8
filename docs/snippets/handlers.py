"""Handlers: typed payloads, sync handlers, timeouts, retries and permanent failures."""

from dataclasses import dataclass
from typing import TypedDict

import pgfleet
from pgfleet import Job, PermanentError

registry = pgfleet.Registry()


@dataclass
class Charge:
    order: int
    cents: int


class Resize(TypedDict):
    image: int
    width: int


class CardDeclined(Exception):
    pass


@registry.job("charge_card")
async def charge_card(job: Job, payload: Charge) -> None:
    # The annotation decides how the stored JSON is decoded; a payload that does
    # not fit fails the job at once (PayloadDecodeError), without retries.
    if payload.cents <= 0:
        raise PermanentError(f"order {payload.order}: nothing to charge")  # no retry
    if payload.order == 13:
        # Any other exception is a failed attempt, retried with backoff until
        # max_attempts; then the job fails and keeps its last error.
        raise CardDeclined("the bank said no")


@registry.job("resize", timeout=60)  # a sync handler runs in a thread
def resize(job: Job, payload: Resize) -> dict[str, int]:
    return {"image": payload["image"], "width": payload["width"]}


@registry.job("prune_sessions", infallible=True)  # errors are logged, never retried
async def prune_sessions(job: Job) -> None:
    if pgfleet.is_shutting_down():  # a long handler can stop early at shutdown
        return


@registry.on_startup
async def connect_services(pool: object) -> None:
    """Runs once when a worker starts (open clients your handlers share)."""


@registry.on_shutdown
async def close_services(pool: object) -> None:
    """Runs after the worker drained."""
