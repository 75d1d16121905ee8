"""What the HTTP jobs API accepts: request bodies and query strings turned into
library values, or a :class:`RequestError` naming the problem. No I/O here.

Every refusal happens before anything is written, and names the offending field
with a path such as ``jobs[3].options.delay``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pgfleet.errors import PayloadDecodeError, PayloadTooLarge, ValidationError
from pgfleet.jobs import DEFAULT_OPTIONS, EnqueueOptions, EnqueueRequest, JobStatus, validate_name
from pgfleet.limits import LimitSpec, check_target
from pgfleet.payloads import encode_payload

JOB_FIELDS = frozenset({"name", "payload", "options"})
OPTION_FIELDS = frozenset(
    {
        "run_at",
        "delay",
        "priority",
        "max_attempts",
        "queue_name",
        "job_key",
        "job_key_mode",
        "limit_key",
        "after",
        "run_anyway",
    }
)
LIMIT_FIELDS = frozenset({"concurrency", "rate", "per", "per_key"})
PAUSE_FIELDS = frozenset({"name", "queue_name"})
BATCH_FIELDS = frozenset({"jobs", "callback"})
LIST_PARAMS = frozenset({"status", "name", "limit"})
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 1000

# RFC 3339 date-time: a full date, a time with seconds, and a mandatory offset.
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})", re.ASCII
)

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")

# The JSON type each option must have (checked before the library checks ranges,
# so that messages speak JSON rather than Python).
_OPTION_TYPES: dict[str, tuple[str, tuple[type, ...]]] = {
    "run_at": ("an RFC 3339 date-time string with an offset", (str,)),
    "delay": ("a number of seconds", (int, float)),
    "priority": ("an integer", (int,)),
    "max_attempts": ("an integer", (int,)),
    "queue_name": ("a string", (str,)),
    "job_key": ("a string", (str,)),
    "job_key_mode": ("a string", (str,)),
    "limit_key": ("a string", (str,)),
    "after": ("an array of job ids and indexes of jobs of the same batch", (list,)),
    "run_anyway": ("a boolean", (bool,)),
}

_LIMIT_TYPES: dict[str, tuple[str, tuple[type, ...]]] = {
    "concurrency": ("an integer", (int,)),
    "rate": ("an integer", (int,)),
    "per": ("a number of seconds", (int, float)),
    "per_key": ("a boolean", (bool,)),
}


class RequestError(Exception):
    """A request refused with ``status``; becomes ``{"error": ..., "detail": ...}``."""

    def __init__(
        self,
        status: int,
        message: str,
        detail: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.detail = dict(detail) if detail else None
        self.headers = dict(headers) if headers else {}

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message}
        if self.detail is not None:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits an enqueue request is checked against."""

    max_batch: int = 1000
    max_payload_bytes: int = 1024 * 1024
    #: Strict mode: the job names that have handlers (None: any valid name).
    known_names: frozenset[str] | None = None
    #: Per job name, the handler's payload decoder: a payload it cannot decode is
    #: refused at the door instead of failing at the worker (None: no check).
    decoders: Mapping[str, Callable[[Any], Any]] | None = None
    #: The longest long poll of ``GET /jobs/{id}?wait=`` (0: none).
    max_wait: int = 60


@dataclass(frozen=True, slots=True)
class EnqueueBody:
    requests: list[EnqueueRequest]
    #: True for ``{"jobs": [...]}`` (answered with a list, even of one job).
    batch: bool


@dataclass(frozen=True, slots=True)
class ListQuery:
    status: JobStatus | None = None
    name: str | None = None
    limit: int = DEFAULT_LIST_LIMIT


# ---------------------------------------------------------------- body


