"""Payload encoding at enqueue and typed decoding for handlers.

A payload is any JSON value, a dataclass, a TypedDict, a pydantic model or a msgspec
Struct (and datetimes, dates, UUIDs, Decimals and Enums inside them). The handler's
annotation decides how the stored JSON is decoded; a value that does not fit fails
the job permanently with :class:`PayloadDecodeError`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import json
import re
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pgfleet.errors import PayloadDecodeError, PayloadError, PayloadTooLarge

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

Decoder = Callable[[Any], Any]


# ---------------------------------------------------------------- encoding


def _to_json_value(obj: Any) -> Any:
    """``default`` hook of the encoder: turn a non-JSON object into JSON values."""
    cls = type(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(cls, "__struct_fields__"):  # msgspec.Struct
        import msgspec

        return msgspec.to_builtins(obj)
    dump = getattr(obj, "model_dump", None)
    if dump is not None and callable(dump):  # pydantic v2
        return dump(mode="json")
    if isinstance(obj, dt.datetime | dt.date | dt.time):
        return obj.isoformat()
    if isinstance(obj, uuid.UUID | decimal.Decimal):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    raise TypeError(f"objects of type {cls.__module__}.{cls.__qualname__} are not JSON-encodable")


def _make_encoder() -> Callable[[Any], str]:
    # The C encoder called directly: json.dumps with options builds a new encoder
    # object per call, which costs more than encoding a small payload. Circular
    # references surface as RecursionError instead of a marker check.
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # pragma: no cover - CPython always has it
        return json.JSONEncoder(
            ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_to_json_value
        ).encode
    chunks = c_make_encoder(
        None, _to_json_value, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


_stdlib_encode = _make_encoder()


def _make_fast_encoder() -> Callable[[Any], str] | None:
    # orjson, when installed (the service extra brings it), for the values it
    # encodes as the standard library does: JSON's own types with string keys. It
    # refuses whatever else it meets (datetimes, dataclasses, subclasses, other
    # keys, integers over 64 bits, lone surrogates, nesting over 254 levels), and
    # the standard encoder then takes the whole value, so the JSON and every error
    # stay the same (a float may be spelled differently: 1e-7 for 1e-07). It writes
    # NaN and the infinities as null where the standard encoder refuses them, so a
    # text with a null in it is encoded again by the standard encoder.
    try:
        import orjson
    except ImportError:
        return None
    dumps = orjson.dumps
    options = (
        orjson.OPT_PASSTHROUGH_DATACLASS
        | orjson.OPT_PASSTHROUGH_DATETIME
        | orjson.OPT_PASSTHROUGH_SUBCLASS
    )

    def encode(value: Any) -> str:
        try:
            data = dumps(value, option=options)
        except TypeError:  # orjson.JSONEncodeError is one
            return _stdlib_encode(value)
        if b"null" in data:  # NaN or an infinity, or a None
            return _stdlib_encode(value)
        return data.decode()

    return encode


_encode = _make_fast_encoder() or _stdlib_encode

_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _encode_checked(value: Any) -> str:
    try:
        text = _encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"payload cannot be encoded as JSON: {exc}") from None
    # Postgres jsonb cannot store U+0000 inside strings, nor UTF-8 lone surrogates.
    if "\\u0000" in text and _NUL_ESCAPE.search(text):
        raise PayloadError("payload contains a NUL character (U+0000), which jsonb cannot store")
    if text.isascii():
        return text
    found = _SURROGATE.search(text)
    if found is not None:
        raise PayloadError(
            f"payload contains a lone surrogate (U+{ord(found.group()):04X}), which is not "
            "valid Unicode and cannot be stored: decode its bytes as UTF-8 (or encode them, "
            "e.g. as base64) before enqueueing"
        )
    return text


def _check_size(text: str, max_bytes: int) -> None:
    # Each character is at most 4 UTF-8 bytes: only long texts need measuring.
    if len(text) * 4 > max_bytes:
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes encoded, over the limit of {max_bytes} bytes"
            )


def encode_payload(payload: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode a payload to JSON text, or raise PayloadError naming the problem."""
    text = _encode_checked(payload)
    _check_size(text, max_bytes)
    return text


#: Largest handler result stored with a job (encoded JSON, UTF-8 bytes): results
#: ride in the completion round and every read of the job.
MAX_RESULT_BYTES = 256 * 1024


