"""The worker's tuning of its process's garbage collector (WorkerConfig.gc_tuning),
seen from inside real handlers run by real workers against Postgres."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import asyncpg
import pytest

from pgfleet import Job, Queue, Registry, Worker, WorkerConfig
from pgfleet._runtime import gc_tuning
from pgfleet.testing import drain

seen: list[tuple[tuple[int, int, int], int, bool]] = []
reg = Registry()


@reg.job("gc_probe")
async def gc_probe(job: Job) -> None:
    seen.append((gc.get_threshold(), gc.get_freeze_count(), gc_tuning.active()))


@pytest.fixture(autouse=True)
def as_found() -> Iterator[tuple[int, int, int]]:
    seen.clear()
    found = gc.get_threshold()
    assert not gc_tuning.active()
    yield found
    assert gc.get_threshold() == found, "a test left the collector tuned"
    assert not gc_tuning.active()


async def test_a_running_worker_tunes_the_collector_and_its_stop_undoes_it(
    pool: asyncpg.Pool, as_found: tuple[int, int, int]
) -> None:
    await Queue(pool).enqueue("gc_probe", {})
    frozen_before = gc.get_freeze_count()
    stats = await drain(pool, reg, concurrency=2)
    assert stats.succeeded == 1
    (threshold, frozen, active) = seen[0]
    assert active
    assert threshold == (gc_tuning.YOUNG_THRESHOLD, as_found[1], as_found[2])
    assert frozen > frozen_before, "the objects alive at the start were not frozen"
    assert gc.get_threshold() == as_found
    assert gc.get_freeze_count() == frozen_before, "the frozen objects were not released"


async def test_gc_tuning_off_leaves_the_collector_alone(
    pool: asyncpg.Pool, as_found: tuple[int, int, int]
) -> None:
    await Queue(pool).enqueue("gc_probe", {})
    frozen_before = gc.get_freeze_count()
    await drain(pool, reg, WorkerConfig(gc_tuning=False, concurrency=2))
    assert seen == [(as_found, frozen_before, False)]


async def test_the_tuning_lasts_until_the_processs_last_worker_stops(
    pool: asyncpg.Pool, as_found: tuple[int, int, int]
) -> None:
    first_stop, second_stop = asyncio.Event(), asyncio.Event()
    first = Worker(pool, reg, WorkerConfig(poll_interval=0.2))
    second = Worker(pool, reg, WorkerConfig(poll_interval=0.2))
    one = asyncio.create_task(first.run(shutdown=first_stop.wait()))
    two = asyncio.create_task(second.run(shutdown=second_stop.wait()))
    await asyncio.wait_for(asyncio.gather(first.wait_started(), second.wait_started()), 30)
    # wait_started resolves before run() takes the tuning: a job proves both run.
    await Queue(pool).enqueue("gc_probe", {})
    while not seen:
        await asyncio.sleep(0.05)
    assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD
    first_stop.set()
    await asyncio.wait_for(one, 30)
    assert gc_tuning.active(), "the first worker's stop undid the second's tuning"
    assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD
    second_stop.set()
    await asyncio.wait_for(two, 30)
    assert gc.get_threshold() == as_found


def test_a_disabled_collector_is_left_disabled() -> None:
    found, frozen = gc.get_threshold(), gc.get_freeze_count()
    gc.disable()
    try:
        gc_tuning.acquire()
        try:
            assert gc_tuning.active()
            assert (gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()) == (
                False,
                found,
                frozen,
            )
        finally:
            gc_tuning.release()
    finally:
        gc.enable()


def test_an_applications_own_freeze_is_kept() -> None:
    """A pre-fork server freezes its objects before forking: the worker's stop must
    not thaw them."""
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        gc_tuning.acquire()
        try:
            assert gc.get_threshold()[0] == gc_tuning.YOUNG_THRESHOLD
        finally:
            gc_tuning.release()
        # Frozen objects that reference counting frees meanwhile leave the count
        # (a test process frees some at any time): a thaw would leave about none.
        assert gc.get_freeze_count() > frozen // 2, "the application's freeze was thawed"
    finally:
        gc.unfreeze()
