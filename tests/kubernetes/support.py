"""Helpers for the Kubernetes manifest tests: rendering with kubectl kustomize."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
OVERLAYS = sorted(p.name for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
KEDA_OVERLAYS = [o for o in OVERLAYS if o.startswith("keda-")]
#: Everything that renders: the base and every overlay.
TARGETS = ["base", *(f"overlays/{o}" for o in OVERLAYS)]
CRDS = Path(__file__).resolve().parent / "crds"


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None and os.environ.get("CI") == "true":
        pytest.fail("kubectl is missing in CI: .ci/run installs kubernetes-client")
    if path is None:
        pytest.skip(
            "kubectl is not on PATH (CI installs it: apt-get install kubernetes-client; "
            ".ci/run does so when it is missing)"
        )
    return path


@cache
def _render(target: str) -> str:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(KUBERNETES / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"kubectl kustomize {target} failed:\n{proc.stderr}")
    return proc.stdout


def render(target: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize deploy/kubernetes/<target>` prints."""
    return [d for d in yaml.safe_load_all(_render(target)) if d]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def trigger(scaled_object: dict[str, Any], name: str) -> dict[str, Any]:
    matches: list[dict[str, Any]] = [
        t for t in scaled_object["spec"]["triggers"] if t["name"] == name
    ]
    (found,) = matches
    return found
