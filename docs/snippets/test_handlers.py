"""test_handlers.py: test your handlers with pytest (and pytest-asyncio)."""

import os

import pytest
from handlers import CardDeclined, registry

import pgfleet
from pgfleet import PayloadDecodeError, PermanentError
from pgfleet.testing import drain, run_job

pytestmark = pytest.mark.asyncio


async def test_a_handler_runs_with_its_payload_as_a_worker_would_decode_it() -> None:
    assert await run_job(registry, "resize", {"image": 1, "width": 640}) == {
        "image": 1,
        "width": 640,
    }


async def test_bad_input_fails_for_good() -> None:
    with pytest.raises(PermanentError):
        await run_job(registry, "charge_card", {"order": 1, "cents": 0})
    with pytest.raises(PayloadDecodeError):
        await run_job(registry, "charge_card", {"order": "one"})


async def test_a_declined_card_is_retried() -> None:
    with pytest.raises(CardDeclined):
        await run_job(registry, "charge_card", {"order": 13, "cents": 500})


async def test_the_queue_drains_through_a_real_worker() -> None:
    # Against a throwaway database of your own: drain() runs a real worker in
    # this process until no runnable job is left, and counts the outcomes.
    pool = await pgfleet.create_pool(os.environ["PGFLEET_DATABASE_URL"])
    try:
        await pgfleet.migrate(pool)
        queue = pgfleet.Queue(pool)
        await queue.enqueue("charge_card", {"order": 1, "cents": 500})
        await queue.enqueue("resize", {"image": 2, "width": 320})
        stats = await drain(pool, registry)
        assert stats.succeeded == 2
    finally:
        await pool.close()
