"""Old against new, interleaved: the drain at 1, 16 and 64 slots and single
enqueues, each checkout measured by its own interpreter in turn, medians of
``--repeats`` rounds and the ratio new/old: of throughput (jobs/s), and of the
client's CPU per job (``cpu`` rows, microseconds: less moved by other load on a
shared machine).

    python -m tools.bench.ab --old ../wt-base --new . --dsn postgresql://…/postgres

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

DRAIN_SLOTS = (1, 16, 64)


async def _child(dsn: str, database: str, drain_jobs: int, single_jobs: int) -> dict[str, float]:
    from pgfleet import create_pool
    from pgfleet.queue import NotifyMode, Queue
    from tools.bench.suite import _drain_in_process, _fill, _fresh_database, _reset, _single
    from tools.devkit.postgres import drop_database

    url = await _fresh_database(dsn, database)
    results: dict[str, float] = {}
    try:
        pool = await create_pool(url, min_size=2, max_size=8)
        try:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--old", type=Path)
    parser.add_argument("--new", type=Path, default=Path())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--drain-jobs", type=int, default=20_000)
    parser.add_argument("--single-jobs", type=int, default=3_000)
    parser.add_argument("--database", default="pgfleet_ab")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = asyncio.run(_child(args.dsn, args.database, args.drain_jobs, args.single_jobs))
        print(json.dumps(result))
        return
    if args.old is None:
        parser.error("--old is required")
    runs: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
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
                runs[side].setdefault(key, []).append(value)
    # Ratios: of the medians, and the median of each round's ratio (both sides of a
    # round run back to back, so a burst of noise from elsewhere moves both).
    print(f"{'measure':22} {'old':>10} {'new':>10} {'new/old':>8} {'rounds':>7}")
    for key in runs["old"]:
        olds, news = runs["old"][key], runs["new"][key]
        old, new = statistics.median(olds), statistics.median(news)
        paired = statistics.median(n / o for n, o in zip(news, olds, strict=True))
        print(f"{key:22} {old:10.0f} {new:10.0f} {new / old:8.3f} {paired:7.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
