"""Run load-test scenarios headless and write the capacity-planning report.

    python -m loadtest.run contention drain steady soak --profile full
    python -m loadtest.run all --profile smoke --out /tmp/smoke
    python -m loadtest.run steady --set steady.rates=200,800 --set steady.seconds=60

(``make loadtest SCENARIO=... PROFILE=...`` runs this.) The native fleet is the
default: the harness finds Postgres (``PGFLEET_DATABASE_URL``, else 127.0.0.1:5432,
else an embedded server), recreates the scratch database ``pgfleet_loadtest`` on
it, and starts the workers and the API each scenario needs. ``--fleet external``
(the default when ``LOCUST_HOST`` is set) starts nothing: Locust drives the API at
``LOCUST_HOST``, and ``PGFLEET_DATABASE_URL``, when given, is that fleet's own
database, sampled but never truncated.

Exit status: 0 when every Locust run passed its gate (and the report was written),
1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

import asyncpg

import pgfleet
from loadtest import harness, sampling, scenarios

DEFAULT_OUT = harness.ROOT / "loadtest" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scenarios", nargs="+", choices=[*scenarios.SCENARIOS, "all"])
    parser.add_argument("--profile", choices=sorted(scenarios.PROFILES), default="full")
    parser.add_argument(
        "--out", type=Path, help="results directory (default: a new one under loadtest/results/)"
    )
    parser.add_argument(
        "--fleet",
        choices=["native", "external"],
        default="external" if os.environ.get("LOCUST_HOST") else "native",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SCENARIO.FIELD=VALUE",
        help="override a parameter, e.g. contention.producers=1,8,32 (repeatable)",
    )
    parser.add_argument(
        "--database",
        default=harness.SCRATCH_DB,
        help="scratch database the native fleet recreates (default %(default)s)",
    )
    parser.add_argument("--no-report", action="store_true", help="skip the report")
    args = parser.parse_args(argv)
    if "all" in args.scenarios:
        args.scenarios = list(scenarios.SCENARIOS)
    return args


def scenario_params(args: argparse.Namespace) -> dict[str, Any]:
    params = dict(scenarios.PROFILES[args.profile])
    by_scenario: dict[str, list[str]] = {}
    for item in args.set:
        scenario, _, assignment = item.partition(".")
        if scenario not in params:
            raise SystemExit(f"--set {item!r}: the scenario must be one of {scenarios.SCENARIOS}")
        by_scenario.setdefault(scenario, []).append(assignment)
    for scenario, assignments in by_scenario.items():
        params[scenario] = scenarios.override(params[scenario], assignments)
    return params


async def describe(dsn: str | None, args: argparse.Namespace, source: str) -> dict[str, Any]:
    facts: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "profile": args.profile,
        "fleet": args.fleet,
        "postgres_source": source,
        "machine": sampling.machine_facts(),
        "pgfleet_version": pgfleet.__version__,
        "argv": sys.argv[1:],
    }
    if dsn is not None:
        conn = await asyncpg.connect(dsn)
        try:
            facts["postgres"] = await sampling.server_facts(conn)
        finally:
            await conn.close()
    return facts


async def main_async(args: argparse.Namespace) -> int:
    params = scenario_params(args)
    out: Path = args.out
    pg: harness.Postgres | None = None
    procs = harness.Processes(out / "logs")
    try:
        if args.fleet == "native":
            pg = await harness.find_postgres()
            dsn: str | None = await harness.fresh_database(pg, args.database)
            source = pg.source
        else:
            dsn = os.environ.get("PGFLEET_DATABASE_URL") or None
            source = "external fleet" + ("" if dsn else " (no database access)")
        run_facts = await describe(dsn, args, source)
        local = bool(run_facts.get("postgres", {}).get("local"))
        ctx = scenarios.Context(
            dsn=dsn,
            out=out,
            procs=procs,
            native=args.fleet == "native",
            host=os.environ.get("LOCUST_HOST"),
            cpu=local,
        )
        _write_json(out / "run.json", run_facts)
        failed: list[str] = []
        for name in args.scenarios:
            print(f"loadtest: {name} {dataclasses.asdict(params[name])}", flush=True)
            points = await scenarios.RUNNERS[name](ctx, params[name])
            failed += [f"{name}/{p['name']}" for p in points if p.get("locust_exit")]
        run_facts["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        _write_json(out / "run.json", run_facts)
    finally:
        await procs.stop_all()
        if pg is not None:
            pg.close()
    if not args.no_report:
        from loadtest import report

        path = report.write_report(out)
        print(f"loadtest: report {path}")
    print(f"loadtest: results in {out}")
    if failed:
        print(f"loadtest: Locust gate failed for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _write_json(path: Path, doc: Any) -> None:
    path.write_text(json.dumps(doc, indent=1))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out = args.out or DEFAULT_OUT / f"{stamp}-{args.profile}"
    args.out.mkdir(parents=True, exist_ok=True)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
