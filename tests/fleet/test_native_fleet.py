"""The native fleet (`make fleet`, tools/fleet) as real processes.

The acceptance test runs the native topology on free ports against this test's
database: three worker processes of the reference app, the jobs API, the demo
producer, and a real Prometheus scraping them every second with the short-threshold
alert rules (deploy/rules/alerts-test.yml). Every query of every dashboard panel then
runs against that Prometheus; the backlog-age alert must fire once the workers are
stopped while the producer keeps posting, and resolve when they are back.

The CLI tests run `python -m tools.fleet` and check that SIGINT and SIGTERM leave no
process behind, that a child dying is reported, and the embedded PostgreSQL path.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import os
import re
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from pgfleet import EnqueueOptions, Queue
from tests.fleet.support import (
    ALERTS_SHORT,
    REFERENCE_JOB_NAMES,
    ROOT,
    Prometheus,
    backlog_rule,
    binary,
    dashboard,
    panels,
    substitute,
)
from tests.procs import Proc, alive, cmdline, descendants, eventually, free_ports
from tools.fleet import FleetConfig, FleetError, NativeFleet, Ports

#: A job name no worker serves, paused for the test.
PARKED = "fleet_parked"

pytestmark = pytest.mark.slow

#: Core panels: each must show series for every reference kind (with $kind set to
#: that kind). True: the series themselves carry the kind label.
CORE_PANELS = {
    "Queued jobs per kind": True,
    "Oldest queued job age per kind": True,
    "Dead jobs per kind": True,
    "Handler duration p50 / p95 / p99 per kind": True,
    "Throughput by outcome": False,
}
BACKLOG_ALERT = "PgfleetBacklogAgeHigh"
#: Generous: a loaded two-core machine runs Prometheus, five Python processes and
#: PostgreSQL at once.
DEADLINE = 180.0


def free_fleet_ports(processes: int = 3) -> Ports:
    base = free_ports(processes + 3)
    return Ports(
        workers=base,
        api=base + processes,
        api_metrics=base + processes + 1,
        prometheus=base + processes + 2,
    )


def panel_queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels(dashboard()) for t in p["targets"]]


def for_kind(expr: str, kind: str) -> str:
    return substitute(expr.replace("${kind}", kind).replace("$kind", kind))


async def query(prom: Prometheus, expr: str) -> list[dict[str, Any]]:
    body = await asyncio.to_thread(prom.query, expr)
    assert body["status"] == "success", (expr, body.get("error"))
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


async def series(prom: Prometheus, expr: str, what: str) -> list[dict[str, Any]]:
    """The query's series, once there are any (the fleet has to work first)."""
    return await eventually(lambda: query(prom, expr), DEADLINE, f"series of {what}")


async def backlog_alerts(prom: Prometheus) -> list[dict[str, Any]]:
    body = await asyncio.to_thread(prom.api, "alerts")
    assert body["status"] == "success", body
    return [a for a in body["data"]["alerts"] if a["labels"]["alertname"] == BACKLOG_ALERT]


async def _park_waiting_work(database: str) -> None:
    """A job of a paused name and a child waiting on it: series for the panels of
    jobs waiting on limits, pauses and parents."""
    pool = await asyncpg.create_pool(database, min_size=1, max_size=2)
    try:
        queue = Queue(pool)
        await queue.pause(PARKED)
        parent = await queue.enqueue(PARKED, {})
        await queue.enqueue(PARKED, {}, options=EnqueueOptions(after=[parent]))
    finally:
        await pool.close()


