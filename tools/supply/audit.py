"""Known-vulnerable pins in the lock files.

First pip-audit, against each lock with its hashes (the advisory service of PyPI).
A package pip-audit could not look up (no answer from the service: an offline CI
machine, a registry mirror without the per-release JSON) is checked against the
committed snapshot ``requirements/advisories.json`` instead, and the report says
so and how old the snapshot is. A pin with an advisory fails the audit either way;
so does a pin no source could check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from tools.supply.locks import LOCKS, REQUIREMENTS, normalise, pins

SNAPSHOT = REQUIREMENTS / "advisories.json"
#: Past this age the report warns that the snapshot needs `make advisories`.
STALE_DAYS = 90


@dataclass(frozen=True)
class Finding:
    package: str
    version: str
    advisory: str
    fixed: str
    source: str


def load_snapshot(path: Path = SNAPSHOT) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def affected(version: str, advisory: dict[str, Any]) -> bool:
    """OSV semantics: listed in ``versions``, or inside an introduced..fixed range."""
    if version in advisory.get("versions", ()):
        return True
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    for events in advisory.get("ranges", ()):
        introduced: Version | None = None
        for event in events:
            if "introduced" in event:
                introduced = (
                    Version("0") if event["introduced"] == "0" else Version(event["introduced"])
                )
            elif "fixed" in event and introduced is not None:
                if introduced <= v < Version(event["fixed"]):
                    return True
                introduced = None
            elif "last_affected" in event and introduced is not None:
                if introduced <= v <= Version(event["last_affected"]):
                    return True
                introduced = None
        if introduced is not None and v >= introduced:
            return True
    return False


def fixed_in(advisory: dict[str, Any]) -> str:
    fixes = [e["fixed"] for events in advisory.get("ranges", ()) for e in events if "fixed" in e]
    return ", ".join(fixes) or "none"


def from_snapshot(pinned: dict[str, str], snapshot: dict[str, Any]) -> list[Finding]:
    found = []
    for advisory in snapshot["advisories"]:
        package = normalise(advisory["package"])
        version = pinned.get(package)
        if version is not None and affected(version, advisory):
            found.append(Finding(package, version, advisory["id"], fixed_in(advisory), "snapshot"))
    return found


def pip_audit(lock: Path) -> tuple[list[Finding], set[str]]:
    """(findings, packages pip-audit could not check). Raises when it cannot run."""
    result = subprocess.run(
        [
            sys.executable, "-m", "pip_audit", "--requirement", str(lock),
            "--require-hashes", "--disable-pip", "--format", "json",
            "--progress-spinner", "off",
        ],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    try:
        report = json.loads(result.stdout)
    except ValueError:
        raise RuntimeError(f"pip-audit failed: {result.stderr.strip()[-2000:]}") from None
    findings, unchecked = [], set()
    for dep in report.get("dependencies", []):
        name = normalise(dep["name"])
        if dep.get("skip_reason"):
            unchecked.add(name)
            continue
        for vuln in dep.get("vulns", []):
            fixes = ", ".join(vuln.get("fix_versions", [])) or "none"
            findings.append(Finding(name, dep["version"], vuln["id"], fixes, "pip-audit"))
    return findings, unchecked


def audit(*, online: bool = True, out: Any = sys.stdout) -> int:
    snapshot = load_snapshot()
    covered = {normalise(a["package"]) for a in snapshot["advisories"]} | {
        normalise(p) for p in snapshot.get("checked_packages", ())
    }
    findings: set[Finding] = set()
    failed = False
    for lock in LOCKS:
        pinned = pins(lock.path)
        unchecked = set(pinned)
        if online:
            try:
                found, unchecked = pip_audit(lock.path)
                findings.update(found)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                print(f"{lock.path.name}: pip-audit did not run ({exc})", file=out)
        if unchecked:
            print(
                f"{lock.path.name}: {len(unchecked)} of {len(pinned)} pins had no answer from "
                f"the advisory service: checked against {SNAPSHOT.name} instead",
                file=out,
            )
            findings.update(from_snapshot({p: pinned[p] for p in unchecked}, snapshot))
            missing = sorted(unchecked - covered)
            if missing:
                # Checked by neither: not known-safe, so not passed silently.
                failed = True
                print(
                    f"  not in the snapshot either (run `make advisories`): {', '.join(missing)}",
                    file=out,
                )
    age = (datetime.now(UTC).date() - date.fromisoformat(snapshot["updated"])).days
    print(f"advisory snapshot: {snapshot['source']}, updated {snapshot['updated']}", file=out)
    if age > STALE_DAYS:
        print(f"  it is {age} days old: refresh it with `make advisories`", file=out)
    for f in sorted(findings, key=lambda f: (f.package, f.advisory)):
        print(
            f"VULNERABLE {f.package}=={f.version}: {f.advisory} (fixed in {f.fixed}; "
            f"from {f.source})",
            file=out,
        )
    if findings or failed:
        return 1
    print("no known-vulnerable pins", file=out)
    return 0
