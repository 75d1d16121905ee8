"""``pgfleet worker``'s flags come from one table of WorkerConfig fields: defaults from
the dataclass, a ``PGFLEET_*`` variable each (the flag wins), and the supervisor's
children get the same configuration back."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pgfleet import WorkerConfig
from pgfleet.config import WORKER_OPTIONS
from pgfleet.service import worker_cmd

DSN = "postgresql://app:pw@db/app"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    worker_cmd.add_arguments(parser)
    return parser


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in WORKER_OPTIONS:
        monkeypatch.delenv(option.variable, raising=False)


def test_no_flag_gives_the_dataclass_defaults() -> None:
    args = _parser().parse_args(["--dsn", DSN])
    assert worker_cmd.build_config(args) == WorkerConfig()


def test_every_option_names_a_field_once() -> None:
    fields = {f.name for f in dataclasses.fields(WorkerConfig)}
    names = [o.field for o in WORKER_OPTIONS]
    assert set(names) <= fields
    assert len(set(names)) == len(names)
    assert len({o.flag for o in WORKER_OPTIONS}) == len({o.env for o in WORKER_OPTIONS})


def test_help_lists_every_flag_and_variable() -> None:
    text = _parser().format_help()
    for option in WORKER_OPTIONS:
        assert option.flag in text
        assert option.variable in text.replace("\n", "").replace(" ", "")


def test_variables_set_options_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGFLEET_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("PGFLEET_RETENTION_DAYS", "0")
    monkeypatch.setenv("PGFLEET_NO_LISTEN", "1")
    monkeypatch.setenv("PGFLEET_KINDS", "a, b")
    config = worker_cmd.build_config(_parser().parse_args(["--poll-interval", "3"]))
    assert config.poll_interval == 3.0
    assert config.finished_job_retention is None
    assert config.listen is False
    assert config.job_names == frozenset({"a", "b"})


def test_prefetch_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGFLEET_PREFETCH", "0")
    config = worker_cmd.build_config(_parser().parse_args(["--prefetch-window", "0.2"]))
    assert (config.prefetch, config.prefetch_window) == (0, 0.2)


@pytest.mark.parametrize("value", ["", "0", "false", "no", " NO "])
def test_off_words_leave_a_switch_off(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("PGFLEET_NO_LISTEN", value)
    assert worker_cmd.build_config(_parser().parse_args([])).listen is True


def test_children_get_the_same_configuration() -> None:
    argv = [
        "--dsn", DSN, "--app", "m:r", "--processes", "3", "--metrics-port", "9000",
        "--concurrency", "7", "--default-timeout", "0", "--retention-days", "0.5",
        "--kinds", "a,b", "--vacuum", "never", "--no-listen", "--pgbouncer",
        "--listen-dsn", "postgresql://u:secret@direct/app", "--backoff-cap", "0.1", "--backoff-base", "0.05",
    ]  # fmt: skip
    args = _parser().parse_args(argv)
    worker_cmd._check_numbers(args)
    child = worker_cmd.child_argv(args, 2)
    env = worker_cmd.child_env(args)
    assert child[child.index("--metrics-port") + 1] == "9002"
    assert child[child.index("--processes") + 1] == "1"
    assert not any("secret" in part or "pw@" in part for part in child)
    assert env["PGFLEET_DATABASE_URL"] == DSN
    assert env["PGFLEET_LISTEN_DATABASE_URL"] == "postgresql://u:secret@direct/app"
    with pytest.MonkeyPatch.context() as patch:
        for key in ("PGFLEET_DATABASE_URL", "PGFLEET_LISTEN_DATABASE_URL"):
            patch.setenv(key, env[key])
        again = _parser().parse_args(child[child.index("worker") + 1 :])
    assert worker_cmd.build_config(again) == worker_cmd.build_config(args)
    assert (again.app, again.dsn, again.pool_size) == ("m:r", DSN, 0)