@pytest.mark.timeout(900)
async def test_native_fleet_serves_every_panel_and_alerts_on_a_stopped_fleet(
    database: str, tmp_path: Path
) -> None:
    binary("prometheus")
    out = io.StringIO()
    fleet = NativeFleet(
        FleetConfig(
            database_url=database,
            state_dir=tmp_path / "fleet",
            ports=free_fleet_ports(),
            scrape_interval=1,
            alert_rules=ALERTS_SHORT,
            rate=10,
        ),
        out=out,
    )
    pids: set[int] = set()
    try:
        await fleet.start()
        fleet.start_summary()
        assert fleet.prometheus_url is not None
        prom = Prometheus.running_at(fleet.prometheus_url)
        pids = fleet_processes(fleet)
        assert len(pids) == 6, "supervisor, 3 worker processes, API, Prometheus"

        # Prometheus scrapes the three real worker processes and the real API.
        await eventually(
            lambda: _equals(query(prom, 'count(up{job=~"pgfleet-.+"} == 1)'), 4),
            DEADLINE,
            "Prometheus to scrape 3 workers and the API",
        )

        # Work that waits, for the panels of what waits: a paused name with a due
        # job, and a job waiting on it as its parent (a name no worker serves).
        await _park_waiting_work(database)

        # The core panels show every reference kind once the fleet has worked.
        for title, expr in panel_queries():
            if title not in CORE_PANELS:
                continue
            for kind in REFERENCE_JOB_NAMES:
                found = await series(prom, for_kind(expr, kind), f"{title} for {kind}")
                if CORE_PANELS[title]:
                    assert {s["metric"].get("kind") for s in found} == {kind}, (title, found)

        # Every query of every panel parses, runs and finds data.
        for title, expr in panel_queries():
            assert await series(prom, substitute(expr), title), title

        # The rules evaluate without errors against the real processes' series.
        rules = await asyncio.to_thread(
            prom.wait_for_rules,
            lambda rules: bool(rules) and all(r["health"] != "unknown" for r in rules),
            DEADLINE,
        )
        assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []

        # Workers stopped, producer still posting: the backlog alert fires...
        assert await backlog_alerts(prom) == []
        await fleet.stop_workers()
        assert fleet.producer is not None
        accepted = fleet.producer.stats.accepted
        firing = await eventually(
            lambda: _firing(prom), DEADLINE, f"{BACKLOG_ALERT} to fire with the workers stopped"
        )
        assert fleet.producer.stats.accepted > accepted, "the producer kept going"
        assert {a["labels"]["kind"] for a in firing} <= set(REFERENCE_JOB_NAMES)
        assert all(a["labels"]["severity"] == "page" for a in firing)
        assert all(a["annotations"]["summary"] for a in firing)

        # ... and resolves once they are back and have drained the backlog (with the
        # age gauge present and low: not merely because the series went missing).
        await fleet.start_workers()
        await eventually(lambda: _resolved(prom), DEADLINE, f"{BACKLOG_ALERT} to resolve")
        pids |= fleet_processes(fleet)
    finally:
        await fleet.stop()
    assert fleet.problems == [], out.getvalue()[-4000:]
    assert re.search(r"enqueued [1-9]\d* \| done [1-9]", out.getvalue()), out.getvalue()[-2000:]
    left = {pid for pid in pids if alive(pid)}
    assert not left, [cmdline(pid) for pid in left]


def fleet_processes(fleet: NativeFleet) -> set[int]:
    """The fleet's children and everything below them (the worker processes)."""
    children = set(fleet.pids().values())
    return children.union(*(descendants(pid) for pid in children))


async def _equals(value: Any, want: int) -> bool:
    result = await value
    return bool(result) and float(result[0]["value"][1]) == want


async def _firing(prom: Prometheus) -> list[dict[str, Any]]:
    return [a for a in await backlog_alerts(prom) if a["state"] == "firing"]


async def _resolved(prom: Prometheus) -> bool:
    if await backlog_alerts(prom):
        return False
    threshold, _for = backlog_rule(ALERTS_SHORT)
    # The parked job's age grows for ever, and the alert leaves it alone: so do we.
    ages = await query(
        prom,
        "max by (kind) (pgfleet_oldest_queued_job_age_seconds"
        " unless on (kind) (pgfleet_jobs_waiting_on_limit > 0))",
    )
    return bool(ages) and all(float(s["value"][1]) <= threshold for s in ages)


async def test_a_taken_port_fails_the_start_at_once_and_stops_what_started(
    database: str, tmp_path: Path
) -> None:
    """The worker supervisor would restart a process that cannot listen for ever: the
    fleet notices the first failure and stops everything it started."""
    ports = free_fleet_ports()
    out = io.StringIO()
    fleet = NativeFleet(
        FleetConfig(
            database_url=database,
            state_dir=tmp_path / "fleet",
            ports=ports,
            prometheus=False,
            rate=0,
            start_timeout=DEADLINE,
        ),
        out=out,
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.workers + 1))
        taken.listen()
        with pytest.raises(FleetError, match="workers cannot listen") as failure:
            await fleet.start()
    assert f"127.0.0.1:{ports.workers + 1}" in str(failure.value)
    assert fleet.problems == [], out.getvalue()
    tree = descendants(os.getpid())
    assert not [cmdline(pid) for pid in tree if "pgfleet" in cmdline(pid)]