def check_content_type(content_type: str, charset: str | None) -> None:
    """Accept ``application/json`` (or any ``+json`` type) in UTF-8 only."""
    ct = content_type.lower()
    if ct != "application/json" and not (ct.startswith("application/") and ct.endswith("+json")):
        shown = content_type or "none"
        raise RequestError(
            415,
            f"unsupported content type {shown!r}: send the body as application/json",
            {"content_type": content_type or None},
        )
    if charset is not None and charset.lower().replace("_", "-") not in ("utf-8", "utf8"):
        raise RequestError(
            415, f"unsupported charset {charset!r}: JSON bodies must be UTF-8", {"charset": charset}
        )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_json(raw: bytes) -> Any:
    """The JSON document in ``raw``; 400 when it is not UTF-8 JSON."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(400, f"malformed JSON: the body is not UTF-8 ({exc.reason})") from None
    if not text.strip():
        raise RequestError(400, "malformed JSON: the body is empty")
    try:
        doc = json.loads(text, parse_constant=_refuse_constant)
        if _SURROGATE_ESCAPE.search(text):
            # A lone \ud800-style escape decodes, but cannot be stored as UTF-8.
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        return doc
    except UnicodeEncodeError:
        raise RequestError(
            400, "malformed JSON: a string holds an unpaired UTF-16 surrogate escape"
        ) from None
    except json.JSONDecodeError as exc:
        raise RequestError(
            400,
            f"malformed JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
            {"line": exc.lineno, "column": exc.colno},
        ) from None
    except ValueError as exc:  # NaN / Infinity
        raise RequestError(400, f"malformed JSON: {exc}") from None
    except RecursionError:
        raise RequestError(400, "malformed JSON: nested too deeply") from None


def parse_enqueue(doc: Any, limits: Limits) -> EnqueueBody:
    """``{"name", "payload", "options"}`` or ``{"jobs": [...]}`` as enqueue requests."""
    if not isinstance(doc, dict):
        raise RequestError(
            422,
            f"the body must be a JSON object, got {json_type(doc)}",
            {"expected": "object"},
        )
    if "jobs" not in doc:
        return EnqueueBody([parse_job(doc, "", limits)], batch=False)
    _refuse_unknown(doc, frozenset({"jobs"}), "", hint="a batch body has only 'jobs'")
    items = doc["jobs"]
    if not isinstance(items, list):
        raise _invalid("jobs", f"must be an array of jobs, got {json_type(items)}")
    if not items:
        raise _invalid("jobs", "must not be empty")
    if len(items) > limits.max_batch:
        raise RequestError(
            413,
            f"a batch of {len(items)} jobs is over the limit of {limits.max_batch} per request",
            {"field": "jobs", "count": len(items), "max_batch": limits.max_batch},
        )
    requests = [parse_job(item, f"jobs[{i}].", limits) for i, item in enumerate(items)]
    _refuse_repeated_keys(requests)
    return EnqueueBody(requests, batch=True)


def parse_batch(doc: Any, limits: Limits) -> tuple[list[EnqueueRequest], EnqueueRequest]:
    """``{"jobs": [...], "callback": {...}}``: a batch's members and its callback."""
    if not isinstance(doc, dict):
        raise RequestError(
            422, f"the body must be a JSON object, got {json_type(doc)}", {"expected": "object"}
        )
    _refuse_unknown(doc, BATCH_FIELDS, "")
    if "callback" not in doc:
        raise _invalid("callback", "is required")
    members = parse_enqueue({"jobs": doc.get("jobs")}, limits).requests
    if len(members) >= limits.max_batch:
        raise RequestError(
            413,
            f"a batch of {len(members)} jobs and its callback is over the limit of "
            f"{limits.max_batch} per request",
            {"field": "jobs", "count": len(members) + 1, "max_batch": limits.max_batch},
        )
    callback = parse_job(doc["callback"], "callback.", limits)
    if callback.options.after:
        raise _invalid("callback.options.after", "is set by the batch (every member)")
    if not (callback.payload is None or isinstance(callback.payload, dict)):
        raise _invalid("callback.payload", "must be a JSON object or null")
    return members, callback


