"""Refresh ``requirements/advisories.json``: the advisories of every package pinned
in a lock, the audit's fallback when no advisory service answers.

Sources, in order of preference:

- ``--osv``: the OSV API (online; every advisory of each package, GHSA included);
- ``--pypa-db DIR``: a checkout of https://github.com/pypa/advisory-database
  (offline; PYSEC advisories);

and always ``requirements/advisories-curated.json``: advisories published after the
last snapshot, added by hand with their references (drop them once a refresh from
a source above carries them).
"""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from tools.supply.audit import SNAPSHOT
from tools.supply.locks import LOCKS, REQUIREMENTS, normalise, pins

CURATED = REQUIREMENTS / "advisories-curated.json"
OSV_QUERY = "https://api.osv.dev/v1/query"


def pinned_packages() -> list[str]:
    names: set[str] = set()
    for lock in LOCKS:
        names.update(pins(lock.path))
    return sorted(names)


def _record(osv: dict[str, Any], package: str) -> dict[str, Any] | None:
    if osv.get("withdrawn"):
        return None  # disputed and taken back: not an advisory any more
    for affected in osv.get("affected", []):
        if normalise(affected.get("package", {}).get("name", "")) != package:
            continue
        ranges = [
            r.get("events", []) for r in affected.get("ranges", []) if r.get("type") == "ECOSYSTEM"
        ]
        return {
            "id": osv["id"],
            "aliases": osv.get("aliases", []),
            "package": package,
            "ranges": ranges,
            "versions": affected.get("versions", []),
            "summary": (osv.get("summary") or osv.get("details") or "")[:200],
        }
    return None


def from_pypa_db(root: Path, packages: list[str]) -> list[dict[str, Any]]:
    found = []
    for package in packages:
        folder = root / "vulns" / package
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            record = _record(yaml.safe_load(path.read_text()), package)
            if record is not None:
                found.append(record)
    return found


def from_osv(packages: list[str]) -> list[dict[str, Any]]:
    found = []
    for package in packages:
        body = json.dumps({"package": {"name": package, "ecosystem": "PyPI"}}).encode()
        request = urllib.request.Request(
            OSV_QUERY, data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            for vuln in json.load(response).get("vulns", []):
                record = _record(vuln, package)
                if record is not None:
                    found.append(record)
    return found


def refresh(*, pypa_db: Path | None, osv: bool, as_of: str | None = None) -> dict[str, Any]:
    """Write the snapshot. ``as_of``: the date of the source's data (default today:
    right for --osv; give the checkout's commit date for --pypa-db)."""
    packages = pinned_packages()
    if osv:
        records, source = from_osv(packages), "OSV API"
    elif pypa_db is not None:
        commit = (pypa_db / ".commit").read_text().strip() if (pypa_db / ".commit").exists() else ""
        records = from_pypa_db(pypa_db, packages)
        source = f"PyPA advisory database {commit}".strip()
    else:
        raise SystemExit("advisories: give --osv or --pypa-db DIR")
    curated = json.loads(CURATED.read_text())
    known = {r["id"] for r in records} | {a for r in records for a in r["aliases"]}
    extra = [r for r in curated["advisories"] if r["id"] not in known]
    snapshot = {
        "source": f"{source}, and {len(extra)} curated (requirements/{CURATED.name})",
        "updated": as_of or datetime.now(UTC).date().isoformat(),
        "checked_packages": packages,
        "advisories": sorted(records + extra, key=lambda r: (r["package"], r["id"])),
    }
    SNAPSHOT.write_text(json.dumps(snapshot, indent=1) + "\n")
    return snapshot
