"""Job spans cost nothing until the application installs a tracer provider."""

from __future__ import annotations

import pytest

from pgfleet._runtime import tracing
from pgfleet.testing import make_job


def test_no_span_is_opened_without_a_tracer_provider() -> None:
    pytest.importorskip("opentelemetry.trace")
    # The API's default provider is a proxy that records nothing: no span is
    # started per job (it cost a third of the worker's CPU per no-op job).
    assert tracing.current_tracer() is None


def test_a_span_is_opened_once_a_tracer_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    provider = sdk.TracerProvider()
    monkeypatch.setattr(tracing, "_tracer", lambda: provider.get_tracer("pgfleet"))
    tracer = tracing.current_tracer()
    assert tracer is not None
    with tracing.span(tracer, make_job("noop")) as span:
        assert span is not None and span.is_recording()