def encode_result(value: Any, max_bytes: int = MAX_RESULT_BYTES) -> str:
    """A handler's return value as JSON text for the job's ``result``, or
    PayloadError saying why it cannot be stored."""
    try:
        text = _encode_checked(value)
    except PayloadError as exc:
        raise PayloadError(str(exc).replace("payload", "result", 1)) from None
    if len(text) * 4 > max_bytes:
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise PayloadTooLarge(
                f"result is {size} bytes encoded, over the limit of {max_bytes} bytes"
            )
    return text


def encode_payload_array(payloads: list[Any], max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> str:
    """Encode many payloads as one JSON array text, each checked as encode_payload
    would: one C-level call for the common batch instead of one per payload."""
    try:
        text = _encode_checked(payloads)
    except PayloadError:
        text = ""  # find and name the offending payload below
    if text and len(text) * 4 <= max_bytes:
        return text  # the whole array fits, so every payload in it does
    return "[" + ",".join(encode_payload(p, max_bytes) for p in payloads) + "]"


# ---------------------------------------------------------------- text

_SURROGATE = re.compile("[\ud800-\udfff]")


def storable_text(text: str) -> str:
    """``text`` as Postgres can store it: a NUL becomes the four characters ``\\x00``
    and a lone surrogate (from bytes decoded with ``surrogateescape``, say) its
    ``\\udcff`` escape. Anything else is left as it is."""
    if text.isascii():
        return text.replace("\x00", "\\x00") if "\x00" in text else text
    text = text.replace("\x00", "\\x00")
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def describe_error(error: BaseException, limit: int) -> str:
    """``Type: message`` of an exception, storable and at most ``limit`` characters,
    even when its ``__str__`` fails or returns something that is not text."""
    try:
        detail = str(error)
    except Exception:
        try:
            detail = repr(error)
        except Exception:
            detail = "<unprintable exception>"
    if len(detail) > limit:
        detail = detail[:limit]
    return storable_text(f"{type(error).__name__}: {detail}")[:limit]


# ---------------------------------------------------------------- decoding


def _identity(value: Any) -> Any:
    return value


def decoder_for(annotation: Any) -> Decoder:
    """A function turning a stored JSON value into ``annotation``'s type."""
    if annotation in (Any, object, None, typing.Any) or annotation is dataclasses.MISSING:
        return _identity
    pydantic_validate = getattr(annotation, "model_validate", None)
    if isinstance(annotation, type) and pydantic_validate is not None:

        def decode_pydantic(value: Any) -> Any:
            try:
                return pydantic_validate(value)
            except Exception as exc:
                raise PayloadDecodeError(
                    f"payload does not match {annotation.__name__}: {exc}"
                ) from None

        return decode_pydantic
    if isinstance(annotation, type) and hasattr(annotation, "__struct_fields__"):
        import msgspec

        def decode_msgspec(value: Any) -> Any:
            try:
                return msgspec.convert(value, annotation)
            except msgspec.ValidationError as exc:
                raise PayloadDecodeError(
                    f"payload does not match {annotation.__name__}: {exc}"
                ) from None

        return decode_msgspec

    def decode(value: Any) -> Any:
        return _convert(value, annotation, "payload")

    return decode


def _fail(path: str, expected: str, value: Any) -> PayloadDecodeError:
    return PayloadDecodeError(f"{path}: expected {expected}, got {_describe(value)}")


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    return type(value).__name__


def _convert(value: Any, tp: Any, path: str) -> Any:  # noqa: C901 - type dispatch, a branch per kind
    if tp in (Any, object, typing.Any):
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _convert(value, args[0], path)
    if tp is None or tp is type(None):
        if value is not None:
            raise _fail(path, "null", value)
        return None
    if origin in (typing.Union, types.UnionType):
        return _convert_union(value, args, path)
    if origin is typing.Literal:
        if value not in args:
            raise PayloadDecodeError(f"{path}: expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _convert_dataclass(value, tp, path)
    if _is_typeddict(tp):
        return _convert_typeddict(value, tp, path)
    if origin in (list, Sequence, typing.Sequence) or tp in (list, Sequence):
        if not isinstance(value, list):
            raise _fail(path, "array", value)
        item = args[0] if args else Any
        return [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is tuple or tp is tuple:
        if not isinstance(value, list):
            raise _fail(path, "array", value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise PayloadDecodeError(f"{path}: expected {len(args)} items, got {len(value)}")
        kinds = args or (Any,) * len(value)
        pairs = enumerate(zip(value, kinds, strict=True))
        return tuple(_convert(v, k, f"{path}[{i}]") for i, (v, k) in pairs)
    if origin in (set, frozenset) or tp in (set, frozenset):
        if not isinstance(value, list):
            raise _fail(path, "array", value)
        item = args[0] if args else Any
        made = [_convert(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        return (origin or tp)(made)
    if origin in (dict, Mapping, typing.Mapping) or tp in (dict, Mapping):
        if not isinstance(value, dict):
            raise _fail(path, "object", value)
        val_tp = args[1] if len(args) == 2 else Any
        return {k: _convert(v, val_tp, f"{path}.{k}") for k, v in value.items()}
    if isinstance(tp, type):
        return _convert_scalar(value, tp, path)
    return value


def _convert_union(value: Any, args: tuple[Any, ...], path: str) -> Any:
    if value is None and type(None) in args:
        return None
    errors: list[str] = []
    for option in args:
        if option is type(None):
            continue
        try:
            return _convert(value, option, path)
        except PayloadDecodeError as exc:
            errors.append(str(exc))
    raise PayloadDecodeError("; ".join(errors) or f"{path}: no union member matched")


def _convert_scalar(value: Any, tp: type, path: str) -> Any:  # noqa: C901 - type dispatch, a branch per type
    if tp is bool:
        if not isinstance(value, bool):
            raise _fail(path, "boolean", value)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise _fail(path, "integer", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(path, "number", value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise _fail(path, "string", value)
        return value
    if issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise PayloadDecodeError(f"{path}: {value!r} is not a valid {tp.__name__}") from None
    parsers: dict[type, Callable[[Any], Any]] = {
        dt.datetime: dt.datetime.fromisoformat,
        dt.date: dt.date.fromisoformat,
        dt.time: dt.time.fromisoformat,
        uuid.UUID: uuid.UUID,
        decimal.Decimal: decimal.Decimal,
    }
    parser = parsers.get(tp)
    if parser is not None:
        if tp is decimal.Decimal and isinstance(value, int | float) and not isinstance(value, bool):
            return decimal.Decimal(str(value))
        if not isinstance(value, str):
            raise _fail(path, tp.__name__, value)
        try:
            return parser(value)
        except (ValueError, decimal.InvalidOperation):
            raise PayloadDecodeError(f"{path}: {value!r} is not a valid {tp.__name__}") from None
    if isinstance(value, tp):
        return value
    raise _fail(path, tp.__name__, value)


def _hints(tp: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(tp, include_extras=True)
    except Exception as exc:  # unresolvable forward references
        raise PayloadDecodeError(f"cannot resolve the annotations of {tp!r}: {exc}") from None


def _convert_dataclass(value: Any, tp: type, path: str) -> Any:
    if not isinstance(value, dict):
        raise _fail(path, f"object for {tp.__name__}", value)
    hints = _hints(tp)
    kwargs: dict[str, Any] = {}
    known = set()
    for f in dataclasses.fields(tp):
        known.add(f.name)
        if not f.init:
            continue
        if f.name in value:
            kwargs[f.name] = _convert(value[f.name], hints.get(f.name, Any), f"{path}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise PayloadDecodeError(f"{path}: missing field {f.name!r} of {tp.__name__}")
    unknown = set(value) - known
    if unknown:
        raise PayloadDecodeError(f"{path}: unknown fields {sorted(unknown)} for {tp.__name__}")
    try:
        return tp(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PayloadDecodeError(f"{path}: cannot build {tp.__name__}: {exc}") from None


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")


def _convert_typeddict(value: Any, tp: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise _fail(path, f"object for {tp.__name__}", value)
    hints = _hints(tp)
    # Derived from the resolved hints: under `from __future__ import annotations`
    # Python 3.11 cannot see NotRequired[...] when it builds __required_keys__.
    total = getattr(tp, "__total__", True)
    required = set()
    for key, hint in hints.items():
        origin = typing.get_origin(hint)
        if origin is typing.Required or (total and origin is not typing.NotRequired):
            required.add(key)
    missing = required - value.keys()
    if missing:
        raise PayloadDecodeError(f"{path}: missing keys {sorted(missing)} of {tp.__name__}")
    out = dict(value)
    for key, hint in hints.items():
        if key in value:
            inner = hint
            if typing.get_origin(hint) in (typing.Required, typing.NotRequired):
                inner = typing.get_args(hint)[0]
            out[key] = _convert(value[key], inner, f"{path}.{key}")
    return out
