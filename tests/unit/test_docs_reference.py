"""The documentation's reference pages are what the code generates now: a flag, an
option, an endpoint or a metric changed without regenerating them fails here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pgfleet.config import WORKER_OPTIONS
from pgfleet.service.openapi import openapi_document
from tools.docs.reference import PAGES, render_cli, render_configuration, render_metrics

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_committed_page_is_what_the_code_generates(name: str) -> None:
    committed = (REFERENCE / name).read_text(encoding="utf-8")
    assert committed == PAGES[name](), (
        f"docs/reference/{name} is stale: run `make docs-generate` and commit the result"
    )


def test_pages_do_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flag defaults come from PGFLEET_* variables: the pages must not."""
    before = {name: render() for name, render in PAGES.items()}
    monkeypatch.setenv("PGFLEET_CONCURRENCY", "99")
    monkeypatch.setenv("PGFLEET_API_PORT", "1234")
    monkeypatch.setenv("COLUMNS", "40")
    assert {name: render() for name, render in PAGES.items()} == before


def test_every_worker_option_is_documented_with_its_flag_and_variable() -> None:
    page = render_configuration()
    for option in WORKER_OPTIONS:
        assert f"`{option.field}`" in page and option.flag in page and option.variable in page


def test_every_command_and_flag_is_in_the_cli_reference() -> None:
    page = render_cli()
    for command in ("migrate", "worker", "api", "jobs list", "jobs get", "jobs retry"):
        assert f"`pgfleet {command}`" in page
    for flag in ("--app", "--processes", "--backlog-cap", "--auth-token", "--print-sql"):
        assert f"`{flag}`" in page


def test_the_http_reference_carries_the_openapi_document() -> None:
    served = json.loads((REFERENCE / "openapi.json").read_text(encoding="utf-8"))
    assert served == openapi_document()
    page = (REFERENCE / "http-api.md").read_text(encoding="utf-8")
    for path, item in served["paths"].items():
        for method in item:
            assert f"`{method.upper()} {path}`" in page


def test_every_metric_of_the_spec_is_in_the_metrics_reference() -> None:
    page = render_metrics()
    for name in (
        "pgfleet_jobs_queued",
        "pgfleet_jobs_scheduled",
        "pgfleet_jobs_running",
        "pgfleet_oldest_queued_job_age_seconds",
        "pgfleet_jobs_dead",
        "pgfleet_job_duration_seconds",
        "pgfleet_job_pickup_delay_seconds",
        "pgfleet_jobs_finished_total",
        "pgfleet_jobs_enqueued_total",
        "pgfleet_jobs_rescued_total",
        "pgfleet_worker_active_jobs",
        "pgfleet_api_requests_total",
    ):
        assert f"| `{name}` |" in page
