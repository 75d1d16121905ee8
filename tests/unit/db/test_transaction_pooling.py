"""Options for running behind a transaction-mode pooler, and the connection budget."""

from __future__ import annotations

import argparse

import pytest

from pgfleet import InvalidOptions, WorkerConfig
from pgfleet.db.transaction_pooling import connection_budget
from pgfleet.service import worker_cmd


def _args(monkeypatch: pytest.MonkeyPatch, *argv: str, **env: str) -> argparse.Namespace:
    for key, value in env.items():
        monkeypatch.setenv(f"PGFLEET_{key}", value)
    parser = argparse.ArgumentParser()
    worker_cmd.add_arguments(parser)
    return parser.parse_args(["--app", "x:y", "--dsn", "postgresql://a@b/c", *argv])


def test_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _args(monkeypatch, "--pgbouncer", "--listen-dsn", "postgresql://direct/db")
    config = worker_cmd.build_config(args)
    assert config.pgbouncer is True
    assert config.listen_dsn == "postgresql://direct/db"
    assert worker_cmd.build_config(_args(monkeypatch)).pgbouncer is False


def test_environment_sets_them(monkeypatch: pytest.MonkeyPatch) -> None:
    args = _args(monkeypatch, PGBOUNCER="1", LISTEN_DATABASE_URL="postgresql://secret:pw@direct/db")
    config = worker_cmd.build_config(args)
    assert config.pgbouncer and config.listen_dsn == "postgresql://secret:pw@direct/db"
    # Children get the listen DSN through the environment, never on the command line.
    argv = worker_cmd.child_argv(args, 0)
    assert "--pgbouncer" in argv
    assert not any("secret" in part for part in argv)
    assert worker_cmd.child_env(args)["PGFLEET_LISTEN_DATABASE_URL"].endswith("@direct/db")


@pytest.mark.parametrize("value", ["", "  ", 5])
def test_listen_dsn_must_be_a_connection_string(value: object) -> None:
    with pytest.raises(InvalidOptions, match="listen_dsn"):
        WorkerConfig(listen_dsn=value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("listener", "processes", "total", "words"),
    [
        ("pool", 1, 20, "listener 0 (one of the pool's)"),
        ("own", 1, 21, "listener 1 (--listen-dsn)"),
        ("none", 1, 20, "listener 0 (polling)"),
        ("own", 3, 63, "3 processes: 63"),
    ],
)
def test_connection_budget(listener: str, processes: int, total: int, words: str) -> None:
    got, text = connection_budget(
        pool_size=20, listener=listener, metrics=True, processes=processes
    )
    assert got == total
    assert words in text
    assert text.startswith(f"{total // processes} per process: pool 20")
