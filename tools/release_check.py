"""``python -m tools.release_check``: what a user installs works.

Builds the sdist and the wheel from this checkout, installs the wheel with its
extras into a new virtual environment (nothing of the checkout importable), and
there, as a user would after ``pip install``: ``pgfleet --version``, then the
getting-started page's steps on a scratch database of its own: ``pgfleet
migrate``, ``python enqueue.py`` (its example files, copied), ``pgfleet worker
--app tasks:registry`` until the job has succeeded, Ctrl-C, ``pgfleet jobs list``.

PostgreSQL is found as the tests find it (``PGFLEET_TEST_DSN``, a local server,
testcontainers, embedded). ``--keep DIR`` leaves the build, the venv and the
project folder in DIR. Exit status 0 when every step passed; each step is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from pathlib import Path

from tools.devkit import create_database, drop_database, find_postgres_sync

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = ROOT / "docs" / "snippets" / "getting_started"
EXTRAS = "service,typed,tracing"
DEADLINE = 90.0


class CheckFailed(Exception):
    pass


def step(what: str) -> None:
    print(f"release check: {what}", flush=True)


def run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise CheckFailed(f"`{' '.join(argv)}` exited {done.returncode}:\n{output[-4000:]}")
    return output


def build(out: Path) -> tuple[Path, Path]:
    step("building the sdist and the wheel")
    # The sdist first, then the wheel built from it: a file the sdist lacks fails here.
    # No build isolation: the locked setuptools of this environment builds it.
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out)], cwd=ROOT)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    sdist = out / f"pgfleet-{version}.tar.gz"
    wheel = out / f"pgfleet-{version}-py3-none-any.whl"
    for path in (sdist, wheel):
        if not path.is_file():
            raise CheckFailed(f"{path.name} was not built: {sorted(p.name for p in out.iterdir())}")
    return sdist, wheel


def install(wheel: Path, venv: Path) -> Path:
    step(f"installing {wheel.name}[{EXTRAS}] into a new virtual environment")
    run([sys.executable, "-m", "venv", str(venv)], cwd=venv.parent)
    bin_dir = venv / "bin"
    # The extras' dependencies from their lock (every file's hash checked), then the
    # wheel with its extras and no index: its metadata must be satisfied by exactly
    # what was locked, and nothing unpinned is downloaded.
    lock = ROOT / "requirements" / "release.lock"
    locked = ["install", "--quiet", "--require-hashes", "--no-deps", "-r", str(lock)]
    run([str(bin_dir / "pip"), *locked], cwd=venv.parent)
    run(
        [str(bin_dir / "pip"), "install", "--quiet", "--no-index", f"{wheel}[{EXTRAS}]"],
        cwd=venv.parent,
    )
    return bin_dir


def user_env(bin_dir: Path, dsn: str) -> dict[str, str]:
    """A user's shell: the venv first on PATH, no PYTHONPATH into this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PGFLEET_"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(bin_dir.parent),
        PGFLEET_DATABASE_URL=dsn,
        PYTHONUNBUFFERED="1",
    )
    return env


def getting_started(bin_dir: Path, project: Path, dsn: str) -> None:
    env = user_env(bin_dir, dsn)
    version = run([str(bin_dir / "pgfleet"), "--version"], cwd=project, env=env).strip()
    step(f"`pgfleet --version`: {version}")
    where = run(
        [str(bin_dir / "python"), "-c", "import pgfleet; print(pgfleet.__file__)"],
        cwd=project,
        env=env,
    )
    if str(ROOT) in where:
        raise CheckFailed(f"pgfleet was imported from the checkout, not the wheel: {where}")
    for name in ("tasks.py", "enqueue.py"):
        shutil.copy(SNIPPETS / name, project / name)
    step("`pgfleet migrate`: " + run(["pgfleet", "migrate"], cwd=project, env=env).strip())
    step("`python enqueue.py`: " + run(["python", "enqueue.py"], cwd=project, env=env).strip())
    log = project / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            ["pgfleet", "worker", "--app", "tasks:registry", "--metrics-port", "0"],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + DEADLINE
        while "sending 'Welcome' to ada@example.com" not in log.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise CheckFailed(f"the worker did not run the job:\n{log.read_text()[-4000:]}")
            time.sleep(0.1)
    finally:
        worker.send_signal(signal.SIGINT)
        code = worker.wait(60)
    if code != 0:
        raise CheckFailed(f"the worker exited {code} on Ctrl-C:\n{log.read_text()[-4000:]}")
    step("`pgfleet worker --app tasks:registry` ran the job and drained on Ctrl-C")
    listing = run(["pgfleet", "jobs", "list", "--json"], cwd=project, env=env)
    if '"status": "succeeded"' not in listing:
        raise CheckFailed(f"`pgfleet jobs list` does not show the job succeeded:\n{listing}")
    step("`pgfleet jobs list`: the job succeeded")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.release_check", description=__doc__)
    parser.add_argument("--keep", type=Path, help="build and install here, and keep it")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="pgfleet-release-"))
    work.mkdir(parents=True, exist_ok=True)
    server = find_postgres_sync(("PGFLEET_TEST_DSN",))
    database = f"pgfleet_release_{uuid.uuid4().hex[:8]}"
    try:
        _sdist, wheel = build(work / "dist")
        bin_dir = install(wheel, work / "venv")
        project = work / "myproject"
        project.mkdir(exist_ok=True)
        dsn = asyncio.run(create_database(server.admin_dsn, database))
        getting_started(bin_dir, project, dsn)
    except CheckFailed as exc:
        print(f"release check FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        asyncio.run(drop_database(server.admin_dsn, database))
        server.close()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    step("passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
