"""UUIDv7 ids: version, variant, and strictly increasing within a process."""

from __future__ import annotations

import itertools
import time
import uuid

from pgfleet import _ids


def test_uuid7_layout() -> None:
    u = _ids.uuid7()
    assert isinstance(u, uuid.UUID)
    assert u.version == 7
    assert u.variant == uuid.RFC_4122
    ms = u.int >> 80
    assert abs(ms - time.time_ns() // 1_000_000) < 60_000


def test_ids_increase_across_single_and_batch_calls() -> None:
    ids = [_ids.uuid7()]
    ids += _ids.uuid7_batch(10_000)  # more than 4096 forces the sequence to roll over
    ids.append(_ids.uuid7())
    assert all(a.int >> 62 < b.int >> 62 for a, b in itertools.pairwise(ids))
    assert len(set(ids)) == len(ids)
    assert all(u.version == 7 for u in ids)
