"""Print pgfleet's requirements, one per line, read from pyproject.toml.

``python requirements.py [EXTRA...]`` prints the project's dependencies and those of
each named extra. worker/Dockerfile installs them in a layer of their own, keyed on
pyproject.toml alone, before it copies the code.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(pyproject: Path, extras: list[str]) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in optional]
    if unknown:
        raise SystemExit(f"requirements.py: no such extra in {pyproject}: {', '.join(unknown)}")
    result: list[str] = list(project.get("dependencies", []))
    for extra in extras:
        result += optional[extra]
    return result


if __name__ == "__main__":
    print("\n".join(requirements(Path("pyproject.toml"), sys.argv[1:])))