def parse_job(obj: Any, path: str, limits: Limits) -> EnqueueRequest:
    where = path.rstrip(".") or "the body"
    if not isinstance(obj, dict):
        raise RequestError(
            422, f"{where} must be a JSON object, got {json_type(obj)}", {"field": where}
        )
    _refuse_unknown(obj, JOB_FIELDS, path)
    if "name" not in obj:
        raise _invalid(f"{path}name", "is required")
    name = obj["name"]
    try:
        validate_name(name)
    except ValidationError as exc:
        raise _invalid(f"{path}name", str(exc)) from None
    if limits.known_names is not None and name not in limits.known_names:
        raise _invalid(
            f"{path}name",
            f"unknown job name {name!r}: no handler is registered for it (strict mode)",
        )
    payload = obj.get("payload")
    try:
        encode_payload(payload, limits.max_payload_bytes)
    except PayloadTooLarge as exc:
        raise RequestError(413, f"{path}payload: {exc}", {"field": f"{path}payload"}) from None
    except ValidationError as exc:
        raise _invalid(f"{path}payload", str(exc)) from None
    decode = limits.decoders.get(name) if limits.decoders else None
    if decode is not None:
        try:
            decode(payload)
        except PayloadDecodeError as exc:
            raise _invalid(
                f"{path}payload",
                f"does not decode for the handler of {name!r}: {exc}",
            ) from None
    options = parse_options(obj.get("options"), f"{path}options")
    return EnqueueRequest(name, payload, options)


def parse_options(obj: Any, path: str) -> EnqueueOptions:
    if obj is None:
        return DEFAULT_OPTIONS
    if not isinstance(obj, dict):
        raise _invalid(path, f"must be a JSON object, got {json_type(obj)}")
    _refuse_unknown(obj, OPTION_FIELDS, f"{path}.")
    given: dict[str, Any] = {}
    for key, value in obj.items():
        if value is None:
            continue  # null means "the default"
        given[key] = _option_value(key, value, f"{path}.{key}")
    if not given:
        return DEFAULT_OPTIONS
    try:
        return EnqueueOptions(**given)
    except ValidationError as exc:  # combinations, e.g. run_at with delay
        raise _invalid(path, str(exc)) from None


def _option_value(key: str, value: Any, field: str) -> Any:
    """One enqueue option's JSON value, checked alone (so the error names its field)."""
    expected, types = _OPTION_TYPES[key]
    if key == "run_anyway":
        if not isinstance(value, bool):
            raise _invalid(field, f"must be {expected}, got {json_type(value)}")
        return value  # checked with after, by the caller's EnqueueOptions
    if isinstance(value, bool) or not isinstance(value, types):
        raise _invalid(field, f"must be {expected}, got {json_type(value)}")
    if key == "after" and isinstance(value, list):
        value = tuple(value)
        if any(isinstance(v, bool) or not isinstance(v, str | int) for v in value):
            raise _invalid(field, f"must be {expected}")
    if isinstance(value, str) and key == "run_at":
        value = parse_rfc3339(value, field)
    try:
        EnqueueOptions(**{key: value})
    except ValidationError as exc:
        raise _invalid(field, str(exc)) from None
    except OverflowError:
        raise _invalid(field, f"{value!r} is out of range") from None
    return value


