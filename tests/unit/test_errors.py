"""What pgfleet's errors say."""

from __future__ import annotations

import uuid

from pgfleet import JobNotFound
from pgfleet.errors import missing_job


def test_a_missing_well_formed_id_says_the_job_may_have_been_removed() -> None:
    job_id = uuid.uuid4()
    for text in (missing_job(job_id), missing_job(str(job_id)), str(JobNotFound(job_id))):
        assert text.startswith(f"no job with id {job_id} (")
        assert "finished_job_retention" in text and "remove_succeeded_jobs" in text


def test_a_malformed_id_is_only_said_to_be_missing() -> None:
    assert missing_job("not-a-uuid") == "no job with id not-a-uuid"
    assert str(JobNotFound(42)) == "no job with id 42"
