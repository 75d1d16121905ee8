"""Real processes for acceptance tests: start pgfleet commands, wait, signal, scrape."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as signals
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Re-exported: the tests import them from here. The kit owns them.
from tools.devkit import free_port as free_port
from tools.devkit import free_ports as free_ports
from tools.devkit import until

# The tests' name for the kit's until(): an assignment, which (unlike an import
# under another name) exports it.
eventually = until

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Proc:
    process: asyncio.subprocess.Process
    argv: list[str]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)

    async def stop(self, sig: int = signals.SIGTERM, timeout: float = 60) -> int:
        self.signal(sig)
        return await asyncio.wait_for(self.process.wait(), timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


async def start(
    args: list[str], log_dir: Path, name: str, env: dict[str, str] | None = None
) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}-{time.monotonic_ns()}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    argv = [sys.executable, "-m", "pgfleet", *args]
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *argv, cwd=str(ROOT), env=full_env, stdout=out, stderr=asyncio.subprocess.STDOUT
        )
    return Proc(process, argv, log)


async def start_worker(dsn: str, log_dir: Path, *extra: str, name: str = "worker") -> Proc:
    args = ["worker", "--dsn", dsn, "--app", "tests.apps.runtime_app:registry"]
    if "--metrics-port" not in extra:
        args += ["--metrics-port", "0"]
    return await start([*args, *extra], log_dir, name)


@asynccontextmanager
async def processes(*procs: Proc) -> AsyncIterator[None]:
    """Kill whatever is still running when the test ends (failure included)."""
    try:
        yield
    finally:
        for p in procs:
            if p.process.returncode is None:
                p.signal(signals.SIGKILL)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(p.process.wait(), 10)


async def http_get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def wait_http(url: str, timeout: float = 60) -> None:
    async def ok() -> bool:
        try:
            status, _ = await http_get(url)
        except aiohttp.ClientError:
            return False
        return status == 200

    await eventually(ok, timeout, f"{url} to answer")


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name (``_bucket``/``_count``/``_total`` names included)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def metric_types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


# --- process trees (Linux /proc) ---------------------------------------------------


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name may contain spaces
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``: children, grandchildren..."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        stat = _stat(int(entry.name)) if entry.name.isdigit() else None
        if stat is not None and stat[0] not in ("Z", "X"):
            children.setdefault(stat[1], []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
