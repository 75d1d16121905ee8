"""Old against new, interleaved: the drain at 1, 16 and 64 slots and single
enqueues, each checkout measured by its own interpreter in turn, medians of
``--repeats`` rounds and the ratio new/old: of throughput (jobs/s), and of the
client's CPU per job (``cpu`` rows, microseconds: less moved by other load on a
shared machine).

    python -m tools.bench.ab --old ../wt-base --new . --dsn postgresql://…/postgres

``--result-bytes N`` adds drains at 16 and 64 slots whose handler returns an
N-byte JSON result (``drain c16 r1024``), each run right after the same drain
returning ``None``, and ``cost`` rows: the median of each pair's ratio (with
results / without) for each checkout. ``--only-results`` measures only those;
``--result-shape`` picks the value (``text``: one incompressible string;
``records``: rows of small objects).

Each checkout runs this file's ``--child`` with its own venv
(``<checkout>/.venv/bin/python``) and its own folder first on the path, so each
measures its own pgfleet (the old checkout need not have this file)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DRAIN_SLOTS = (1, 16, 64)


RESULT_SLOTS = (16, 64)


RESULT_SHAPES = ("text", "records")


def result_value(size: int, shape: str = "text") -> Any:
    """A JSON result of about ``size`` bytes encoded. ``text``: one string that
    compresses little (base64 of fixed pseudo-random bytes), the cheapest value of
    that size to encode and parse. ``records``: rows of small objects, as a
    handler's summary would be (many values: dearer to encode, and wider as jsonb)."""
    import base64
    import random

    if shape == "records":
        rows: list[dict[str, Any]] = []
        while len(json.dumps({"rows": rows}, separators=(",", ":"))) < size - 60:
            i = len(rows)
            rows.append({"id": i, "sku": f"SKU-{i:06d}", "qty": i % 7, "status": "shipped"})
        return {"rows": rows}
    overhead = len('{"data":""}')
    raw = random.Random(size).randbytes(size)
    return {"data": base64.b64encode(raw).decode()[: max(0, size - overhead)]}


async def _drain_returning(pool: Any, slots: int, value: Any) -> float:
    """The drain at ``slots`` slots, every handler returning ``value``."""
    from pgfleet import Registry, Worker
    from pgfleet.jobs import Job
    from tools.bench.suite import _bench_config

    registry = Registry()

    @registry.job("noop")
    async def noop(job: Job) -> Any:
        return value

    worker = Worker(pool, registry, _bench_config(slots))
    start = time.perf_counter()
    stats = await worker.run(burst=True)
    return stats.succeeded / (time.perf_counter() - start)


async def _result_drains(
    url: str, pool: Any, drain_jobs: int, result_bytes: int, shape: str = "text"
) -> dict[str, float]:
    """The drains with and without results, each pair back to back; with the CPU
    each spent per job, in microseconds: this process (``cpu``) and the database's
    backends (``pg cpu``), less moved than throughput by a busy neighbour."""
    from tools.bench.suite import Cpu, _fill, _reset

    results: dict[str, float] = {}
    value = result_value(result_bytes, shape)
    for slots in RESULT_SLOTS:
        for key, returned in (
            (f"drain c{slots} none", None),
            (f"drain c{slots} r{result_bytes}", value),
        ):
            await _reset(pool)
            await _fill(pool, drain_jobs)
            async with Cpu(url) as cpu:
                results[key] = await _drain_returning(pool, slots, returned)
            client, server = cpu.per_job(drain_jobs)
            results[f"{key} cpu"] = client * 1000
            if server is not None:
                results[f"{key} pg cpu"] = server * 1000
    return results


async def _child(
    dsn: str,
    database: str,
    drain_jobs: int,
    single_jobs: int,
    result_bytes: int = 0,
    only_results: bool = False,
    shape: str = "text",
) -> dict[str, float]:
    from pgfleet import create_pool
    from pgfleet.queue import NotifyMode, Queue
    from tools.bench.suite import _drain_in_process, _fill, _fresh_database, _reset, _single
    from tools.devkit.postgres import drop_database

    url = await _fresh_database(dsn, database)
    results: dict[str, float] = {}
    try:
        pool = await create_pool(url, min_size=2, max_size=8)
        try:
            if result_bytes:
                results.update(await _result_drains(url, pool, drain_jobs, result_bytes, shape))
            if only_results:
                return results
            for slots in DRAIN_SLOTS:
                n = drain_jobs // 4 if slots == 1 else drain_jobs
                await _reset(pool)
                await _fill(pool, n)
                cpu = time.process_time()
                results[f"drain c{slots}"] = await _drain_in_process(pool, slots)
                results[f"drain c{slots} cpu"] = (time.process_time() - cpu) / n * 1e6
            await _reset(pool)
            queue = Queue(pool, notify=NotifyMode.OFF)
            start, cpu = time.perf_counter(), time.process_time()
            await _single(queue, single_jobs)
            results["single enqueue"] = single_jobs / (time.perf_counter() - start)
            results["single enqueue cpu"] = (time.process_time() - cpu) / single_jobs * 1e6
        finally:
            await pool.close()
    finally:
        await drop_database(dsn, database)
    return results


