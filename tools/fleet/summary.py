"""The live one-line summary: what the fleet's own metrics endpoints say.

Every second the runner scrapes the worker processes and the API (as Prometheus
would) and keeps running totals of finished attempts by outcome; counters that
restart with a process are handled like Prometheus' ``increase()`` does. The
queue-level gauges (queued, oldest age) come from whichever process holds the
metrics lease, the API included, so they stay visible with every worker down.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

FINISHED = "pgfleet_jobs_finished_total"


@dataclass
class Sample:
    """What one round of scrapes found."""

    workers_up: int = 0
    workers: int = 0
    api_up: bool = False
    #: None when no process exported the queue-level gauges this round.
    queued: float | None = None
    oldest_age: float | None = None


@dataclass
class Totals:
    """Finished attempts by outcome since the runner started watching."""

    by_outcome: collections.Counter[str] = field(default_factory=collections.Counter)
    _last: dict[tuple[str, str], float] = field(default_factory=dict)

    def observe(self, target: str, finished: dict[str, float]) -> None:
        for outcome, value in finished.items():
            last = self._last.get((target, outcome), 0.0)
            # A smaller value means the process restarted: count from zero again.
            self.by_outcome[outcome] += int(value - last if value >= last else value)
            self._last[target, outcome] = value


def parse(text: str) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """(finished attempts by outcome, queue gauges by name by kind) of one exposition."""
    finished: dict[str, float] = collections.defaultdict(float)
    gauges: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == FINISHED:
                finished[sample.labels["outcome"]] += sample.value
            elif sample.name in ("pgfleet_jobs_queued", "pgfleet_oldest_queued_job_age_seconds"):
                gauges[sample.name][sample.labels["kind"]] = sample.value
    return finished, gauges


class Watcher:
    """Scrapes the fleet's metrics endpoints and renders the summary line."""

    def __init__(self, worker_urls: list[str], api_url: str) -> None:
        self.worker_urls = worker_urls
        self.api_url = api_url
        self.totals = Totals()
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _scrape(self, url: str) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        try:
            async with self._session.get(url) as response:
                return await response.text() if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def sample(self) -> Sample:
        urls = [*self.worker_urls, self.api_url]
        texts = await asyncio.gather(*(self._scrape(url) for url in urls))
        result = Sample(workers=len(self.worker_urls))
        queue: dict[str, dict[str, float]] = {}
        for url, text in zip(urls, texts, strict=True):
            if text is None:
                continue
            if url == self.api_url:
                result.api_up = True
            else:
                result.workers_up += 1
            finished, gauges = parse(text)
            self.totals.observe(url, finished)
            queue = queue or gauges  # one process (the lease holder) exports them
        if queue:
            result.queued = sum(queue.get("pgfleet_jobs_queued", {}).values())
            result.oldest_age = max(
                queue.get("pgfleet_oldest_queued_job_age_seconds", {}).values(), default=0.0
            )
        return result

    def line(self, sample: Sample, enqueued: int, unsent: int = 0, refused: int = 0) -> str:
        done = self.totals.by_outcome
        parts = [
            time.strftime("%H:%M:%S"),
            f"enqueued {enqueued}",
            f"done {done['succeeded']}",
            f"retried {done['retried']}",
            f"failed {done['failed']}",
        ]
        if sample.queued is None or sample.oldest_age is None:
            parts.append("queued ? (no queue metrics)")
        else:
            parts.append(f"queued {sample.queued:.0f}")
            parts.append(f"backlog age {sample.oldest_age:.1f}s")
        parts.append(f"workers {sample.workers_up}/{sample.workers} up")
        if not sample.api_up:
            parts.append("API down")
        if refused:
            parts.append(f"refused {refused}")
        if unsent:
            parts.append(f"unsent {unsent}")
        return " | ".join(parts)
