"""Value types: names, statuses, options."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest

from pgfleet import EnqueueOptions, InvalidName, InvalidOptions, JobStatus
from pgfleet.jobs import validate_name


@pytest.mark.parametrize("name", ["a", "send_email", "A.b-c:d_9", "x" * 128])
def test_valid_names(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize("name", ["", " ", "a b", "é", "x" * 129, "a/b", "a\nb", "a;b"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidName):
        validate_name(name)


def test_status_parse() -> None:
    assert JobStatus.parse("failed") is JobStatus.FAILED
    assert JobStatus.parse(JobStatus.QUEUED) is JobStatus.QUEUED
    assert JobStatus.FAILED.finished
    assert not JobStatus.RUNNING.finished
    with pytest.raises(InvalidOptions, match="unknown job status 'dead'"):
        JobStatus.parse("dead")


def test_jobs_due_within_a_minute_wake_the_workers_and_later_ones_do_not() -> None:
    assert EnqueueOptions().runs_now
    assert EnqueueOptions(delay=0).runs_now
    assert EnqueueOptions(delay=5).runs_now
    assert not EnqueueOptions(delay=3600).runs_now
    assert EnqueueOptions(run_at=dt.datetime.now(dt.UTC)).runs_now
    assert not EnqueueOptions(run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).runs_now


def test_delay_accepts_timedelta_and_seconds() -> None:
    assert EnqueueOptions(delay=dt.timedelta(minutes=2)).delay_seconds == 120
    assert EnqueueOptions(delay=1.5).delay_seconds == 1.5


def test_after_takes_job_ids_and_batch_indexes_once_each() -> None:
    parent = uuid.uuid4()
    opts = EnqueueOptions(after=[parent, str(parent), 2, 2], run_anyway=True)
    assert opts.after == (parent, 2)
    assert not opts.runs_now  # a job with parents waits: no wakeup for it


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"after": ["not-a-uuid"]}, "is not a job id"),
        ({"after": [-1]}, "job ids .UUID. or indexes"),
        ({"after": [True]}, "job ids .UUID. or indexes"),
        ({"run_anyway": True}, "run_anyway needs after"),
        ({"after": [0], "run_anyway": "yes"}, "run_anyway must be a boolean"),
        ({"after": [0], "job_key": "k"}, "cannot have a job_key"),
        ({"after": list(range(1001))}, "at most 1000"),
    ],
)
def test_bad_dependencies_are_refused_saying_why(fields: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidOptions, match=problem):
        EnqueueOptions(**fields)
