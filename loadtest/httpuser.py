"""A Locust user that enqueues through the HTTP jobs API (``pgfleet api``).

A batch of one uses the single-job form (``{"name", "payload"}``); larger batches
use ``{"jobs": [...]}``, one transaction on the API's side. Every request is
reported under ``/jobs batch=N`` with the response length set to the number of
jobs it carried, so the Locust CSVs count jobs as well as requests.
"""

from __future__ import annotations

from typing import Any

from locust import FastHttpUser, task

from loadtest.shield import GracefulStop, stop_spent
from loadtest.users import Budget, Pacer, Settings, job_bodies, request_name, user_period


class _Shared:
    def __init__(self, settings: Settings) -> None:
        self.budget = Budget(settings.total_jobs or None)
        self.seq = 0


class HttpEnqueuer(GracefulStop, FastHttpUser):
    """POSTs ``--batch-size`` jobs per request to ``/jobs``; only 202 counts."""

    abstract = True
    # One connection per user: the API sees as many concurrent producers as users.
    concurrency = 1

    def on_start(self) -> None:
        self.settings = Settings.from_options(self.environment.parsed_options)
        shared = getattr(self.environment, "pgfleet_http", None)
        if shared is None:
            shared = self.environment.pgfleet_http = _Shared(self.settings)
        self.shared: _Shared = shared
        self.shared.budget.active += 1
        users = self.environment.parsed_options.num_users or 1
        self.pacer = Pacer(user_period(self.settings.target_rate, self.settings.batch, users))
        self.headers = {"Content-Type": "application/json"}
        if self.settings.api_token:
            self.headers["Authorization"] = f"Bearer {self.settings.api_token}"

    def wait_time(self) -> float:
        return self.pacer.wait()

    @task
    def enqueue(self) -> None:
        n = self.shared.budget.take(self.settings.batch)
        if n == 0:
            stop_spent(self, self.shared.budget)
        jobs = job_bodies(self.settings.job_name, n, self.shared.seq)
        self.shared.seq += n
        body: Any = jobs[0] if n == 1 else {"jobs": jobs}
        with self.client.post(
            "/jobs",
            json=body,
            headers=self.headers,
            name=request_name("/jobs", n),
            catch_response=True,
        ) as response:
            response.request_meta["response_length"] = n
            if response.status_code != 202:
                text = (response.text or "")[:200]
                response.failure(f"HTTP {response.status_code}: {text}")
