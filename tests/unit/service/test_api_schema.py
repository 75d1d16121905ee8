"""Request parsing of the HTTP jobs API: what is accepted, and how each refusal is named."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest

from pgfleet.jobs import DEFAULT_OPTIONS, EnqueueOptions, Job, JobKeyMode, JobStatus
from pgfleet.service.api_schema import (
    Limits,
    RequestError,
    check_content_type,
    decode_json,
    parse_batch,
    parse_enqueue,
    parse_list_query,
    parse_rfc3339,
    parse_wait_query,
)
from pgfleet.service.views import job_view

LIMITS = Limits(max_batch=3, max_payload_bytes=100)


def refusal(doc: Any, limits: Limits = LIMITS) -> RequestError:
    with pytest.raises(RequestError) as caught:
        parse_enqueue(doc, limits)
    return caught.value


def test_single_job_with_every_option() -> None:
    body = parse_enqueue(
        {
            "name": "send_email",
            "payload": {"to": "a@b.c"},
            "options": {
                "run_at": "2030-01-31T10:30:00+01:00",
                "priority": -5,
                "max_attempts": 3,
                "queue_name": "mail",
                "job_key": "k-1",
                "job_key_mode": "replace",
            },
        },
        LIMITS,
    )
    assert not body.batch
    [req] = body.requests
    assert (req.name, req.payload) == ("send_email", {"to": "a@b.c"})
    assert req.options == EnqueueOptions(
        run_at=dt.datetime(2030, 1, 31, 9, 30, tzinfo=dt.UTC),
        priority=-5,
        max_attempts=3,
        queue_name="mail",
        job_key="k-1",
        job_key_mode=JobKeyMode.REPLACE,
    )


def test_missing_or_null_options_are_the_defaults() -> None:
    for doc in ({"name": "a"}, {"name": "a", "options": None}, {"name": "a", "options": {}}):
        [req] = parse_enqueue(doc, LIMITS).requests
        assert req.options is DEFAULT_OPTIONS
        assert req.payload is None
    [req] = parse_enqueue(
        {"name": "a", "options": {"delay": 1.5, "priority": None}}, LIMITS
    ).requests
    assert req.options == EnqueueOptions(delay=1.5)


def test_batch_keeps_order_and_is_always_a_batch() -> None:
    body = parse_enqueue({"jobs": [{"name": "a", "payload": 1}, {"name": "b"}]}, LIMITS)
    assert body.batch
    assert [(r.name, r.payload) for r in body.requests] == [("a", 1), ("b", None)]
    assert parse_enqueue({"jobs": [{"name": "a"}]}, LIMITS).batch


@pytest.mark.parametrize(
    ("doc", "status", "names"),
    [
        ([1, 2], 422, "must be a JSON object, got array"),
        ({"payload": {}}, 422, "name: is required"),
        ({"name": "a", "color": "red", "size": 1}, 422, "unknown fields in the body: color, size"),
        ({"name": "a", "options": {"delai": 5}}, 422, "unknown field in options: delai"),
        ({"name": "a b"}, 422, "name: invalid job name 'a b'"),
        ({"name": "x" * 129}, 422, "name: invalid job name"),
        ({"name": 7}, 422, "name: job name must be a string"),
        ({"name": "a", "options": []}, 422, "options: must be a JSON object, got array"),
        ({"name": "a", "options": {"delay": -1}}, 422, "options.delay: delay must be between"),
        ({"name": "a", "options": {"delay": 1e300}}, 422, "options.delay: delay must be between"),
        ({"name": "a", "options": {"delay": 10**400}}, 422, "options.delay:"),
        ({"name": "a", "options": {"delay": "5"}}, 422, "options.delay: must be a number"),
        ({"name": "a", "options": {"delay": True}}, 422, "options.delay: must be a number"),
        ({"name": "a", "options": {"priority": 1.5}}, 422, "options.priority: must be an integer"),
        ({"name": "a", "options": {"priority": 40000}}, 422, "options.priority: priority must"),
        ({"name": "a", "options": {"max_attempts": 0}}, 422, "options.max_attempts:"),
        ({"name": "a", "options": {"queue_name": "no way"}}, 422, "options.queue_name:"),
        ({"name": "a", "options": {"job_key": ""}}, 422, "options.job_key:"),
        ({"name": "a", "options": {"job_key_mode": "merge"}}, 422, "options.job_key_mode:"),
        ({"name": "a", "options": {"run_at": "2030-01-01T00:00:00"}}, 422, "options.run_at:"),
        ({"name": "a", "options": {"run_at": "tomorrow"}}, 422, "options.run_at:"),
        ({"name": "a", "options": {"run_at": "2030-02-30T00:00:00Z"}}, 422, "not a valid"),
        ({"name": "a", "options": {"run_at": "0001-01-01T00:00:00+01:00"}}, 422, "out of range"),
        (
            {"name": "a", "options": {"run_at": "2030-01-01T00:00:00Z", "delay": 1}},
            422,
            "options: give run_at or delay, not both",
        ),
        ({"name": "a", "payload": "x" * 200}, 413, "payload: payload is"),
        ({"name": "a", "payload": "nul \x00 inside"}, 422, "payload: payload contains a NUL"),
        ({"jobs": {"name": "a"}}, 422, "jobs: must be an array"),
        ({"jobs": []}, 422, "jobs: must not be empty"),
        ({"jobs": [{"name": "a"}] * 4}, 413, "a batch of 4 jobs is over the limit of 3"),
        ({"jobs": [{"name": "a"}], "name": "b"}, 422, "unknown field in the body: name"),
        ({"jobs": [{"name": "a"}, "b"]}, 422, "jobs[1] must be a JSON object, got string"),
        (
            {"jobs": [{"name": "a"}, {"name": "b", "options": {"delay": -2}}]},
            422,
            "jobs[1].options.delay: delay must be",
        ),
        (
            {
                "jobs": [
                    {"name": "a", "options": {"job_key": "k"}},
                    {"name": "b"},
                    {"name": "c", "options": {"job_key": "k"}},
                ]
            },
            422,
            "jobs[2].options.job_key: 'k' is also the job_key of jobs[0]",
        ),
    ],
)
def test_refusals_name_the_problem(doc: Any, status: int, names: str) -> None:
    exc = refusal(doc)
    assert exc.status == status
    assert names in exc.message
    assert exc.body()["error"] == exc.message


def test_refusal_detail_points_at_the_field() -> None:
    exc = refusal({"jobs": [{"name": "a"}, {"name": "b", "options": {"priority": "high"}}]})
    assert exc.detail == {"field": "jobs[1].options.priority"}
    exc = refusal({"jobs": [{"name": "a", "extra": 1}]})
    assert exc.detail is not None
    assert exc.detail["unknown_fields"] == ["jobs[0].extra"]


def test_strict_mode_refuses_names_without_handlers() -> None:
    strict = Limits(known_names=frozenset({"send_email"}))
    assert parse_enqueue({"name": "send_email"}, strict).requests[0].name == "send_email"
    exc = refusal({"name": "send_mail"}, strict)
    assert exc.status == 422
    assert "unknown job name 'send_mail'" in exc.message


def test_payloads_are_checked_against_the_handler_type() -> None:
    from pgfleet.payloads import decoder_for

    checked = Limits(decoders={"serial": decoder_for(dict[str, int])})
    assert parse_enqueue({"name": "serial", "payload": {"n": 1}}, checked).requests
    assert parse_enqueue({"name": "other", "payload": [1]}, checked).requests
    exc = refusal({"name": "serial", "payload": {"n": "one"}}, checked)
    assert exc.status == 422
    assert exc.detail == {"field": "payload"}
    assert exc.message.startswith("payload: does not decode for the handler of 'serial'")


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (b"", "the body is empty"),
        (b"   ", "the body is empty"),
        (b'{"name": ', "malformed JSON: Expecting value"),
        (b"{'name': 'a'}", "malformed JSON"),
        (b'{"name": "a", "payload": NaN}', "NaN is not valid JSON"),
        (b'{"payload": Infinity}', "Infinity is not valid JSON"),
        (b'{"name": "\xff"}', "not UTF-8"),
        (b'{"name": "a", "payload": "\\ud800"}', "unpaired UTF-16 surrogate"),
        (b"[" * 100_000 + b"]" * 100_000, "malformed JSON"),
    ],
)
def test_malformed_json_is_a_400(raw: bytes, problem: str) -> None:
    with pytest.raises(RequestError) as caught:
        decode_json(raw)
    assert caught.value.status == 400
    assert problem in caught.value.message


def test_json_with_paired_surrogates_is_fine() -> None:
    assert decode_json(b'{"s": "\\ud83d\\ude00"}') == {"s": "\U0001f600"}


@pytest.mark.parametrize(
    ("content_type", "charset", "ok"),
    [
        ("application/json", None, True),
        ("application/json", "utf-8", True),
        ("application/json", "UTF8", True),
        ("application/problem+json", None, True),
        ("application/json", "latin-1", False),
        ("text/plain", None, False),
        ("application/x-www-form-urlencoded", None, False),
        ("application/octet-stream", None, False),
        ("", None, False),
    ],
)
def test_content_type(content_type: str, charset: str | None, ok: bool) -> None:
    if ok:
        check_content_type(content_type, charset)
        return
    with pytest.raises(RequestError) as caught:
        check_content_type(content_type, charset)
    assert caught.value.status == 415


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2030-01-31T09:30:00Z", dt.datetime(2030, 1, 31, 9, 30, tzinfo=dt.UTC)),
        ("2030-01-31t09:30:00z", dt.datetime(2030, 1, 31, 9, 30, tzinfo=dt.UTC)),
        ("2030-01-31 10:30:00+01:00", dt.datetime(2030, 1, 31, 9, 30, tzinfo=dt.UTC)),
        ("2030-01-31T09:30:00.123456789-00:30", dt.datetime(2030, 1, 31, 10, 0, 0, 123456, dt.UTC)),
    ],
)
def test_rfc3339_with_offsets(text: str, expected: dt.datetime) -> None:
    assert parse_rfc3339(text) == expected


@pytest.mark.parametrize(
    "text", ["2030-01-31", "2030-01-31T09:30Z", "2030-01-31T09:30:00", "20300131T093000Z", "x"]
)
def test_rfc3339_refuses_partial_or_naive_times(text: str) -> None:
    with pytest.raises(RequestError, match="RFC 3339"):
        parse_rfc3339(text)


def test_list_query() -> None:
    q = parse_list_query({"status": "failed", "name": "a", "limit": "10"})
    assert (q.status, q.name, q.limit) == (JobStatus.FAILED, "a", 10)
    assert parse_list_query({}).limit == 50
    for query, problem in (
        ({"status": "dead"}, "status: unknown job status 'dead'"),
        ({"name": "a b"}, "name: invalid job name"),
        ({"limit": "0"}, "limit: must be an integer from 1 to 1000"),
        ({"limit": "-3"}, "limit: must be an integer"),
        ({"limit": "1001"}, "limit: must be an integer"),
        ({"limit": "ten"}, "limit: must be an integer"),
        ({"order": "asc", "page": "2"}, "unknown query parameters: order, page"),
    ):
        with pytest.raises(RequestError) as caught:
            parse_list_query(query)
        assert caught.value.status == 422
        assert problem in caught.value.message


def _job(status: JobStatus, **changes: Any) -> Job:
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    fields: dict[str, Any] = {
        "id": uuid.UUID(int=1),
        "name": "a",
        "payload": {"secret": "s3cr3t"},
        "status": status,
        "attempt": 0,
        "max_attempts": 3,
        "priority": 0,
        "queue_name": None,
        "job_key": None,
        "run_at": now,
        "created_at": now,
        "started_at": None,
        "finished_at": None,
        "last_error": None,
        "worker_id": None,
    }
    fields.update(changes)
    return Job(**fields)


def test_job_view_is_flat_and_never_has_the_payload() -> None:
    t = dt.datetime(2030, 1, 1, 0, 0, 5, tzinfo=dt.UTC)
    worker = uuid.UUID(int=9)
    queued = job_view(_job(JobStatus.QUEUED))
    assert queued == {
        "id": str(uuid.UUID(int=1)),
        "name": "a",
        "status": "queued",
        "attempt": 0,
        "max_attempts": 3,
        "priority": 0,
        "run_at": "2030-01-01T00:00:00+00:00",
        "created_at": "2030-01-01T00:00:00+00:00",
    }
    running = job_view(_job(JobStatus.RUNNING, attempt=1, started_at=t, worker_id=worker))
    assert running["started_at"] == "2030-01-01T00:00:05+00:00"
    assert running["worker_id"] == str(worker)
    retrying = job_view(_job(JobStatus.QUEUED, attempt=1, last_error="boom"))
    assert retrying["error"] == "boom"
    failed = job_view(
        _job(JobStatus.FAILED, attempt=3, last_error="boom", finished_at=t, worker_id=worker)
    )
    assert (failed["error"], failed["attempt"], failed["finished_at"]) == (
        "boom",
        3,
        "2030-01-01T00:00:05+00:00",
    )
    assert "worker_id" not in failed
    succeeded = job_view(_job(JobStatus.SUCCEEDED, attempt=2, last_error="old", finished_at=t))
    assert "error" not in succeeded
    keyed = job_view(_job(JobStatus.QUEUED, queue_name="q", job_key="k", limit_key="acme"))
    assert (keyed["queue_name"], keyed["job_key"], keyed["limit_key"]) == ("q", "k", "acme")
    for view in (queued, running, retrying, failed, succeeded, keyed):
        assert "payload" not in view
        assert "s3cr3t" not in json.dumps(view)
        assert all(not isinstance(v, dict | list) for v in view.values())


def test_after_and_run_anyway_are_options_and_a_batch_needs_its_callback() -> None:
    parent = str(uuid.uuid4())
    body = parse_enqueue(
        {
            "jobs": [
                {"name": "a"},
                {"name": "b", "options": {"after": [0, parent], "run_anyway": True}},
            ]
        },
        Limits(),
    )
    assert body.requests[1].options.after == (0, uuid.UUID(parent))
    assert body.requests[1].options.run_anyway
    with pytest.raises(RequestError, match="must be an array"):
        parse_enqueue({"name": "a", "options": {"after": 0}}, Limits())
    with pytest.raises(RequestError, match="run_anyway needs after"):
        parse_enqueue({"name": "a", "options": {"run_anyway": True}}, Limits())
    members, callback = parse_batch(
        {"jobs": [{"name": "a"}], "callback": {"name": "done", "payload": {"to": "x"}}}, Limits()
    )
    assert [m.name for m in members] == ["a"] and callback.name == "done"
    with pytest.raises(RequestError, match="callback"):
        parse_batch({"jobs": [{"name": "a"}]}, Limits())
    with pytest.raises(RequestError, match="object or null"):
        parse_batch({"jobs": [{"name": "a"}], "callback": {"name": "d", "payload": [1]}}, Limits())


def test_the_long_poll_takes_seconds_up_to_its_limit() -> None:
    assert parse_wait_query({}, 60) is None
    assert parse_wait_query({"wait": "2.5"}, 60) == 2.5
    assert parse_wait_query({"wait": "0"}, 0) == 0.0
    for bad in ("61", "-1", "nan", "inf", " 1", "1e400", "abc", "٣"):
        with pytest.raises(RequestError) as info:
            parse_wait_query({"wait": bad}, 60)
        assert info.value.status == 422 and "wait" in info.value.message
