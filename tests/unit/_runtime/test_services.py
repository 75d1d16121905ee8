"""Periodic: the shape of every background service."""

from __future__ import annotations

import asyncio
import logging

import pytest

from pgfleet._runtime.services import Periodic


class Gated(Periodic):
    """A round that waits for the test to let it finish."""

    name = "gated"

    def __init__(self) -> None:
        super().__init__(interval=3600)
        self.rounds = 0
        self.inside = asyncio.Event()
        self.release = asyncio.Event()

    async def run_once(self) -> None:
        self.rounds += 1
        self.inside.set()
        await self.release.wait()


async def test_a_stop_during_a_round_ends_the_loop_after_that_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    service = Gated()
    service.start()
    await service.inside.wait()
    stopping = asyncio.create_task(service.stop(wait=30))
    await asyncio.sleep(0)  # stop() has asked; the round is still running
    service.release.set()
    with caplog.at_level(logging.WARNING, logger="pgfleet"):
        await asyncio.wait_for(stopping, 5)
    assert service.rounds == 1
    assert "cut short" not in caplog.text


async def test_a_kick_during_a_round_runs_another_round() -> None:
    service = Gated()
    service.start()
    await service.inside.wait()
    service.inside.clear()
    service.kick()
    service.release.set()
    await asyncio.wait_for(service.inside.wait(), 5)  # not an hour later
    assert service.rounds == 2
    await service.stop()
