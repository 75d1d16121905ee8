"""The cyclic garbage collector of a worker's process, tuned while workers run.

Each job a worker runs allocates a few dozen container objects (its ``Job``, its
task and coroutine, the round's rows and outcomes). CPython collects its youngest
generation every 700 such allocations, and every hundredth collection walks the
whole heap: the application, asyncpg, the event loop and every module imported,
hundreds of thousands of objects that live as long as the process. On a drain of
no-op jobs the collector took 8-13% of the worker's CPU (2-3 µs a job, timed with
``gc.callbacks``), most of it in those full collections.

While at least one ``Worker`` of the process runs (``WorkerConfig.gc_tuning``,
on by default):

- the objects alive when the first one has started (imports, the registry, the
  pool, what the startup hooks built) are frozen (``gc.freeze``): collections no
  longer walk them;
- the youngest generation is collected every ``YOUNG_THRESHOLD`` allocations
  instead of 700 (the older generations' ratios are left as found).

When the last one stops, both are undone: the frozen objects go back to the
oldest generation (so garbage made before the start can still be collected) and
the thresholds are those found at the start. A process whose collector is
disabled is left as it is; one whose youngest threshold is already at least
``YOUNG_THRESHOLD`` keeps its thresholds, and one that has frozen objects itself
keeps its freeze (nothing more is frozen, nothing thawed). Reference counting
frees acyclic garbage at once either way; only cycles wait longer, and at most
``YOUNG_THRESHOLD`` young objects are pending.
"""

from __future__ import annotations

import gc
import threading

#: Allocations between two collections of the youngest generation while tuned.
YOUNG_THRESHOLD = 20_000

_lock = threading.Lock()
_users = 0
#: The thresholds found by the first user, when it changed them.
_saved: tuple[int, int, int] | None = None
_froze = False


def acquire() -> None:
    """A worker starts running: tune the collector if it is the first."""
    global _users, _saved, _froze
    with _lock:
        _users += 1
        if _users > 1 or not gc.isenabled():
            return
        found = gc.get_threshold()
        # An application that froze objects itself (a pre-fork server before its
        # fork) keeps its freeze: gc.unfreeze() would thaw those too.
        if gc.get_freeze_count() == 0:
            gc.freeze()
            _froze = True
        if found[0] < YOUNG_THRESHOLD:
            _saved = found
            gc.set_threshold(YOUNG_THRESHOLD, found[1], found[2])


def release() -> None:
    """A worker has stopped: undo the tuning if it was the last."""
    global _users, _saved, _froze
    with _lock:
        if _users == 0:
            return
        _users -= 1
        if _users > 0:
            return
        if _saved is not None:
            # Only if nobody changed them meanwhile.
            if gc.get_threshold()[0] == YOUNG_THRESHOLD:
                gc.set_threshold(*_saved)
            _saved = None
        if _froze:
            gc.unfreeze()
            _froze = False


def active() -> bool:
    """Whether some worker of this process holds the tuning."""
    with _lock:
        return _users > 0
