"""Flow control's claim, old against new, interleaved: the drain of no-op jobs with
no limit, under a concurrency limit that never binds (1000) and spread over 1,000
limit keys, at 16 and 64 slots; per drain its rate and the CPU per job of the
client and of the database's backends (microseconds), medians of ``--repeats``
rounds, with the ratios issue #24 sets targets for (limit/unlimited,
keys/unlimited) per checkout.

    flock /tmp/pgfleet-bench.lock python -m tools.bench.flow_ab --old ../wt-base --new .

Each checkout runs this file's ``--child`` with its own venv and its own folder
first on the path (the old checkout need not have this file), in its own scratch
database; the order of the checkouts alternates between rounds."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

SLOTS = (16, 64)
VARIANTS = ("unlimited", "limit1000", "keys1000")


async def _child(dsn: str, database: str, jobs: int) -> dict[str, float]:
    from pgfleet import Queue, create_pool
    from tools.bench.flow import _drain, _fill, _reset, _vacuum
    from tools.bench.suite import Cpu, _fresh_database
    from tools.devkit.postgres import drop_database

    url = await _fresh_database(dsn, database)
    results: dict[str, float] = {}
    try:
        pool = await create_pool(url, min_size=4, max_size=8)
        try:
            for slots in SLOTS:
                for variant in VARIANTS:
                    await _reset(pool)
                    if variant == "limit1000":
                        await Queue(pool).set_limits("noop", concurrency=1000)
                    await _fill(pool, jobs, keys=1000 if variant == "keys1000" else 0)
                    await _vacuum(pool)
                    key = f"{variant} c{slots}"
                    async with Cpu(url) as cpu:
                        results[key] = await _drain(pool, slots)
                    client, server = cpu.per_job(jobs)
                    results[f"{key} cpu"] = client * 1000
                    if server is not None:
                        results[f"{key} pg cpu"] = server * 1000
        finally:
            await pool.close()
    finally:
        await drop_database(dsn, database)
    return results


def _ratios(result: dict[str, float]) -> dict[str, float]:
    """Throughput ratios and Postgres CPU ratios (reference over variant: a ratio
    of costs that reads like one of rates) of one round of one checkout."""
    out: dict[str, float] = {}
    for slots in SLOTS:
        base = f"unlimited c{slots}"
        for variant in ("limit1000", "keys1000"):
            key = f"{variant} c{slots}"
            out[f"{key} / unlimited"] = result[key] / result[base]
            pg, pg_base = result.get(f"{key} pg cpu"), result.get(f"{base} pg cpu")
            if pg and pg_base:
                out[f"{key} / unlimited pg cpu"] = pg_base / pg
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--old", type=Path)
    parser.add_argument("--new", type=Path, default=Path())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--database", default="pgfleet_flow_ab")
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the event loop of the drains (uvloop, as `pgfleet worker` runs, when installed)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        if args.loop == "uvloop":
            # Not tools.bench.suite's install_loop: the old checkout's may predate it.
            with contextlib.suppress(ImportError):
                import uvloop

                asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        print(json.dumps(asyncio.run(_child(args.dsn, args.database, args.jobs))))
        return
    sides = ("old", "new") if args.old is not None else ("new",)
    runs: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    for round_ in range(args.repeats):
        order = sides if round_ % 2 == 0 else tuple(reversed(sides))
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
                    "--jobs",
                    str(args.jobs),
                    "--loop",
                    args.loop,
                ],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            result.update(_ratios(result))
            print(side, round_ + 1, json.dumps({k: round(v, 3) for k, v in result.items()}))
            sys.stdout.flush()
            for key, value in result.items():
                runs[side].setdefault(key, []).append(value)
    print(f"{'median of ' + str(args.repeats):34}" + "".join(f"{s:>12}" for s in sides))
    for key in runs[sides[-1]]:
        values = [statistics.median(runs[s].get(key, [float("nan")])) for s in sides]
        print(f"{key:34}" + "".join(f"{v:12.3f}" for v in values))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
