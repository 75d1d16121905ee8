"""The demo producer: a steady mixed stream of the reference jobs, posted to the
jobs API in small batches, as a client application would."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

import aiohttp

#: Ticks per second: the rate is spread over them so the stream is steady.
TICKS_PER_SECOND = 5


def _noop(_rng: random.Random) -> dict[str, Any]:
    return {"name": "noop", "payload": {}}


def _sleep(rng: random.Random) -> dict[str, Any]:
    return {"name": "sleep", "payload": {"ms": rng.randint(5, 200)}}


def _cpu(rng: random.Random) -> dict[str, Any]:
    return {"name": "cpu", "payload": {"ms": rng.randint(1, 10)}}


def _send_email(rng: random.Random) -> dict[str, Any]:
    # A few thousand recipients: repeats show the handler's idempotency ("already sent").
    address = f"user{rng.randint(1, 5000)}@example.com"
    template = rng.choice(("welcome", "receipt", "reminder"))
    return {"name": "send_email", "payload": {"address": address, "template": template}}


def _flaky(rng: random.Random) -> dict[str, Any]:
    # 1 or 2 failures: retried, then succeeded. 3 failures in 3 attempts: dead.
    return {
        "name": "flaky",
        "payload": {"failures": rng.choice((1, 1, 2, 3))},
        "options": {"max_attempts": 3},
    }


def _fail(_rng: random.Random) -> dict[str, Any]:
    return {"name": "fail", "payload": {}, "options": {"max_attempts": 1}}


#: (share of the stream, job factory)
MIX = (
    (0.30, _noop),
    (0.25, _sleep),
    (0.10, _cpu),
    (0.20, _send_email),
    (0.10, _flaky),
    (0.05, _fail),
)
#: The job names of the mix, in its order.
JOB_NAMES = tuple(factory(random.Random(0))["name"] for _share, factory in MIX)


def mixed_job(rng: random.Random) -> dict[str, Any]:
    """One job request of the demo mix."""
    pick = rng.random()
    for share, factory in MIX:
        if pick < share:
            return factory(rng)
        pick -= share
    return _noop(rng)


@dataclass
class ProducerStats:
    accepted: int = 0
    #: Jobs the API refused (HTTP status -> jobs), e.g. 503 over a backlog cap.
    refused: collections.Counter[int] = field(default_factory=collections.Counter)
    #: Jobs not sent because the API did not answer.
    unsent: int = 0
    by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    last_error: str = ""


class DemoProducer:
    """Posts ``rate`` jobs a second to ``POST {api}/jobs`` until stopped."""

    def __init__(
        self, api_url: str, rate: float, token: str | None = None, seed: int | None = None
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.rate = rate
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.rng = random.Random(seed)
        self.stats = ProducerStats()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fleet-producer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = 1 / TICKS_PER_SECOND
        owed = 0.0
        next_at = loop.time()
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as session:
            while True:
                owed += self.rate * tick
                count = int(owed)
                owed -= count
                if count:
                    await self._post(session, [mixed_job(self.rng) for _ in range(count)])
                # A steady clock: a slow request shortens the next wait, and a long
                # outage does not turn into a burst when the API comes back.
                next_at = max(next_at + tick, loop.time())
                await asyncio.sleep(next_at - loop.time())

    async def _post(self, session: aiohttp.ClientSession, jobs: list[dict[str, Any]]) -> None:
        try:
            async with session.post(f"{self.api_url}/jobs", json={"jobs": jobs}) as response:
                if response.status == 202:
                    self.stats.accepted += len(jobs)
                    self.stats.by_kind.update(job["name"] for job in jobs)
                    return
                self.stats.refused[response.status] += len(jobs)
                self.stats.last_error = f"HTTP {response.status}: {(await response.text())[:200]}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.stats.unsent += len(jobs)
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
