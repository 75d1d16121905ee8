"""Job names on the command line: ``--job-names`` and ``--backlog-cap-per-name``, with
the older ``kind`` spellings still honoured (they name the same thing)."""

from __future__ import annotations

import pytest

from pgfleet.cli import build_parser
from pgfleet.service import api_cmd, worker_cmd

DSN = "postgresql://app@db:5432/app"
ENV = ("PGFLEET_JOB_NAMES", "PGFLEET_KINDS")
API_ENV = ("PGFLEET_API_BACKLOG_CAP_PER_NAME", "PGFLEET_API_BACKLOG_CAP_PER_KIND")


def _served(*flags: str) -> object:
    args = build_parser().parse_args(["worker", "--dsn", DSN, *flags])
    return worker_cmd.build_config(args).job_names


def _per_name_cap(*flags: str) -> int:
    args = build_parser().parse_args(["api", "--dsn", DSN, *flags])
    api_cmd._check(args)
    cap: int = api_cmd.build_config(args).backlog_cap_per_name
    return cap


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV + API_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("flag", ["--job-names", "--kinds"])
def test_worker_serves_the_named_jobs(flag: str) -> None:
    assert _served(flag, "a,b") == frozenset({"a", "b"})


def test_worker_job_names_come_from_either_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _served() is None
    monkeypatch.setenv("PGFLEET_KINDS", "old")
    assert _served() == frozenset({"old"})
    monkeypatch.setenv("PGFLEET_JOB_NAMES", "new")
    assert _served() == frozenset({"new"}), "the current spelling wins"


@pytest.mark.parametrize("flag", ["--backlog-cap-per-name", "--backlog-cap-per-kind"])
def test_api_per_name_cap_takes_either_flag(flag: str) -> None:
    assert _per_name_cap() == 0
    assert _per_name_cap(flag, "5") == 5


def test_api_per_name_cap_comes_from_either_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGFLEET_API_BACKLOG_CAP_PER_KIND", "7")
    assert _per_name_cap() == 7
    monkeypatch.setenv("PGFLEET_API_BACKLOG_CAP_PER_NAME", "9")
    assert _per_name_cap() == 9, "the current spelling wins"
