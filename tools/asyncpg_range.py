"""``make test-asyncpg-range``: the tests of the code that touches asyncpg's private
internals (``pgfleet.db.connect.release_now``), against the lowest and the highest
asyncpg that ``pyproject.toml`` allows.

Each version is installed into a throwaway directory put ahead of the venv's own
asyncpg on ``PYTHONPATH``; everything else comes from the venv."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The tests that exercise asyncpg's internals (and the row shape the claim loop
#: unpacks by position).
TESTS = (
    "tests/integration/test_pool_release.py",
    "tests/unit/db/test_data_layer.py",
    "tests/integration/test_round_trips.py",
)


def bounds(pyproject: Path = ROOT / "pyproject.toml") -> tuple[str, str]:
    """The range ``asyncpg>=LOW,<HIGH`` of pyproject's dependencies."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for requirement in dependencies:
        found = re.fullmatch(r"asyncpg>=([\d.]+),<([\d.]+)", requirement.replace(" ", ""))
        if found:
            return found.group(1), found.group(2)
    raise SystemExit("pyproject.toml: asyncpg must be required as asyncpg>=LOW,<HIGH")


def main() -> int:
    low, high = bounds()
    failed = []
    for spec in (f"asyncpg=={low}", f"asyncpg<{high}"):
        with tempfile.TemporaryDirectory(prefix="pgfleet-asyncpg-") as target:
            pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
            subprocess.run(
                [*pip, "--disable-pip-version-check", "--target", target, spec], check=True
            )
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [target, os.environ.get("PYTHONPATH")])),
                "PGFLEET_TEST_LOOPS": "asyncio",
            }
            version = subprocess.run(
                [sys.executable, "-c", "import asyncpg; print(asyncpg.__version__)"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            print(f"asyncpg {version} ({spec})", flush=True)
            tests = subprocess.run(
                [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:randomly"],
                env=env,
                cwd=ROOT,
                check=False,
            )
            if tests.returncode:
                failed.append(version)
    if failed:
        print(f"failed on asyncpg {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
