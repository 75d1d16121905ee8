"""The contender and phase selection of tools/bench/peers.py."""

from __future__ import annotations

import pytest

from tools.bench import peers


def contenders(text: str) -> list[str]:
    return peers.selection(text, peers.CONTENDERS, peers._CONTENDER_GROUPS)


def phases(text: str) -> list[str]:
    return peers.selection(text, peers.PHASES, peers._PHASE_GROUPS)


def test_groups_expand_and_the_order_is_the_tables() -> None:
    assert contenders("graphile,pgfleet") == ["pgfleet", "graphile-default", "graphile-batched"]
    assert contenders("all") == list(peers.CONTENDERS)
    assert phases("drain-c64, enqueue-single") == ["enqueue-single", "drain-c64"]
    assert phases("drain") == ["drain-c1", "drain-c16", "drain-c64"]
    assert phases("latency,drain-c1") == ["drain-c1", "latency-plain", "latency-stale"]


@pytest.mark.parametrize("text", ["pgfleet,graphile-fast", "", " , "])
def test_an_unknown_or_empty_selection_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="graphile-fast|empty"):
        contenders(text)


def test_the_cli_names_what_it_does_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        peers.cli(["--dsn", "postgresql://x/y", "--phases", "drain-c32"])
    assert "unknown 'drain-c32'" in capsys.readouterr().err