def _install_loop(name: str) -> None:
    """The child's loop. Not tools.bench.suite's install_loop: the child runs this
    file on the other checkout's path, whose tools may predate it."""
    if name == "uvloop":
        try:
            import uvloop
        except ImportError:
            return
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--old", type=Path)
    parser.add_argument("--new", type=Path, default=Path())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--drain-jobs", type=int, default=20_000)
    parser.add_argument("--single-jobs", type=int, default=3_000)
    parser.add_argument("--database", default="pgfleet_ab")
    parser.add_argument(
        "--result-bytes",
        type=int,
        default=0,
        help="also drain with handlers returning a JSON result of this many bytes",
    )
    parser.add_argument(
        "--only-results", action="store_true", help="measure only the --result-bytes drains"
    )
    parser.add_argument(
        "--result-shape",
        choices=RESULT_SHAPES,
        default="text",
        help="text: one incompressible string; records: rows of small objects",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the children's event loop: uvloop (as `pgfleet worker` runs; asyncio's own "
        "where a checkout's venv lacks it) or asyncio's own",
    )
    args = parser.parse_args()
    if args.child:
        _install_loop(args.loop)
        result = asyncio.run(
            _child(
                args.dsn,
                args.database,
                args.drain_jobs,
                args.single_jobs,
                args.result_bytes,
                args.only_results,
                args.result_shape,
            )
        )
        print(json.dumps(result))
        return
    if args.old is None:
        parser.error("--old is required")
    # side -> measure -> round -> value: a measure a round could not take (the
    # Postgres CPU of a backend that ended before it was read) is paired by round.
    runs: dict[str, dict[str, dict[int, float]]] = {"old": {}, "new": {}}
    for round_ in range(args.repeats):
        order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
        for side in order:
            tree = (args.old if side == "old" else args.new).resolve()
            out = subprocess.run(
                [
                    str(tree / ".venv/bin/python"),
                    __file__,
                    "--child",
                    "--dsn",
                    args.dsn,
                    "--database",
                    f"{args.database}_{side}",
                    "--drain-jobs",
                    str(args.drain_jobs),
                    "--single-jobs",
                    str(args.single_jobs),
                    "--result-bytes",
                    str(args.result_bytes),
                    "--result-shape",
                    args.result_shape,
                    "--loop",
                    args.loop,
                    *(["--only-results"] if args.only_results else []),
                ],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            rounded = {key: round(value) for key, value in result.items()}
            print(side, round_ + 1, json.dumps(rounded), flush=True)
            for key, value in result.items():
                runs[side].setdefault(key, {})[round_] = value
    # Ratios: of the medians, and the median of each round's ratio (both sides of a
    # round run back to back, so a burst of noise from elsewhere moves both).
    print(f"{'measure':22} {'old':>10} {'new':>10} {'new/old':>8} {'rounds':>7}")
    for key in runs["old"]:
        olds, news = runs["old"][key], runs["new"].get(key, {})
        both = sorted(olds.keys() & news.keys())
        if not both:
            continue
        old, new = statistics.median(olds.values()), statistics.median(news.values())
        paired = statistics.median(news[r] / olds[r] for r in both)
        print(f"{key:22} {old:10.0f} {new:10.0f} {new / old:8.3f} {paired:7.3f}")
    if args.result_bytes:
        _print_result_cost(runs, args.result_bytes)
    sys.stdout.flush()


def _print_result_cost(runs: dict[str, dict[str, dict[int, float]]], result_bytes: int) -> None:
    """Per checkout, the drain with results over the drain without, at each slot
    count: the median of the rounds' ratios (each pair ran back to back)."""
    print(f"{'cost of results':22} {'old':>10} {'new':>10}")
    for slots in RESULT_SLOTS:
        ratios = []
        for side in ("old", "new"):
            with_r = runs[side][f"drain c{slots} r{result_bytes}"]
            without = runs[side][f"drain c{slots} none"]
            both = sorted(with_r.keys() & without.keys())
            ratios.append(statistics.median(with_r[r] / without[r] for r in both))
        print(f"{f'r{result_bytes}/none c{slots}':22} {ratios[0]:10.3f} {ratios[1]:10.3f}")


if __name__ == "__main__":
    main()
