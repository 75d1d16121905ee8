"""Django tasks through pgfleet's backend and through django-tasks-db, on one machine.

``python -m tools.bench.django_tasks --dsn postgresql://.../mydb [--n 10000]
[--rounds 3] [--latency-samples 200] [--processes 1] [--json out.json]``

django-tasks-db is the ORM database backend of Django's tasks framework
(``DatabaseBackend``, ``manage.py db_worker``). The project of
:mod:`tools.bench.django_bench` has both backends on one database and one no-op
task. In each round, for each backend (their order alternates between rounds):

- **enqueue**: ``--n`` calls of ``noop.enqueue()`` in this process, each in its own
  transaction (Django's autocommit), no worker running: tasks/s.
- **drain**: ``--processes`` worker processes (``manage.py pgfleet_worker``,
  ``manage.py db_worker``) started on those ``--n`` queued tasks: tasks/s from the
  first task's start to the last one's finish, by the timestamps each backend
  records (worker start-up excluded). The table is analysed before the workers
  start, as autovacuum would have done by then.
- **pickup latency**: one idle worker; ``--latency-samples`` tasks enqueued one at
  a time, 20-80 ms apart (random, so no sample rides a poll's phase); the task
  measures the wall time from just before its ``enqueue()`` to its start: median
  and p95.

Both workers run as configured out of the box (pgfleet: concurrency 16, woken by
LISTEN/NOTIFY; db_worker: one task at a time, polling every ``--db-interval``, its
default 1 s, when idle), with per-task logging off (``--log-level warning``,
``--verbosity 0``) so that log formatting is not what is measured. Run it under
``flock /tmp/pgfleet-bench.lock`` on a database of your own: its task tables are
emptied.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tools.devkit import guarded, until_sync

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "tools.bench.django_bench.settings"


@dataclass
class Backend:
    label: str
    alias: str  # in TASKS
    worker: list[str]  # the management command and its flags
    table: tuple[str, ...]  # its schema-qualified name
    succeeded: str  # the status of a finished task in ``table``

    def manage(self) -> list[str]:
        return [sys.executable, "-m", "django", *self.worker, f"--settings={SETTINGS}"]


def backends(db_interval: float) -> list[Backend]:
    from django_tasks_db.models import DBTaskResult

    return [
        Backend(
            "pgfleet",
            "default",
            ["pgfleet_worker", "--log-level", "warning"],
            ("pgfleet", "jobs"),
            "succeeded",
        ),
        Backend(
            "django-tasks-db",
            "db",
            ["db_worker", "--backend", "db", "--verbosity", "0", "--no-reload",
             "--no-startup-delay", "--interval", str(db_interval)],
            (DBTaskResult._meta.db_table,),
            "SUCCESSFUL",
        ),
    ]  # fmt: skip


def setup(dsn: str) -> None:
    """This process as the benchmark project: settings, both schemas migrated."""
    os.environ["BENCH_DATABASE_URL"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def sql(query: str, backend: Backend, *params: Any) -> Any:
    """The first column of the first row (None for a statement without rows) of
    ``query``, its ``{}`` the backend's table."""
    from django.db import connection
    from psycopg import sql as psql

    statement = psql.SQL(query).format(psql.Identifier(*backend.table))
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone() if cursor.description else None
    return None if row is None else row[0]


def empty(backends: list[Backend]) -> None:
    for backend in backends:
        sql("TRUNCATE {} CASCADE", backend)  # pgfleet's dependency edges reference its jobs
        sql("VACUUM ANALYZE {}", backend)


def done(backend: Backend) -> int:
    return int(sql("SELECT count(*) FROM {} WHERE status = %s", backend, backend.succeeded))


def task(backend: Backend) -> Any:
    from tools.bench.django_bench.tasks import noop

    return noop.using(backend=backend.alias)


def start_workers(
    backend: Backend, count: int, env: dict[str, str]
) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            guarded(backend.manage()),
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=None,  # errors show
        )
        for _ in range(count)
    ]


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def measure_enqueue(backend: Backend, n: int) -> float:
    noop = task(backend)
    start = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    return n / (time.perf_counter() - start)


def measure_drain(backend: Backend, n: int, processes: int) -> float:
    workers = start_workers(backend, processes, {})
    try:
        until_sync(lambda: done(backend) >= n, 1200, f"{backend.label} to drain", interval=0.25)
    finally:
        stop_workers(workers)
    span = sql("SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM {}", backend)
    return n / float(span)


