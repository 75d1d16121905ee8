"""The compose smoke test reports its steps live and their timings at the end."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.compose.stack import Steps

_STEPS: list[Steps] = []


@pytest.fixture
def steps(request: pytest.FixtureRequest) -> Steps:
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")

    def report(line: str) -> None:
        print(line, flush=True)  # kept with the test's output when it fails
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)

    recorder = Steps(report)
    _STEPS.append(recorder)
    return recorder


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    write: Callable[..., None] = terminalreporter.write_line
    for recorder in _STEPS:
        if not recorder.done:
            continue
        terminalreporter.section("compose smoke test: steps and timings")
        for name, seconds in recorder.done:
            write(f"{seconds:7.1f} s  {name}")
        write(f"{sum(s for _n, s in recorder.done):7.1f} s  total")
        for note in recorder.notes:
            write(note)
