"""``python -m tools.supply lock | audit [--offline] | advisories (--osv | --pypa-db DIR)``."""

from __future__ import annotations

import argparse
from pathlib import Path

from tools.supply import advisories, audit, locks


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.supply")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("lock", help="regenerate requirements/*.lock from pyproject.toml (uv)")
    check = sub.add_parser("audit", help="report known-vulnerable pins in requirements/*.lock")
    check.add_argument(
        "--offline", action="store_true", help="only the snapshot, no advisory service"
    )
    refresh = sub.add_parser("advisories", help="refresh requirements/advisories.json")
    refresh.add_argument("--osv", action="store_true", help="from the OSV API (online)")
    refresh.add_argument("--pypa-db", type=Path, help="from a pypa/advisory-database checkout")
    refresh.add_argument("--as-of", help="the date of the source's data (default today)")
    args = parser.parse_args()
    if args.command == "lock":
        locks.relock()
        return 0
    if args.command == "audit":
        return audit.audit(online=not args.offline)
    snapshot = advisories.refresh(pypa_db=args.pypa_db, osv=args.osv, as_of=args.as_of)
    count, packages = len(snapshot["advisories"]), len(snapshot["checked_packages"])
    print(f"{count} advisories of {packages} packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
