"""``python -m tools.fleet`` (what ``make fleet`` runs): the native fleet until Ctrl-C.

Every option also comes from an environment variable; ``make fleet FLEET_ARGS=...``
passes flags through.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import shlex
import signal
import sys
from pathlib import Path

from tools.fleet.config import ROOT, RULES, FleetConfig, Ports, made_credentials
from tools.fleet.native import FleetError, NativeFleet

#: Signals this soon after the first are the same request (`timeout`, or a whole
#: process group signalled at once, delivers them twice): they must not skip the drain.
REPEAT_WINDOW = 1.0


def _env(name: str, default: object) -> str:
    return os.environ.get(name, str(default))


def build_parser() -> argparse.ArgumentParser:
    defaults = FleetConfig()
    ports = defaults.ports
    parser = argparse.ArgumentParser(
        prog="python -m tools.fleet",
        description="Run pgfleet's fleet natively: PostgreSQL, migrations, worker processes, "
        "the jobs API, a demo producer and Prometheus. Ctrl-C drains and stops everything.",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("PGFLEET_DATABASE_URL"),
        help="PostgreSQL to use [PGFLEET_DATABASE_URL] (default: an embedded server in "
        "STATE_DIR/pgdata)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=_env("PGFLEET_PROCESSES", defaults.processes),
        help="worker processes [PGFLEET_PROCESSES] (default %(default)s)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=_env("PGFLEET_DEMO_RATE", defaults.rate),
        help="jobs per second the demo producer posts; 0: none [PGFLEET_DEMO_RATE] "
        "(default %(default)s)",
    )
    for flag, env, default, text in (
        ("--api-port", "PGFLEET_API_PORT", ports.api, "port of the jobs API"),
        ("--api-metrics-port", "PGFLEET_API_METRICS_PORT", ports.api_metrics, "API metrics"),
        (
            "--metrics-port",
            "PGFLEET_METRICS_PORT",
            ports.workers,
            "worker process i serves metrics on this + i",
        ),
        ("--prometheus-port", "PGFLEET_PROMETHEUS_PORT", ports.prometheus, "Prometheus"),
    ):
        parser.add_argument(
            flag, type=int, default=_env(env, default), help=f"{text} [{env}] (default %(default)s)"
        )
    parser.add_argument(
        "--no-prometheus", action="store_true", help="do not start Prometheus even if on PATH"
    )
    parser.add_argument(
        "--scrape-interval",
        type=float,
        default=defaults.scrape_interval,
        help="Prometheus scrape and evaluation interval, seconds (default %(default)s)",
    )
    parser.add_argument(
        "--alert-rules",
        type=Path,
        default=defaults.alert_rules,
        help="alert rules Prometheus loads (default deploy/rules/alerts.yml; "
        f"{(RULES / 'alerts-test.yml').relative_to(ROOT)} has thresholds of seconds)",
    )
    parser.add_argument(
        "--worker-args",
        default=_env("PGFLEET_FLEET_WORKER_ARGS", ""),
        help="extra flags for `pgfleet worker`, e.g. '--concurrency 8' [PGFLEET_FLEET_WORKER_ARGS]",
    )
    parser.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        default=_env("PGFLEET_API_UI", "1").strip().lower() not in ("0", "false", "no", "off"),
        help="do not serve the operator console at the API's /ui [PGFLEET_API_UI=0] "
        "(default: served; without PGFLEET_API_TOKEN a producer and an operator "
        "credential are made and kept in STATE_DIR/producer-token and operator-token)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=_env("PGFLEET_FLEET_DIR", defaults.state_dir),
        help="embedded database, Prometheus data, generated config and logs "
        "[PGFLEET_FLEET_DIR] (default .fleet)",
    )
    return parser


def config_from(args: argparse.Namespace) -> FleetConfig:
    return FleetConfig(
        database_url=args.database_url or None,
        state_dir=Path(args.state_dir).resolve(),
        processes=int(args.processes),
        ports=Ports(
            api=int(args.api_port),
            api_metrics=int(args.api_metrics_port),
            workers=int(args.metrics_port),
            prometheus=int(args.prometheus_port),
        ),
        prometheus=not args.no_prometheus,
        scrape_interval=float(args.scrape_interval),
        alert_rules=Path(args.alert_rules).resolve(),
        rate=float(args.rate),
        api_token=os.environ.get("PGFLEET_API_TOKEN") or None,
        ui=bool(args.ui),
        worker_args=tuple(shlex.split(args.worker_args)),
    )


async def run(config: FleetConfig) -> int:
    made = config.ui and config.api_token is None
    if made:
        # Operators sign in to the console with a credential of their own, which the
        # producer, a producer credential, does not have.
        producer, credentials = made_credentials(config.state_dir)
        config = dataclasses.replace(config, api_token=producer, api_credentials=credentials)
    fleet = NativeFleet(config)
    fleet.token_file = made
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    first_at = 0.0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal first_at
        if not stop.is_set():
            stop.set()
            first_at = loop.time()
            fleet.say(
                f"\n{sig.name}: stopping the producer, draining the workers and the API "
                "(signal again to stop at once)"
            )
        elif loop.time() - first_at >= REPEAT_WINDOW:
            fleet.say(f"{sig.name} again: stopping without draining")
            fleet.hurry()

    # SIGHUP too: a closed terminal hangs up the runner, not the children (they have
    # their own process groups), so it must stop them.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal, sig)

    starting = asyncio.create_task(fleet.start())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait((starting, stopped), return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # signalled while starting: start() cleans up after itself
        starting.cancel()
    try:
        await starting
    except FleetError as exc:
        fleet.say(f"fleet: {exc}")
        if "cannot listen" in str(exc):
            fleet.say(
                "fleet: a port is taken: choose others with --api-port, --api-metrics-port, "
                "--metrics-port (workers), --prometheus-port"
            )
        return 1
    except asyncio.CancelledError:
        fleet.say("fleet: stopped while starting")
        return 1
    fleet.say(fleet.banner())
    fleet.start_summary()
    toggles: set[asyncio.Task[None]] = set()

    def on_usr1() -> None:
        if stop.is_set() or toggles:  # stopping, or the last toggle is not done yet
            return
        task = asyncio.create_task(_toggle(fleet))
        toggles.add(task)
        task.add_done_callback(toggles.discard)

    loop.add_signal_handler(signal.SIGUSR1, on_usr1)
    await stop.wait()
    await fleet.stop()
    fleet.say(
        "fleet stopped: every process exited"
        + (f"; {len(fleet.problems)} problem(s) reported above" if fleet.problems else "")
    )
    return 1 if fleet.problems else 0


async def _toggle(fleet: NativeFleet) -> None:
    try:
        await fleet.toggle_workers()
    except FleetError as exc:
        fleet.problem(f"the workers did not start: {exc}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from(args)
    except ValueError as exc:
        raise SystemExit(f"fleet: {exc}") from None
    return asyncio.run(run(config))


if __name__ == "__main__":
    sys.exit(main())