def measure_latency(backend: Backend, samples: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="pgfleet-bench-") as folder:
        path = Path(folder) / "latency"
        path.touch()

        def lines() -> list[str]:
            return path.read_text().splitlines()

        workers = start_workers(backend, 1, {"BENCH_LATENCY_FILE": str(path)})
        noop = task(backend)
        try:
            # A first task: the worker is up and idle before the samples begin.
            noop.enqueue(sent_at=time.time())
            until_sync(lambda: len(lines()) >= 1, 120, f"{backend.label} to start", interval=0.05)
            for _ in range(samples):
                noop.enqueue(sent_at=time.time())
                time.sleep(random.uniform(0.02, 0.08))
            until_sync(
                lambda: len(lines()) >= samples + 1,
                120,
                f"{backend.label}'s samples",
                interval=0.05,
            )
        finally:
            stop_workers(workers)
        return [float(line) for line in lines()[1:]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dsn", required=True, help="a database of your own (its tables are emptied)"
    )
    parser.add_argument("--n", type=int, default=10_000, help="tasks enqueued and drained per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=200)
    parser.add_argument("--processes", type=int, default=1, help="worker processes while draining")
    parser.add_argument("--db-interval", type=float, default=1.0, help="db_worker's --interval")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if urlsplit(args.dsn).path.lstrip("/") in ("", "postgres", "template0", "template1"):
        parser.error("--dsn: name a database of your own (its task tables are emptied)")
    setup(args.dsn)
    found = backends(args.db_interval)
    runs: dict[str, dict[str, list[float]]] = {
        b.label: {"enqueue": [], "drain": [], "latency_p50_ms": [], "latency_p95_ms": []}
        for b in found
    }
    for round_no in range(args.rounds):
        order = found if round_no % 2 == 0 else list(reversed(found))
        for backend in order:
            empty(found)
            enqueue = measure_enqueue(backend, args.n)
            # What autovacuum's analyze would have done by now on a server that runs
            # it (this project's test server does not): without it, django-tasks-db's
            # claim plans against an empty table's statistics and drains 3-4x slower.
            sql("ANALYZE {}", backend)
            drain = measure_drain(backend, args.n, args.processes)
            empty(found)
            latency = measure_latency(backend, args.latency_samples)
            p50, p95 = percentile(latency, 0.5) * 1000, percentile(latency, 0.95) * 1000
            seen = runs[backend.label]
            seen["enqueue"].append(enqueue)
            seen["drain"].append(drain)
            seen["latency_p50_ms"].append(p50)
            seen["latency_p95_ms"].append(p95)
            print(
                f"round {round_no + 1} {backend.label:16s} enqueue {enqueue:7.0f}/s  "
                f"drain {drain:7.0f}/s  pickup p50 {p50:7.1f} ms  p95 {p95:7.1f} ms",
                flush=True,
            )
    empty(found)
    report(runs, args)


def report(runs: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> None:
    medians = {
        label: {metric: statistics.median(values) for metric, values in metrics.items()}
        for label, metrics in runs.items()
    }
    units: dict[str, tuple[str, Callable[[float], str]]] = {
        "enqueue": ("tasks/s", lambda v: f"{v:,.0f}"),
        "drain": ("tasks/s", lambda v: f"{v:,.0f}"),
        "latency_p50_ms": ("ms", lambda v: f"{v:,.1f}"),
        "latency_p95_ms": ("ms", lambda v: f"{v:,.1f}"),
    }
    print(f"\nmedians of {args.rounds} interleaved rounds, n={args.n}, "
          f"{args.processes} worker process(es) draining")  # fmt: skip
    # The ratio is the median of each round's ratio (the two backends ran back to
    # back in a round): a burst of noise on the machine moves both of its sides.
    ratios = {
        metric: statistics.median(
            ours / theirs
            for ours, theirs in zip(
                runs["pgfleet"][metric], runs["django-tasks-db"][metric], strict=True
            )
        )
        for metric in units
    }
    print(f"{'metric':22s} {'pgfleet':>10s} {'django-tasks-db':>16s} {'ratio':>8s}")
    for metric, (unit, fmt) in units.items():
        ours, theirs = medians["pgfleet"][metric], medians["django-tasks-db"][metric]
        print(
            f"{metric + ' (' + unit + ')':22s} {fmt(ours):>10s} {fmt(theirs):>16s} "
            f"{ratios[metric]:8.3f}"
        )
    if args.json:
        out = {
            "n": args.n,
            "rounds": args.rounds,
            "processes": args.processes,
            "db_interval": args.db_interval,
            "latency_samples": args.latency_samples,
            "median": medians,
            "ratio pgfleet / django-tasks-db (median of rounds)": ratios,
            "runs": runs,
        }
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
