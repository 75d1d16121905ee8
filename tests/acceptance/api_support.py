"""Real processes for the API and CLI acceptance tests: ``pgfleet api`` and
``pgfleet worker`` as subprocesses, talked to over real HTTP and real Postgres.

Waiting across a process boundary has no event to wait on, so helpers poll a
condition with a deadline (never a fixed sleep); the deadlines are generous
because the machine may be shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from tests.procs import free_port
from tools.devkit import until as wait_until

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.apps.runtime_app:registry"
DEADLINE = 60.0
T = TypeVar("T")


async def until(
    check: Callable[[], Awaitable[T | None]],
    what: str,
    timeout: float = DEADLINE,
    every: float = 0.05,
) -> T:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    return await wait_until(check, timeout, what, interval=every)


@dataclass
class Process:
    """A ``python -m pgfleet ...`` child with its output in a file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.alive:
            self.popen.send_signal(sig)

    async def wait(self, timeout: float = DEADLINE) -> int:
        try:
            return await asyncio.to_thread(self.popen.wait, timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} did not exit within {timeout:.0f}s:\n{self.output()}"
            ) from None

    async def kill(self) -> None:
        self.signal(signal.SIGKILL)
        await self.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class Fleet:
    """Starts processes for one test and makes sure none outlives it."""

    database: str
    tmp_path: Path
    processes: list[Process] = field(default_factory=list)
    _count: int = 0

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> Process:
        self._count += 1
        log = self.tmp_path / f"{self._count:02d}-{name}.log"
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "pgfleet", *args],
                cwd=ROOT,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Process(name, popen, log)
        self.processes.append(proc)
        return proc

    def worker(self, *flags: str, dsn: str | None = None) -> Process:
        return self.spawn(
            "worker",
            "worker",
            "--dsn",
            dsn or self.database,
            "--app",
            APP,
            "--metrics-port",
            "0",
            "--poll-interval",
            "0.2",
            *flags,
        )

    async def api(
        self,
        *flags: str,
        dsn: str | None = None,
        env: dict[str, str] | None = None,
        metrics: bool = False,
    ) -> Api:
        """Start ``pgfleet api`` on free ports and wait until it answers."""
        for _attempt in range(3):  # a free port can be taken before the child binds it
            port = free_port()
            metrics_port = free_port() if metrics else 0
            args = ["api", "--dsn", dsn or self.database, "--port", str(port)]
            args += ["--metrics-port", str(metrics_port), *flags]
            proc = self.spawn("api", *args, env=env)
            api = Api(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}")
            if await api.started():
                return api
            if "cannot listen" not in proc.output():
                break
        raise AssertionError(f"pgfleet api did not start:\n{proc.output()}")

    async def stop_all(self) -> None:
        for proc in self.processes:
            if proc.alive:
                proc.signal(signal.SIGKILL)
            with contextlib.suppress(AssertionError):
                await proc.wait(10)


@dataclass
class Api:
    proc: Process
    url: str
    metrics_url: str

    async def started(self) -> bool:
        async with aiohttp.ClientSession() as session:

            async def answers() -> bool:
                if not self.proc.alive:
                    return True  # stop polling: it exited
                try:
                    async with session.get(f"{self.url}/healthz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await until(answers, f"pgfleet api at {self.url}")
        return self.proc.alive

    async def stop(self) -> int:
        """SIGTERM, then the exit code."""
        self.proc.signal(signal.SIGTERM)
        return await self.proc.wait()


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any


async def call(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    json: Any = None,
    data: bytes | str | None = None,
    headers: dict[str, str] | None = None,
) -> Reply:
    """One request; the body decoded as JSON (every answer of the API is JSON)."""
    async with session.request(method, url, json=json, data=data, headers=headers) as resp:
        text = await resp.text()
        try:
            body = jsonlib.loads(text)
        except ValueError:
            raise AssertionError(
                f"{method} {url} -> {resp.status} with a body that is not JSON: {text[:200]!r}"
            ) from None
        return Reply(resp.status, dict(resp.headers), body)


async def jobs_table(conn: Any) -> list[tuple[Any, ...]]:
    """Every row of pgfleet.jobs, to compare before and after a refused request."""
    rows = await conn.fetch("SELECT * FROM pgfleet.jobs ORDER BY id")
    return [tuple(r.values()) for r in rows]
