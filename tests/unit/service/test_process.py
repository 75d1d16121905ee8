"""A worker exits at once only when a sync handler still runs in a thread: the idle
threads of its pool, shut down without waiting, are not taken for stuck handlers
(a 2-process benchmark drain had warned "8 sync handlers are still running" after
every job had succeeded)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from pgfleet.service.process import stuck_job_threads


def test_idle_threads_of_a_pool_shut_down_without_waiting_are_not_stuck() -> None:
    pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pgfleet-job")
    list(pool.map(lambda n: n * 2, range(64)))  # every thread started, then idle
    pool.shutdown(wait=False, cancel_futures=True)
    assert stuck_job_threads(settle=30) == []


def test_a_thread_running_a_handler_is_stuck() -> None:
    release = threading.Event()
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="pgfleet-job")
    started = threading.Event()

    def handler() -> None:
        started.set()
        release.wait()

    pool.submit(handler)
    assert started.wait(30)
    pool.shutdown(wait=False, cancel_futures=True)
    try:
        stuck = stuck_job_threads(settle=0.05)
        assert len(stuck) == 1 and stuck[0].name.startswith("pgfleet-job")
    finally:
        release.set()
    assert stuck_job_threads(settle=30) == []
