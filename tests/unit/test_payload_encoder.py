"""The fast JSON encoder (orjson, when installed) against the standard library's:
the same JSON values and the same errors for whatever payloads and results hold."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import math
import random
import uuid
from collections import OrderedDict
from typing import Any

import pytest

from pgfleet import payloads
from pgfleet.errors import PayloadError
from pgfleet.payloads import encode_payload, encode_result

orjson = pytest.importorskip("orjson")


class Color(enum.Enum):
    RED = "red"
    WHEN = dt.date(2026, 12, 7)


class Level(enum.IntEnum):
    HIGH = 3


class Tag(str):
    pass


@dataclasses.dataclass
class Point:
    x: int
    at: dt.datetime


def _corpus() -> list[Any]:
    rng = random.Random(7)
    values: list[Any] = [
        None,
        True,
        {"a": 1, "b": [1, 2.5, -0.0, 1e16, 1e300, 5e-324], "c": {"d": None}},
        {"text": 'é\u2028\x7f\x1f\n\t"\\/ \U0001f600'},
        {"nested": [[[[]]]], "empty": {}, "s": ""},
        (1, "two", 3.0),
        2**63 - 1,
        -(2**63),
        2**64 - 1,
        2**64,  # beyond orjson's integers
        2**200,
        {1: "int key", None: "null key", 2.5: "float key", False: "bool key"},
        {"set": {3, 1, 2}, "frozen": frozenset({"b", "a"})},
        dt.datetime(2026, 12, 7, 22, 53, 29, 123456, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 7, 22, 53),
        dt.date(2026, 12, 7),
        dt.time(1, 2, 3),
        uuid.UUID("0193a4f2-7b5e-7c3d-9a1b-2c3d4e5f6a7b"),
        decimal.Decimal("1.10"),
        Color.RED,
        Color.WHEN,
        Level.HIGH,
        Tag("a str subclass"),
        {Tag("key"): 1},
        OrderedDict(b=1, a=2),
        Point(1, dt.datetime(2026, 1, 1, tzinfo=dt.UTC)),
        {"rows": [{"id": i, "sku": f"SKU-{i:06d}", "qty": i % 7} for i in range(50)]},
        "a text that says null",
        {"deep": _nest(300)},
    ]
    for _ in range(100):
        values.append(rng.random() * 10 ** rng.randint(-30, 30))
        values.append(rng.getrandbits(64) - 2**63)
        values.append("".join(chr(rng.randint(1, 0x2FFF)) for _ in range(12)))
    return [
        v for v in values if not (isinstance(v, str) and "\ud800" <= max(v, default="") < "\ue000")
    ]


def _nest(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _outcome(encode: Any, value: Any) -> tuple[str, Any]:
    try:
        return "ok", encode(value)
    except PayloadError as exc:
        return "error", str(exc)


def test_the_fast_encoder_is_orjson_when_it_is_installed() -> None:
    assert payloads._encode is not payloads._stdlib_encode


@pytest.mark.parametrize("value", _corpus(), ids=lambda v: type(v).__name__)
def test_fast_and_standard_encoders_agree(value: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _outcome(encode_payload, value)
    monkeypatch.setattr(payloads, "_encode", payloads._stdlib_encode)
    standard = _outcome(encode_payload, value)
    assert fast[0] == standard[0] == "ok"
    # Floats may be written differently (1e-07 or 1e-7): the values are the same,
    # and every other text is identical.
    assert json.loads(fast[1]) == json.loads(standard[1])
    if "e-" not in standard[1] and "e+" not in standard[1]:
        assert fast[1] == standard[1]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"x": math.nan}, "Out of range float values"),
        ([1.0, math.inf], "Out of range float values"),
        ({"x": -math.inf, "y": None}, "Out of range float values"),
        ({"x": object()}, "not JSON-encodable"),
        ({"text": "a\x00b"}, "NUL character"),
        ({"text": "lone \udc80 surrogate"}, "lone surrogate (U+DC80)"),
    ],
)
def test_what_the_standard_encoder_refuses_the_fast_one_refuses_alike(
    value: Any, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _outcome(encode_result, value)
    monkeypatch.setattr(payloads, "_encode", payloads._stdlib_encode)
    standard = _outcome(encode_result, value)
    assert fast == standard
    assert fast[0] == "error" and says in fast[1], fast


def test_a_cycle_is_refused_by_both(monkeypatch: pytest.MonkeyPatch) -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(PayloadError, match="cannot be encoded as JSON"):
        encode_payload(cycle)
    monkeypatch.setattr(payloads, "_encode", payloads._stdlib_encode)
    with pytest.raises(PayloadError, match="cannot be encoded as JSON"):
        encode_payload(cycle)


def test_a_result_never_holds_the_round_separator() -> None:
    # Results travel joined by U+001E: JSON escapes control characters in strings.
    text = encode_result({"a\x1eb": "c\x1ed"})
    assert "\x1e" not in text
    assert json.loads(text) == {"a\x1eb": "c\x1ed"}