def parse_rfc3339(text: str, field: str = "run_at") -> datetime:
    """An RFC 3339 date-time with an offset (``Z`` or ``±hh:mm``)."""
    if _RFC3339.fullmatch(text) is None:
        raise _invalid(
            field,
            f"{text[:40]!r} is not an RFC 3339 date-time with an offset "
            "(for example 2030-01-31T09:30:00Z or 2030-01-31T10:30:00+01:00)",
        )
    normal = text[:10] + "T" + text[11:]
    if normal[-1] in "Zz":
        normal = normal[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(normal)
        value.astimezone(UTC)  # representable in UTC (not year 1 at +01:00)
    except ValueError as exc:
        raise _invalid(field, f"{text[:40]!r} is not a valid date-time: {exc}") from None
    except OverflowError:
        raise _invalid(field, f"{text[:40]!r} is out of range") from None
    return value


def _refuse_repeated_keys(requests: list[EnqueueRequest]) -> None:
    first: dict[str, int] = {}
    for index, req in enumerate(requests):
        key = req.options.job_key
        if key is None:
            continue
        if key in first:
            raise RequestError(
                422,
                f"jobs[{index}].options.job_key: {key!r} is also the job_key of "
                f"jobs[{first[key]}]; a key may appear once per batch",
                {"field": f"jobs[{index}].options.job_key", "first_index": first[key]},
            )
        first[key] = index


def _refuse_unknown(
    obj: dict[str, Any], allowed: Collection[str], path: str, hint: str | None = None
) -> None:
    unknown = sorted(k for k in obj if k not in allowed)
    if not unknown:
        return
    where = path.rstrip(".") or "the body"
    known = ", ".join(sorted(allowed))
    message = f"unknown field{'s' if len(unknown) > 1 else ''} in {where}: {', '.join(unknown)}"
    message += f" ({hint})" if hint else f" (allowed: {known})"
    raise RequestError(
        422, message, {"unknown_fields": [path + k for k in unknown], "allowed": sorted(allowed)}
    )


def _invalid(field: str, problem: str) -> RequestError:
    return RequestError(422, f"{field}: {problem}", {"field": field})


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


# ---------------------------------------------------------------- query string


def parse_list_query(query: Mapping[str, str]) -> ListQuery:
    """``?status=&name=&limit=`` of ``GET /jobs``."""
    unknown = sorted(k for k in query if k not in LIST_PARAMS)
    if unknown:
        raise RequestError(
            422,
            f"unknown query parameter{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)} "
            f"(allowed: {', '.join(sorted(LIST_PARAMS))})",
            {"unknown_fields": unknown, "allowed": sorted(LIST_PARAMS)},
        )
    status = None
    if "status" in query:
        try:
            status = JobStatus.parse(query["status"])
        except ValidationError as exc:
            raise _invalid("status", str(exc)) from None
    name = query.get("name")
    if name is not None:
        try:
            validate_name(name)
        except ValidationError as exc:
            raise _invalid("name", str(exc)) from None
    limit = DEFAULT_LIST_LIMIT
    if "limit" in query:
        raw = query["limit"]
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
            raise _invalid("limit", f"must be an integer from 1 to {MAX_LIST_LIMIT}, got {raw!r}")
        limit = int(raw)
    return ListQuery(status, name, limit)


def parse_limits(doc: Any) -> LimitSpec:
    """The body of ``PUT /limits/{name}``: checked limit values (422 naming the field)."""
    if not isinstance(doc, dict):
        raise _invalid("the body", f"must be a JSON object, got {json_type(doc)}")
    _refuse_unknown(doc, LIMIT_FIELDS, "")
    given: dict[str, Any] = {}
    for key, value in doc.items():
        if value is None:
            continue
        expected, types = _LIMIT_TYPES[key]
        if (isinstance(value, bool) and key != "per_key") or not isinstance(value, types):
            raise _invalid(key, f"must be {expected}, got {json_type(value)}")
        given[key] = value
    try:
        return LimitSpec.check(**given)
    except ValidationError as exc:
        raise _invalid("the body", str(exc)) from None


def parse_pause(doc: Any) -> tuple[str | None, str | None]:
    """The body of ``POST /pause`` and ``/resume``: a job name or a queue_name."""
    if not isinstance(doc, dict):
        raise _invalid("the body", f"must be a JSON object, got {json_type(doc)}")
    _refuse_unknown(doc, PAUSE_FIELDS, "")
    name, queue_name = doc.get("name"), doc.get("queue_name")
    for key, value in (("name", name), ("queue_name", queue_name)):
        if value is not None and not isinstance(value, str):
            raise _invalid(key, f"must be a string, got {json_type(value)}")
    try:
        check_target(name, queue_name)
    except ValidationError as exc:
        raise _invalid("the body", str(exc)) from None
    return name, queue_name


def parse_wait_query(query: Mapping[str, str], max_wait: int) -> float | None:
    """``?wait=`` of ``GET /jobs/{id}``: seconds to wait for the job to finish (a
    number from 0 to ``max_wait``), or None without it."""
    raw = query.get("wait")
    if raw is None:
        return None
    try:
        seconds = float(raw) if raw.isascii() and raw.strip() == raw else math.nan
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= max_wait:  # NaN fails too
        raise _invalid("wait", f"must be a number of seconds from 0 to {max_wait}, got {raw!r}")
    return seconds
