"""The Locust quitting hook: failures or a latency bound make the run exit non-zero.
Real Locust processes; the numbers they report are printed, never asserted."""

from __future__ import annotations

from tests.loadtest.support import locust
from tests.procs import free_port

RUN = ("-u", "2", "-r", "2", "-t", "2s", "--stop-timeout", "5")


def test_a_clean_run_exits_zero_and_counts_jobs_in_the_response_length(database: str) -> None:
    code, output = locust(
        "db", *RUN, "--dsn", database, "--batch-size", "3", "--notify", "transaction"
    )
    print(output[-1500:])
    assert code == 0, output
    assert "db-transaction" in output
    assert "enqueue batch=3" in output


def test_a_latency_bound_that_is_exceeded_fails_the_run(database: str) -> None:
    code, output = locust("db", *RUN, "--dsn", database, "--max-p95-ms", "0.001")
    assert code == 1, output
    assert "load test gate: 95th percentile" in output


def test_failed_requests_over_the_ratio_fail_the_run() -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens: every request fails
    code, output = locust("http", *RUN, "--host", closed, "--max-failure-ratio", "0.5")
    assert code == 1, output
    assert "load test gate: failure ratio 100.00%" in output
