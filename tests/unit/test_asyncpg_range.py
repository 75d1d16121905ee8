"""The asyncpg range pgfleet supports is bounded on both sides, and
`make test-asyncpg-range` (in CI) tests both of its ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import asyncpg_range


def test_asyncpg_is_required_within_a_range_with_an_upper_bound() -> None:
    low, high = asyncpg_range.bounds()
    assert tuple(map(int, low.split("."))) < tuple(map(int, high.split(".")))


def test_a_requirement_without_an_upper_bound_is_refused(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["asyncpg>=0.30"]\n')
    with pytest.raises(SystemExit, match="asyncpg>=LOW,<HIGH"):
        asyncpg_range.bounds(pyproject)


def test_ci_runs_the_range_target() -> None:
    root = Path(asyncpg_range.__file__).resolve().parent.parent
    assert "make test-asyncpg-range" in (root / ".ci/run").read_text()
    assert "test-asyncpg-range:" in (root / "Makefile").read_text()