# --- the command line ---------------------------------------------------------------------


async def start_cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Proc:
    ports = free_fleet_ports()
    argv = [
        sys.executable,
        "-m",
        "tools.fleet",
        "--state-dir", str(tmp_path / "fleet"),
        "--metrics-port", str(ports.workers),
        "--api-port", str(ports.api),
        "--api-metrics-port", str(ports.api_metrics),
        "--prometheus-port", str(ports.prometheus),
        *args,
    ]  # fmt: skip
    log = tmp_path / "fleet-cli.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *argv,
            cwd=str(ROOT),
            env={**(env if env is not None else os.environ), "PYTHONUNBUFFERED": "1"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    return Proc(process, argv, log)


async def summary_shows_work(cli: Proc) -> bool:
    if cli.process.returncode is not None:
        raise AssertionError(f"the fleet exited early:\n{cli.output()[-3000:]}")
    return len(re.findall(r"\| done [1-9]\d* \|", cli.output())) >= 2


@contextlib.asynccontextmanager
async def running(cli: Proc) -> Any:
    """Kill the fleet and everything below it if the test fails half-way."""
    try:
        yield
    finally:
        if cli.process.returncode is None:
            tree = descendants(cli.pid)
            cli.signal(signal.SIGKILL)
            await cli.process.wait()
            for pid in tree:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def pgfleet_role(pid: int) -> str:
    args = cmdline(pid)
    if "pgfleet" not in args:
        return "prometheus" if any("prometheus" in a for a in args[:1]) else "?"
    role = args[args.index("pgfleet") + 1]
    if role == "worker":
        return "supervisor" if args[args.index("--processes") + 1] != "1" else "worker"
    return role


def roles(pids: set[int]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for pid in pids:
        found.setdefault(pgfleet_role(pid), []).append(pid)
    return found


async def assert_all_gone(pids: set[int], output: str) -> None:
    async def gone() -> bool:
        return not any(alive(pid) for pid in pids)

    try:
        await eventually(gone, 30, "every process of the fleet to exit")
    except TimeoutError:
        left = [cmdline(pid) for pid in pids if alive(pid)]
        raise AssertionError(f"left behind: {left}\n{output[-3000:]}") from None


@pytest.mark.timeout(600)
async def test_cli_drains_on_sigint_and_leaves_no_process_behind(
    database: str, tmp_path: Path
) -> None:
    no_prometheus = () if _on_path("prometheus") else ("--no-prometheus",)
    cli = await start_cli(tmp_path, "--database-url", database, "--rate", "10", *no_prometheus)
    async with running(cli):
        await eventually(lambda: summary_shows_work(cli), DEADLINE, "the summary to show work")
        tree = descendants(cli.pid)
        found = roles(tree)
        assert len(found.get("worker", [])) == 3, found
        assert len(found.get("supervisor", [])) == 1, found
        assert len(found.get("api", [])) == 1, found
        if not no_prometheus:
            assert len(found.get("prometheus", [])) == 1, found

        # SIGUSR1 stops the workers while the rest goes on, and starts them again.
        cli.signal(signal.SIGUSR1)
        await eventually(
            lambda: _says(cli, r"workers stopped\n(.*\n)*.*workers 0/3 up"),
            DEADLINE,
            "the workers to stop",
        )
        assert not any(alive(pid) for pid in found["worker"])
        cli.signal(signal.SIGUSR1)
        await eventually(
            lambda: _says(cli, r"workers started\n(.*\n)*.*workers 3/3 up"),
            DEADLINE,
            "the workers to start again",
        )
        tree = descendants(cli.pid)
        assert len(roles(tree).get("worker", [])) == 3
        await console_answers(cli, tmp_path / "fleet" / "operator-token")

        cli.signal(signal.SIGINT)
        code = await asyncio.wait_for(cli.process.wait(), DEADLINE)
    output = cli.output()
    assert code == 0, output[-3000:]
    await assert_all_gone(tree, output)
    assert "jobs API    http://127.0.0.1:" in output  # the banner says where to look
    assert "fleet stopped: every process exited" in output
    assert "!!" not in output, output[-3000:]
    workers_log = (tmp_path / "fleet" / "logs" / "workers.log").read_text()
    assert workers_log.count("exited with 0") == 6, "every worker process drained, twice"


@pytest.mark.timeout(600)
async def test_cli_reports_dead_children_and_stops_on_sigterm(
    database: str, tmp_path: Path
) -> None:
    cli = await start_cli(tmp_path, "--database-url", database, "--rate", "5", "--no-prometheus")
    async with running(cli):
        await eventually(lambda: summary_shows_work(cli), DEADLINE, "the summary to show work")
        found = roles(descendants(cli.pid))
        (api,) = found["api"]
        worker = found["worker"][0]

        os.kill(worker, signal.SIGKILL)  # the supervisor restarts it; the fleet says so
        await eventually(
            lambda: _says(cli, rf"!! worker process \d \(pid {worker}\) died with signal SIGKILL"),
            DEADLINE,
            "the worker's death to be reported",
        )
        os.kill(api, signal.SIGKILL)
        await eventually(
            lambda: _says(cli, rf"!! api \(pid {api}\) exited unexpectedly with signal SIGKILL"),
            DEADLINE,
            "the API's death to be reported",
        )
        # Restarted and serving (its signal handlers are installed by then: a SIGTERM
        # during a Python process's start-up kills it outright).
        await eventually(
            lambda: _says(cli, r"died with signal SIGKILL.*\n(?:.*\n)*?.*workers 3/3 up"),
            DEADLINE,
            "the supervisor to restart the worker process",
        )
        tree = descendants(cli.pid)
        cli.signal(signal.SIGTERM)
        code = await asyncio.wait_for(cli.process.wait(), DEADLINE)
    output = cli.output()
    assert code == 1, "problems were reported: the exit code says so"
    assert "2 problem(s) reported above" in output, output[-3000:]
    await assert_all_gone(tree, output)


async def console_answers(cli: Proc, token_file: Path) -> None:
    """The console is on by default: sign in with the operator credential the runner
    made (or the one token from the environment) and read the overview."""
    import aiohttp

    found = re.search(r"console     (http://127\.0\.0\.1:\d+)/ui/", cli.output())
    assert found, cli.output()[-3000:]
    base = found.group(1)
    token = os.environ.get("PGFLEET_API_TOKEN") or token_file.read_text().strip()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.get(f"{base}/ui/login") as resp:
            csrf = re.search(r'name="login_csrf" value="([^"]+)"', await resp.text())
        assert csrf is not None
        form = {"token": token, "login_csrf": csrf.group(1), "next": "/ui/"}
        async with http.post(f"{base}/ui/login", data=form) as resp:
            assert resp.status == 200 and resp.url.path == "/ui/"
            assert "Workers alive" in await resp.text()


async def _says(cli: Proc, pattern: str) -> bool:
    return re.search(pattern, cli.output()) is not None


def _on_path(name: str) -> bool:
    import shutil

    return shutil.which(name) is not None


@pytest.mark.timeout(600)
async def test_cli_without_a_database_url_runs_an_embedded_postgres(tmp_path: Path) -> None:
    if importlib.util.find_spec("pgserver") is None:
        pytest.skip("the pgserver wheel is not installed (the `embedded` extra)")
    env = {k: v for k, v in os.environ.items() if k != "PGFLEET_DATABASE_URL"}
    cli = await start_cli(tmp_path, "--rate", "5", "--no-prometheus", env=env)
    async with running(cli):
        await eventually(lambda: summary_shows_work(cli), DEADLINE, "the summary to show work")
        postmaster = tmp_path / "fleet" / "pgdata" / "postmaster.pid"
        postgres = int(postmaster.read_text().split()[0])
        assert alive(postgres)
        tree = descendants(cli.pid) | {postgres}
        cli.signal(signal.SIGINT)
        code = await asyncio.wait_for(cli.process.wait(), DEADLINE)
    output = cli.output()
    assert code == 0, output[-3000:]
    assert "embedded PostgreSQL in" in output
    await assert_all_gone(tree, output)
