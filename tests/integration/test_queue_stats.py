"""The queue-level metrics collector: one exporter per fleet through a lease."""

from __future__ import annotations

import asyncpg
from prometheus_client import CollectorRegistry, generate_latest

from pgfleet import EnqueueOptions, EnqueueRequest, Queue
from pgfleet.service.metrics import QueueStats
from tests.helpers import put_in_state


def exported(stats: QueueStats) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(stats)
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def test_one_collector_exports_and_another_takes_over(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    await queue.enqueue("a", {})
    await queue.enqueue("a", {}, options=EnqueueOptions(delay=600))
    dead = await queue.enqueue("b", {})
    await put_in_state(pool, dead, "failed")
    first = QueueStats(pool, known_names={"a", "c"}, lease=60)
    second = QueueStats(pool, known_names={"a"}, lease=60)
    await first.refresh()
    await second.refresh()
    assert first.holding and not second.holding
    assert exported(second) == {}
    metrics = exported(first)
    assert metrics['pgfleet_jobs_queued{kind="a"}'] == 1
    assert metrics['pgfleet_jobs_scheduled{kind="a"}'] == 1
    assert metrics['pgfleet_jobs_dead{kind="b"}'] == 1
    assert metrics['pgfleet_jobs_queued{kind="c"}'] == 0  # known kinds report zeros
    assert metrics['pgfleet_oldest_queued_job_age_seconds{kind="c"}'] == 0
    assert metrics["pgfleet_queue_collector_up"] == 1
    # The holder gives the lease up at shutdown: the next scrape elsewhere takes it.
    await first.release()
    await second.refresh()
    assert second.holding
    await first.refresh()
    assert not first.holding


async def test_an_expired_lease_moves_to_a_live_process(pool: asyncpg.Pool) -> None:
    gone = QueueStats(pool, lease=60)
    live = QueueStats(pool, lease=60)
    await gone.refresh()
    assert gone.holding
    # The holder died without releasing; its lease runs out.
    await pool.execute("UPDATE pgfleet.leases SET expires_at = now() - interval '1 second'")
    await live.refresh()
    assert live.holding
    await gone.refresh()
    assert not gone.holding


async def test_job_names_past_the_budget_share_one_series(pool: asyncpg.Pool) -> None:
    queue = Queue(pool)
    for name in ("z_known", "b", "c", "d", "e"):
        await queue.enqueue(name, {})
    await queue.enqueue("e", {})
    stats = QueueStats(pool, known_names={"z_known"}, lease=60, max_names=2)
    await stats.refresh()
    metrics = exported(stats)
    queued = {k: v for k, v in metrics.items() if k.startswith("pgfleet_jobs_queued{")}
    # The application's own name always; then two others by name; the rest summed.
    assert queued == {
        'pgfleet_jobs_queued{kind="z_known"}': 1,
        'pgfleet_jobs_queued{kind="b"}': 1,
        'pgfleet_jobs_queued{kind="c"}': 1,
        'pgfleet_jobs_queued{kind="_other"}': 3,
    }


async def test_jobs_waiting_on_parents_have_their_gauge_and_stay_out_of_the_backlog(
    pool: asyncpg.Pool,
) -> None:
    queue = Queue(pool)
    parent = await queue.enqueue("a", {})
    await queue.enqueue_many(
        [
            EnqueueRequest("b", {}, EnqueueOptions(after=(parent,))),
            EnqueueRequest("b", {}, EnqueueOptions(after=(0,))),
        ]
    )
    stats = QueueStats(pool, lease=60)
    await stats.refresh()
    metrics = exported(stats)
    assert metrics['pgfleet_jobs_waiting_on_parents{kind="b"}'] == 2
    assert metrics['pgfleet_jobs_queued{kind="a"}'] == 1
    assert 'pgfleet_jobs_queued{kind="b"}' not in metrics  # waiting jobs are no backlog
    assert await queue.runnable_backlog() == 1
    await queue.complete(parent)
    await stats.refresh()
    metrics = exported(stats)
    assert metrics['pgfleet_jobs_waiting_on_parents{kind="b"}'] == 1
    assert metrics['pgfleet_jobs_queued{kind="b"}'] == 1
