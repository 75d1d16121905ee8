"""The pinned supply chain: every install path installs a lock with hashes, the locks
agree with pyproject.toml and with each other, and the audit finds a vulnerable pin."""

from __future__ import annotations

import io
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tools.supply import audit as supply_audit
from tools.supply.audit import affected, from_snapshot, load_snapshot
from tools.supply.locks import BUILD_IN, LOCKS, ROOT, normalise, pins

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
ENV = {"sys_platform": "linux", "python_version": "3.11", "platform_system": "Linux"}


def requirements(lock: Any) -> list[Requirement]:
    wanted: list[str] = []
    if lock.extras or not lock.build:
        wanted += PYPROJECT["dependencies"]
    for extra in lock.extras:
        wanted += PYPROJECT["optional-dependencies"][extra]
    if lock.build:
        wanted += [
            line for line in BUILD_IN.read_text().splitlines() if line and not line.startswith("#")
        ]
    return [Requirement(r) for r in wanted]


@pytest.mark.parametrize("lock", LOCKS, ids=lambda lock: lock.name)
def test_every_pin_is_exact_and_hashed(lock: Any) -> None:
    text = lock.path.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 3)[-1])
    entries = [b for b in blocks if "==" in b.split("\n", 1)[0]]
    assert entries, lock.path
    for entry in entries:
        assert "--hash=sha256:" in entry, entry.split("\n", 1)[0]
    assert all(" @ " not in line and "-e " not in line for line in text.splitlines())


@pytest.mark.parametrize("lock", LOCKS, ids=lambda lock: lock.name)
def test_each_lock_satisfies_what_pyproject_asks_for_it(lock: Any) -> None:
    pinned = pins(lock.path)
    for req in requirements(lock):
        if req.marker is not None and not req.marker.evaluate(ENV):
            continue
        name = normalise(req.name)
        assert name in pinned, f"{lock.path.name} lacks {req}: run `make lock`"
        assert req.specifier.contains(pinned[name], prereleases=True), (
            f"{lock.path.name} pins {name}=={pinned[name]}, outside {req}: run `make lock`"
        )


def test_a_package_has_one_version_in_every_lock() -> None:
    versions: dict[str, set[str]] = {}
    for lock in LOCKS:
        for name, version in pins(lock.path).items():
            versions.setdefault(name, set()).add(version)
    assert {n: v for n, v in versions.items() if len(v) > 1} == {}


def test_the_aiohttp_floor_is_above_its_known_advisories() -> None:
    floor = next(
        Requirement(r)
        for r in PYPROJECT["optional-dependencies"]["service"]
        if r.startswith("aiohttp")
    )
    lowest = Version(str(next(iter(floor.specifier)).version))
    snapshot = load_snapshot()
    for advisory in snapshot["advisories"]:
        if advisory["package"] == "aiohttp":
            assert not affected(str(lowest), advisory), advisory["id"]


def test_the_osv_ranges_are_read_as_osv_means_them() -> None:
    advisory = {
        "ranges": [
            [{"introduced": "0"}, {"fixed": "3.9.2"}],
            [{"introduced": "4.0.0a1"}, {"last_affected": "4.0.0a2"}],
        ],
        "versions": ["5.0"],
    }
    assert affected("3.9.1", advisory) and affected("0.1", advisory)
    assert not affected("3.9.2", advisory) and not affected("3.14.5", advisory)
    assert affected("4.0.0a2", advisory) and not affected("4.0.0", advisory)
    assert affected("5.0", advisory)
    assert affected("9", {"ranges": [[{"introduced": "2.0"}]]})  # nothing fixed it


def test_the_audit_reports_a_vulnerable_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    findings = from_snapshot({"aiohttp": "3.9.0", "asyncpg": "0.32.0"}, load_snapshot())
    assert {f.package for f in findings} == {"aiohttp"}
    assert any(f.advisory == "PYSEC-2024-24" for f in findings)  # the static-files traversal
    # The whole audit, offline, on a lock holding that pin: it fails, naming it.
    lock = tmp_path / "old.lock"
    lock.write_text("aiohttp==3.14.2 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    fake = type(LOCKS[0])("old", (), False, "a test")
    monkeypatch.setattr(supply_audit, "LOCKS", (fake,))
    monkeypatch.setattr(type(fake), "path", property(lambda _self: lock))
    out = io.StringIO()
    assert supply_audit.audit(online=False, out=out) == 1
    assert "VULNERABLE aiohttp==3.14.2: GHSA-cq5v-8q36-5273" in out.getvalue()


def test_every_install_path_installs_a_lock_with_hashes() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in (".installed", ".fleet-installed"):
        recipe = makefile.split(f"$(VENV)/{target}:", 1)[1].split("\n\n", 1)[0]
        installs = [line for line in recipe.splitlines() if "pip install" in line]
        assert installs, target
        for line in installs:
            # A lock is installed as it is (hashes checked, nothing resolved); pgfleet
            # itself without dependencies.
            assert "--no-deps" in line, line
            assert "--require-hashes --no-deps -r requirements/" in line or "-e ." in line, line
        assert "pip check" in recipe, "the lock must be proven complete"
        assert "--no-build-isolation" in recipe, "setuptools comes from the lock too"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "tools.supply audit" in ci or "make audit" in ci
    # The release check installs the locked dependencies, then the wheel from no index.
    release = (ROOT / "tools" / "release_check.py").read_text()
    assert '"--require-hashes", "--no-deps", "-r"' in release and '"--no-index"' in release
    assert '"build", "--no-isolation"' in release
