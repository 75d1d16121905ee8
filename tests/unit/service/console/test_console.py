"""The console's pure parts: escaping, the login form's CSRF token, schedules read back
from their stored definitions, which filters read a bounded window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pgfleet import CronJob, DailySchedule, JobStatus, MonthlySchedule
from pgfleet.cron.describe import next_occurrences, parse_definition
from pgfleet.cron.occurrences import next_occurrence
from pgfleet.service.console.app import _safe_next
from pgfleet.service.console.auth import login_csrf_ok, login_nonce
from pgfleet.service.console.data import JobFilter, id_floor
from pgfleet.service.console.html import Markup, el, escape, join


def test_text_and_attributes_are_escaped_and_markup_is_kept() -> None:
    hostile = "<script>alert('x')</script>&\""
    out = el("a", {"href": hostile, "title": None, "hidden": True}, hostile, el("b", None, "ok"))
    assert out == (
        '<a href="&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;" hidden>'
        "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&amp;&quot;<b>ok</b></a>"
    )
    assert escape(Markup("<i>kept</i>")) == "<i>kept</i>"
    assert join("<", [1, None, ["a", Markup("<br>")]]) == "&lt;1a<br>"
    assert el("input", {"value": "x"}) == '<input value="x">'


def test_the_login_form_token_must_equal_its_cookie() -> None:
    nonce = login_nonce()
    assert login_csrf_ok(nonce, nonce)
    assert not login_csrf_ok(None, nonce) and not login_csrf_ok(nonce, None)
    assert not login_csrf_ok(login_nonce(), nonce)


@pytest.mark.parametrize(
    "cron",
    [
        CronJob.interval("a", "job", timedelta(minutes=15)),
        CronJob.interval("a", "job", 0.25),
        CronJob.daily_utc("a", "job", DailySchedule(0, 5)),
        CronJob.daily_in_timezone(
            "a", "job", DailySchedule(16, 30).weekdays(range(5)), "America/New_York"
        ),
        CronJob.monthly_utc("a", "job", MonthlySchedule(31, 3, 30)),
        CronJob.monthly_in_timezone("a", "job", MonthlySchedule(1, 2, 30), "Australia/Lord_Howe"),
    ],
)
def test_every_definition_reads_back_as_the_same_schedule(cron: CronJob) -> None:
    back = parse_definition(cron.id, cron.job_name, cron.definition)
    assert back.definition == cron.definition
    assert back.timezone == cron.timezone
    start = datetime(2026, 3, 7, 12, 0, tzinfo=UTC)  # across a DST change in New York
    expected, at = [], start
    for _ in range(4):
        at = next_occurrence(cron, at)
        expected.append(at)
    assert next_occurrences(back, start, 4) == expected


@pytest.mark.parametrize(
    "text", ["hourly", "every 5m", "daily 25:00 UTC", "daily 10:00 on funday UTC", "monthly 1"]
)
def test_definitions_no_version_writes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"definition|weekday|hour|must"):
        parse_definition("a", "job", text)


def test_login_only_returns_to_a_console_page() -> None:
    assert _safe_next("/ui/jobs?status=failed") == "/ui/jobs?status=failed"
    for bad in (None, "", "//evil.example/ui/", "https://evil.example/ui/", "/jobs", "/ui\\x"):
        assert _safe_next(bad) == "/ui/"


def test_filters_no_index_serves_are_read_in_windows() -> None:
    assert JobFilter().bounded
    assert JobFilter(status=JobStatus.FAILED, name="k", queue="q").bounded
    assert JobFilter(status=JobStatus.QUEUED, name="k").bounded
    assert JobFilter(status=JobStatus.SUCCEEDED).bounded
    assert not JobFilter(name="k").bounded
    assert not JobFilter(queue="q").bounded
    assert not JobFilter(key="acme").bounded
    assert JobFilter(status=JobStatus.FAILED, key="acme").bounded
    assert not JobFilter(status=JobStatus.CANCELLED).bounded
    assert not JobFilter(status=JobStatus.SUCCEEDED, name="k").bounded


def test_time_bounds_are_the_smallest_uuidv7_of_their_millisecond() -> None:
    moment = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    floor = id_floor(moment)
    assert floor.int >> 80 == int(moment.timestamp() * 1000)
    assert floor.int & ((1 << 80) - 1) == 0


def test_a_short_search_offers_to_go_on_from_where_it_stopped() -> None:
    from uuid import UUID

    from pgfleet.service.console import pages
    from pgfleet.service.console.data import JobPage

    stop = UUID("01a22d79-0000-7000-8000-000000000000")
    now = datetime(2026, 1, 1, tzinfo=UTC)
    f = JobFilter(name="rare", since=datetime(2025, 12, 1, tzinfo=UTC))
    html = pages.jobs_page(
        pages.Frame("c", "Jobs", "jobs"), f, JobPage([], None, stop, 10_000), None, now
    )
    assert "searched only the 10,000 jobs before it" in html
    assert f'href="/ui/jobs?name=rare&amp;from=2025-12-01T00%3A00&amp;before={stop}"' in html
    assert "No job matches." in html
