"""The lock files and what each installs.

Every lock is resolved from pyproject.toml, the superset first (dev) and every other
one constrained by it, so a package has the same version in every lock.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = ROOT / "requirements"
BUILD_IN = REQUIREMENTS / "build.in"
PYTHON = "3.11"


@dataclass(frozen=True)
class Lock:
    name: str
    #: pyproject extras it installs (the project's own dependencies always).
    extras: tuple[str, ...]
    #: Whether requirements/build.in (setuptools, wheel) is part of it.
    build: bool
    #: Who installs it.
    used_by: str

    @property
    def path(self) -> Path:
        return REQUIREMENTS / f"{self.name}.lock"


LOCKS = (
    Lock("dev", ("dev", "docs", "service", "embedded", "loadtest"), True, "make venv, .ci/run"),
    Lock("service", ("service",), False, "worker/Dockerfile (runtime)"),
    Lock("loadtest", ("service", "loadtest"), False, "worker/Dockerfile (loadtest)"),
    Lock("fleet", ("service", "embedded"), False, "make fleet"),
    Lock("build", (), True, "worker/Dockerfile (builds the pgfleet wheel)"),
    Lock("release", ("service", "typed", "tracing"), False, "tools/release_check.py (CI)"),
)

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def pins(path: Path) -> dict[str, str]:
    """name -> version of every ``name==version`` line (names normalised)."""
    return {normalise(m.group(1)): m.group(2) for m in _PIN.finditer(path.read_text())}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def compile_lock(lock: Lock, constraint: Path | None) -> None:
    command = [
        sys.executable, "-m", "uv", "pip", "compile", "--quiet",
        "--universal", "--python-version", PYTHON, "--generate-hashes",
        "--index-url", "https://pypi.org/simple",
        "--custom-compile-command", "make lock",
        "-o", str(lock.path),
    ]  # fmt: skip
    if lock.extras or not lock.build:
        command.append(str(ROOT / "pyproject.toml"))
        command += [f"--extra={extra}" for extra in lock.extras]
    if lock.build:
        command.append(str(BUILD_IN))
    if constraint is not None:
        command += ["--constraint", str(constraint)]
    subprocess.run(command, cwd=ROOT, check=True)
    header = f"# {lock.path.name}: installed by {lock.used_by}. Regenerate with `make lock`.\n"
    lock.path.write_text(header + lock.path.read_text())


def relock() -> None:
    dev = LOCKS[0]
    compile_lock(dev, None)
    for lock in LOCKS[1:]:
        compile_lock(lock, dev.path)
