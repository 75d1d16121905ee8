"""Running Locust and the harness as subprocesses: gevent never enters pytest."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"


def run(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``python argv...`` from the repository root; (exit code, output)."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
        check=False,
    )
    print(f"{argv[:3]} took {time.monotonic() - started:.1f}s")
    return result.returncode, result.stdout.decode(errors="replace")


def locust(user: str, *flags: str, timeout: float = 60) -> tuple[int, str]:
    argv = ["-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", *flags]
    return run(argv, timeout, env={"LOADTEST_USER": user})
