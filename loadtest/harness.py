"""Processes of a load-test run: Postgres, a scratch database, workers, the API, Locust.

Kept small on purpose: each process is ``python -m pgfleet ...`` or
``python -m locust ...`` with its output in a log file, stopped with SIGTERM and
killed if it lingers, and ending with the harness (die-with-parent). Finding
Postgres, the scratch database, the processes' guard and waiting are the
development kit's (tools/devkit/). Nothing here imports gevent.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tools.devkit import NoPostgres, free_port, guarded, stop, until
from tools.devkit import postgres as kit

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
SCRATCH_DB = "pgfleet_loadtest"
APP = "worker.app:registry"
#: How long a started process gets to become ready.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 45.0

#: A server the harness may create databases on (the development kit's).
Postgres = kit.Server


async def find_postgres() -> Postgres:
    """``PGFLEET_DATABASE_URL``, else a server on 127.0.0.1:5432, else an embedded
    server from the ``pgserver`` wheel (the ``embedded`` extra): the kit's order,
    without Docker."""
    try:
        return await kit.find_postgres(("PGFLEET_DATABASE_URL",), docker=False)
    except NoPostgres as exc:
        raise SystemExit(str(exc)) from None


async def fresh_database(pg: Postgres, name: str = SCRATCH_DB) -> str:
    """Drop and create the scratch database, migrate it, return its DSN."""
    return await kit.fresh_database(pg.admin_dsn, name)


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    log: Path

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def output(self, tail: int = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-tail:]

    async def stop(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM (a graceful drain), SIGKILL if it does not exit in time."""
        return await stop(self.process, timeout)


class Processes:
    """Starts the run's processes, logs each to a file, and stops what is left."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._procs: list[Proc] = []
        self._count = 0

    async def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._count += 1
        log = self.log_dir / f"{self._count:03d}-{name}.log"
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with log.open("wb") as out:
            process = await asyncio.create_subprocess_exec(
                *guarded(argv),  # ends with the harness, even when it is killed
                cwd=str(ROOT),
                env=child_env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        proc = Proc(name, process, log)
        self._procs.append(proc)
        return proc

    async def workers(self, dsn: str, processes: int, concurrency: int, *extra: str) -> Proc:
        """``pgfleet worker`` with ``processes`` children; returns once each
        registered a live heartbeat."""
        # The DSN travels in the environment: a password must not show in `ps`.
        argv = [sys.executable, "-m", "pgfleet", "worker", "--app", APP]
        argv += ["--processes", str(processes), "--concurrency", str(concurrency)]
        argv += ["--metrics-port", "0", "--log-level", "warning", *extra]
        proc = await self.spawn(
            f"worker-{processes}x{concurrency}", argv, {"PGFLEET_DATABASE_URL": dsn}
        )
        conn = await asyncpg.connect(dsn)
        try:

            async def registered() -> bool:
                if not proc.alive:
                    raise RuntimeError(f"pgfleet worker exited:\n{proc.output()}")
                n = await conn.fetchval(
                    "SELECT count(*) FROM pgfleet.workers WHERE expires_at > now()"
                )
                return bool(n >= processes)

            await until(registered, START_TIMEOUT, f"{processes} worker process(es)", interval=0.1)
        finally:
            await conn.close()
        return proc

    async def api(self, dsn: str, notify: str, pool_size: int) -> tuple[Proc, str]:
        """``pgfleet api`` on a free port; returns it with its base URL once it answers."""
        for _attempt in range(3):  # a free port can be taken before the child binds it
            port = free_port()
            argv = [sys.executable, "-m", "pgfleet", "api", "--port", str(port)]
            argv += ["--metrics-port", "0", "--notify", notify, "--pool-size", str(pool_size)]
            argv += ["--log-level", "warning"]
            proc = await self.spawn(f"api-{notify}", argv, {"PGFLEET_DATABASE_URL": dsn})
            url = f"http://127.0.0.1:{port}"
            if await _answers(proc, f"{url}/readyz"):
                return proc, url
            if "cannot listen" not in proc.output():
                break
        raise RuntimeError(f"pgfleet api did not start:\n{proc.output()}")

    async def stop_all(self) -> None:
        for proc in reversed(self._procs):
            if proc.alive:
                await proc.stop()


async def _answers(proc: Proc, url: str) -> bool:
    async with aiohttp.ClientSession() as session:

        async def ready() -> bool:
            if not proc.alive:
                return True
            try:
                async with session.get(url) as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await until(ready, START_TIMEOUT, url, interval=0.1)
    return proc.alive


@dataclass
class LocustRun:
    """One headless Locust run: its CSV prefix and exit code."""

    csv_prefix: Path
    returncode: int
    log: Path
    seconds: float


async def run_locust(
    procs: Processes,
    *,
    user: str,
    csv_prefix: Path,
    users: int,
    seconds: float,
    host: str | None = None,
    options: dict[str, Any] | None = None,
) -> LocustRun:
    """``python -m locust`` headless with CSVs (full history) for one measurement.

    ``options`` become ``--name value`` flags of the pgfleet Locust options. Users
    finish the request in hand when the time is up (``--stop-timeout``), so every
    request Locust counts has its answer, and every job it counts is committed.
    """
    csv_prefix.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless"]
    argv += ["-u", str(users), "-r", str(users), "-t", f"{max(1, round(seconds))}s"]
    argv += ["--csv", str(csv_prefix), "--csv-full-history", "--stop-timeout", "15"]
    argv += ["--only-summary", "--loglevel", "INFO"]
    if host:
        argv += ["--host", host]
    env = {"LOADTEST_USER": user}
    for key, value in (options or {}).items():
        if key == "dsn":  # in the environment (LOCUST_DSN): never on a command line
            env["LOCUST_DSN"] = str(value)
            continue
        argv += [f"--{key.replace('_', '-')}", str(value)]
    started = time.monotonic()
    proc = await procs.spawn(f"locust-{csv_prefix.name}", argv, env=env)
    code = await proc.process.wait()
    return LocustRun(csv_prefix, code, proc.log, time.monotonic() - started)
