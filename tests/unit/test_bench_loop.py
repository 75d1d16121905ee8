"""The benchmarks' event loop choice (``--loop``, tools/bench/suite.py)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Iterator

import pytest
import uvloop

from tools.bench import suite


@pytest.fixture(autouse=True)
def _default_policy_after() -> Iterator[None]:
    yield
    asyncio.set_event_loop_policy(None)


async def _loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_uvloop_is_the_default_and_runs_the_next_asyncio_run() -> None:
    parser = argparse.ArgumentParser()
    suite.add_loop_argument(parser)
    assert parser.parse_args([]).loop == "uvloop"
    assert suite.install_loop("uvloop") == "uvloop"
    assert asyncio.run(_loop_type()) is uvloop.Loop


def test_asyncio_gives_back_the_standard_loop() -> None:
    suite.install_loop("uvloop")
    assert suite.install_loop("asyncio") == "asyncio"
    assert asyncio.run(_loop_type()) is not uvloop.Loop


def test_an_unknown_loop_is_refused_by_name() -> None:
    parser = argparse.ArgumentParser()
    suite.add_loop_argument(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--loop", "trio"])
    with pytest.raises(ValueError, match="trio"):
        suite.install_loop("trio")
