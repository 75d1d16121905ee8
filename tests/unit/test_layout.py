"""docs/layout.md is true to the code: it lists every module of pgfleet/, and every
module it names in the library's tables exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYOUT = ROOT / "docs/layout.md"
LIBRARY = ROOT / "pgfleet"


def _modules() -> list[str]:
    """pgfleet's modules, relative to pgfleet/ (packages are listed as folders,
    migrations as their folder)."""
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        relative = path.relative_to(LIBRARY)
        if "migrations" in relative.parts or "__pycache__" in relative.parts:
            continue
        if relative.name == "__init__.py" and len(relative.parts) > 1:
            continue
        found.append(relative.as_posix())
    return found


def _library_section() -> str:
    text = LAYOUT.read_text()
    return text[text.index("## The library") : text.index("## Around the library")]


def _named() -> set[str]:
    """The file names the library's tables put in backticks (``../cli.py`` is
    ``cli.py`` seen from service/)."""
    tokens = re.findall(r"`([^`\s]+\.py)`", _library_section())
    return {token.removeprefix("../") for token in tokens if not token.startswith("tests/")}


def _suffixes(module: str) -> set[str]:
    parts = module.split("/")
    return {"/".join(parts[i:]) for i in range(len(parts))}


def test_every_module_of_the_library_is_listed_in_the_layout() -> None:
    named = _named()
    missing = [m for m in _modules() if not _suffixes(m) & named]
    assert missing == [], f"docs/layout.md does not list {missing}"


def test_every_module_the_layout_names_exists() -> None:
    suffixes = set().union(*(_suffixes(m) for m in _modules()))
    assert sorted(_named() - suffixes) == []


def test_unit_tests_sit_in_folders_that_mirror_the_library() -> None:
    unit = ROOT / "tests/unit"
    folders = [
        p.relative_to(unit) for p in unit.rglob("*") if p.is_dir() and p.name != "__pycache__"
    ]
    assert [f.as_posix() for f in folders if not (LIBRARY / f).is_dir()] == []
