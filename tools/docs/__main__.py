"""``python -m tools.docs [--check]``: write the generated reference pages under
docs/reference/ (``--check``: write nothing, exit 1 naming the pages that differ)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.docs.reference import PAGES

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say which pages are stale")
    args = parser.parse_args()
    stale = []
    for name, render in PAGES.items():
        path = REFERENCE / name
        text = render()
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote docs/reference/{name}")
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run `make docs-generate`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
