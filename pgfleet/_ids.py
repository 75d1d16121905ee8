"""UUIDv7 job ids (RFC 9562): 48-bit Unix milliseconds, a 12-bit sequence, 62 random bits.

Time-ordered ids keep primary-key inserts at the right edge of the index and let
``Queue.recent`` walk the key backwards. Monotonic within a process; the random part
is reseeded in forked children so siblings never share a stream.
"""

from __future__ import annotations

import functools
import os
import random
import threading
import time
import uuid
from collections.abc import Callable

_UUID: Callable[[bytes], uuid.UUID]
try:  # asyncpg's UUID subclasses uuid.UUID and encodes without re-parsing.
    from asyncpg.pgproto.pgproto import UUID as _AsyncpgUUID

    _UUID = _AsyncpgUUID
except ImportError:  # pragma: no cover - asyncpg always ships it
    _UUID = functools.partial(uuid.UUID, None)

_rng = random.Random(os.urandom(32))
_lock = threading.Lock()
_last_ms = 0
_seq = 0

_VERSION_AND_VARIANT = (0x7 << 76) | (0b10 << 62)


def _reseed() -> None:
    _rng.seed(os.urandom(32))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed)


def _reserve(n: int) -> tuple[int, int]:
    """Reserve ``n`` consecutive (ms, seq) slots; return the first."""
    global _last_ms, _seq
    with _lock:
        now = time.time_ns() // 1_000_000
        if now > _last_ms:
            _last_ms, _seq = now, 0
        start_ms, start_seq = _last_ms, _seq
        total = _seq + n
        _last_ms += total >> 12
        _seq = total & 0xFFF
        return start_ms, start_seq


def uuid7() -> uuid.UUID:
    ms, seq = _reserve(1)
    value = (ms << 80) | (seq << 64) | _VERSION_AND_VARIANT | _rng.getrandbits(62)
    return _UUID(value.to_bytes(16, "big"))


def uuid7_batch(n: int) -> list[uuid.UUID]:
    ms, seq = _reserve(n)
    bits = _rng.getrandbits
    out: list[uuid.UUID] = []
    append = out.append
    for _ in range(n):
        value = (ms << 80) | (seq << 64) | _VERSION_AND_VARIANT | bits(62)
        append(_UUID(value.to_bytes(16, "big")))
        seq += 1
        if seq > 0xFFF:
            ms, seq = ms + 1, 0
    return out
