"""tools/bench/django_tasks.py and tools/bench/producers.py run end to end at a tiny
scale (speed is measured by `make bench-django` and `make bench-producers`, never
asserted in tests)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


async def _bench(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 600)
    assert proc.returncode == 0, output.decode()[-3000:]
    return output.decode()


async def test_django_tasks_bench_runs_both_backends(database: str, tmp_path: Path) -> None:
    out = tmp_path / "django.json"
    output = await _bench(
        "tools.bench.django_tasks", "--dsn", database, "--n", "30", "--rounds", "2",
        "--latency-samples", "3", "--db-interval", "0.1", "--json", str(out),
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert set(report["median"]) == {"pgfleet", "django-tasks-db"}
    for backend in report["runs"].values():
        assert {len(runs) for runs in backend.values()} == {2}, "two rounds of each metric"
        assert all(value > 0 for runs in backend.values() for value in runs)
    assert "drain (tasks/s)" in output


async def test_django_tasks_bench_refuses_the_postgres_database() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tools.bench.django_tasks",
        "--dsn", "postgresql://postgres@127.0.0.1:5432/postgres",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    output, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert b"name a database of your own" in output


async def test_producers_bench_runs_every_producer(database: str, tmp_path: Path) -> None:
    out = tmp_path / "producers.json"
    await _bench(
        "tools.bench.producers", "--dsn", database, "--n", "20", "--rounds", "1",
        "--json", str(out),
    )  # fmt: skip
    assert set(json.loads(out.read_text())) == {
        "Queue.enqueue (pool)",
        "Queue.enqueue (held connection)",
        "psycopg AsyncProducer",
        "psycopg Producer (sync)",
        "bare psycopg insert",
        "bare psycopg async insert",
    }
