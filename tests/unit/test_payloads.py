"""Typed payload decoding from the handler's annotation."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid
from typing import Any, Literal, NotRequired, TypedDict

import msgspec
import pydantic
import pytest

from pgfleet import PayloadDecodeError, PermanentError
from pgfleet.payloads import decoder_for, encode_payload


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Inner:
    n: int
    tags: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Outer:
    id: uuid.UUID
    at: dt.datetime
    inner: Inner
    color: Color
    maybe: int | None = None
    mode: Literal["a", "b"] = "a"


class Movie(TypedDict):
    title: str
    year: int
    note: NotRequired[str]


class Model(pydantic.BaseModel):
    x: int


class Struct(msgspec.Struct):
    x: int


def roundtrip(value: Any, annotation: Any) -> Any:
    import json

    return decoder_for(annotation)(json.loads(encode_payload(value)))


def test_dataclass_roundtrip() -> None:
    value = Outer(uuid.uuid4(), dt.datetime(2026, 1, 1, tzinfo=dt.UTC), Inner(3, ["a"]), Color.RED)
    assert roundtrip(value, Outer) == value


def test_typeddict_pydantic_msgspec_roundtrip() -> None:
    assert roundtrip(Movie(title="t", year=1999), Movie) == {"title": "t", "year": 1999}
    assert roundtrip(Model(x=1), Model) == Model(x=1)
    assert roundtrip(Struct(x=1), Struct) == Struct(x=1)


def test_untyped_annotations_pass_json_through() -> None:
    for annotation in (Any, dict, object):
        assert roundtrip({"a": [1]}, annotation) == {"a": [1]}


@pytest.mark.parametrize(
    ("value", "annotation", "message"),
    [
        ({"n": "x"}, Inner, r"payload.n: expected integer, got str"),
        ({"tags": []}, Inner, "missing field 'n' of Inner"),
        ({"n": 1, "zzz": 2}, Inner, r"unknown fields \['zzz'\] for Inner"),
        ([1], Inner, "expected object for Inner, got list"),
        ({"title": "t"}, Movie, r"missing keys \['year'\] of Movie"),
        ({"x": "nope"}, Model, "payload does not match Model"),
        ({"x": "nope"}, Struct, "payload does not match Struct"),
        ("2026-13-01", dt.datetime, "not a valid datetime"),
        ("green", Color, "'green' is not a valid Color"),
        (None, int, "expected integer, got null"),
        (True, int, "expected integer, got bool"),
        ("c", Literal["a", "b"], r"expected one of \['a', 'b'\]"),
    ],
)
def test_decode_failures_name_the_problem(value: Any, annotation: Any, message: str) -> None:
    with pytest.raises(PayloadDecodeError, match=message) as info:
        decoder_for(annotation)(value)
    # A payload that does not decode fails the job permanently.
    assert isinstance(info.value, PermanentError)


def test_optional_and_containers() -> None:
    assert decoder_for(int | None)(None) is None
    assert decoder_for(dict[str, list[int]])({"a": [1, 2]}) == {"a": [1, 2]}
    assert decoder_for(tuple[int, str])([1, "a"]) == (1, "a")
    assert decoder_for(set[int])([1, 1, 2]) == {1, 2}
    assert decoder_for(float)(3) == 3.0
