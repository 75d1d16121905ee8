"""pgfleet's Locust entry point.

    python -m locust -f loadtest/locustfile.py --headless -u 16 -r 16 -t 30s \\
        --host http://127.0.0.1:8000 --batch-size 10 --csv results/run

``LOADTEST_USER`` picks the producer: ``http`` (default; batched ``POST /jobs`` to
``--host``) or ``db`` (transactions straight into Postgres at ``--dsn``, with the
``--notify`` mode). Only the chosen class is concrete, so Locust never mixes them.
The pgfleet options (``--batch-size``, ``--target-rate``, ``--total-jobs``,
``--max-failure-ratio``, ``--max-p95-ms``, ...) are listed by ``--help``; the run
exits non-zero when the gate in ``gate.py`` finds a violation.

``make loadtest SCENARIO=...`` (``python -m loadtest.run``) starts the fleet and
drives this file; see loadtest/README.md.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from locust import events

# Locust imports this file by path: make the repository importable (loadtest, pgfleet).
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from loadtest import finalcsv, gate, users  # noqa: E402

USER = os.environ.get("LOADTEST_USER", "http")

if USER == "db":
    from loadtest.dbuser import DbEnqueuer

    class DatabaseProducer(DbEnqueuer):
        """One producer connection straight into Postgres."""

elif USER == "http":
    from loadtest.httpuser import HttpEnqueuer

    class HttpProducer(HttpEnqueuer):
        """One client of the jobs API."""

else:
    raise SystemExit(f"LOADTEST_USER must be 'http' or 'db', got {USER!r}")


@events.init_command_line_parser.add_listener  # type: ignore[untyped-decorator]  # locust: unannotated
def _options(parser: object, **_kw: object) -> None:
    users.add_arguments(parser)


gate.install(events)
finalcsv.install(events)
