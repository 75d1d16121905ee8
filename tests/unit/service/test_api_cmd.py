"""``pgfleet api`` options that need no server: the notification mode of its Queue."""

from __future__ import annotations

from typing import cast

import pytest

from pgfleet import NotifyMode
from pgfleet.cli import build_parser
from pgfleet.db.deadlines import AppPool
from pgfleet.service import api_cmd
from pgfleet.service.process import UsageError

DSN = "postgresql://app@db:5432/app"


def _queue_for(*flags: str) -> object:
    args = build_parser().parse_args(["api", "--dsn", DSN, *flags])
    api_cmd._check(args)
    # No database is reached: the queue is only inspected.
    return api_cmd.make_queue(cast(AppPool, None), args, api_cmd.build_config(args))


def test_the_api_coalesces_notifications_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGFLEET_API_NOTIFY", raising=False)
    assert _queue_for().notify_mode is NotifyMode.COALESCED  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", list(NotifyMode))
def test_notify_flag_sets_the_queue_mode(mode: NotifyMode) -> None:
    assert _queue_for("--notify", mode.value).notify_mode is mode  # type: ignore[attr-defined]


def test_notify_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGFLEET_API_NOTIFY", "transaction")
    assert _queue_for().notify_mode is NotifyMode.TRANSACTION  # type: ignore[attr-defined]
    assert _queue_for("--notify", "off").notify_mode is NotifyMode.OFF  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["sometimes", "", "TRANSACTION"])
def test_unknown_notify_mode_is_refused_naming_the_choices(value: str) -> None:
    args = build_parser().parse_args(["api", "--dsn", DSN, "--notify", value])
    with pytest.raises(UsageError, match="--notify must be one of coalesced, transaction, off"):
        api_cmd._check(args)
