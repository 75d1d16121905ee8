"""The SQL layer's loader and the rule that nothing else writes SQL."""

from __future__ import annotations

import pathlib
import re

import pytest

from pgfleet.db import Q
from pgfleet.db.queries import Queries, parse

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "pgfleet"


def test_parse_splits_named_blocks_with_shapes() -> None:
    loaded = parse("-- name: a_one :one\nSELECT 1;\n\n-- name: b_many :many\nSELECT 2\n")
    assert {k: (q.shape, q.sql) for k, q in loaded.items()} == {
        "a_one": (":one", "SELECT 1"),
        "b_many": (":many", "SELECT 2"),
    }


def test_parse_keeps_the_leading_comment_and_drops_the_bodys() -> None:
    text = (
        "-- name: a :one\n-- What a is.\n-- Second line.\nSELECT 1\n"
        "    -- why the filter\n  FROM t -- kept: not a whole line\n-- gone too\nWHERE true;\n"
    )
    assert parse(text)["a"].sql == (
        "-- What a is.\n-- Second line.\nSELECT 1\n  FROM t -- kept: not a whole line\nWHERE true"
    )


def test_parse_refuses_duplicates_and_empty_blocks() -> None:
    with pytest.raises(ValueError, match="defined twice"):
        parse("-- name: a :one\nSELECT 1;\n-- name: a :one\nSELECT 2;")
    with pytest.raises(ValueError, match="is empty"):
        parse("-- name: a :one\n\n")


def test_parse_splices_fragments_into_the_queries_that_include_them() -> None:
    loaded = parse(
        "-- fragment: common\n-- a comment\nWITH a AS (SELECT 1)\n\n"
        "-- name: x :many\n-- include: common\nSELECT * FROM a;\n"
        "-- name: y :val\n  -- include: common\nSELECT count(*) FROM a;\n"
    )
    assert set(loaded) == {"x", "y"}
    assert loaded["x"].sql == "-- a comment\nWITH a AS (SELECT 1)\nSELECT * FROM a"
    assert loaded["y"].sql == "-- a comment\nWITH a AS (SELECT 1)\nSELECT count(*) FROM a"


def test_parse_refuses_unknown_late_twice_defined_and_unused_fragments() -> None:
    with pytest.raises(ValueError, match="not a fragment defined above it"):
        parse("-- name: x :one\n-- include: later\nSELECT 1;\n-- fragment: later\nSELECT 2\n")
    with pytest.raises(ValueError, match="defined twice"):
        parse("-- fragment: f\nA\n-- fragment: f\nB\n-- name: x :one\n-- include: f\n")
    with pytest.raises(ValueError, match="never included"):
        parse("-- fragment: f\nA\n-- name: x :one\nSELECT 1\n")


def test_both_claim_statements_share_the_completion_text() -> None:
    """The completion half is written once in the file, and both statements carry it."""
    text = (PACKAGE / "db" / "queries.sql").read_text()
    for marker in (
        "), done AS (",
        "USING unnest($1::uuid[], $2::uuid[], $3::text[], string_to_array($13",
        "), tell AS (",
        "FROM finished d CROSS JOIN",
    ):
        assert text.count(marker) == 1, marker
        assert marker in Q.job_complete_and_claim.sql
        assert marker in Q.job_complete_and_claim_lean.sql
    assert "-- include:" not in Q.job_complete_and_claim.sql + Q.job_complete_and_claim_lean.sql


def test_declarations_must_match_the_file() -> None:
    with pytest.raises(ImportError, match="missing"):
        Queries({})


def test_every_query_is_loaded_and_used() -> None:
    source = "\n".join(
        p.read_text() for p in PACKAGE.rglob("*.py") if "db/queries.py" not in str(p)
    )
    for name in Queries.__annotations__:
        assert getattr(Q, name).sql
        assert f"Q.{name}" in source, f"query {name} is never used"


def test_no_sql_outside_the_db_layer() -> None:
    sql = re.compile(r"\b(SELECT|INSERT INTO|UPDATE\s+\w+\.\w+\s+SET|DELETE FROM)\b")
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "/db/" in str(path):
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if sql.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(PACKAGE)}:{lineno}: {line.strip()}")
    assert offenders == []


def test_the_claim_statements_fit_asyncpgs_statement_cache() -> None:
    """asyncpg prepares and caches a statement only up to max_cacheable_statement_size
    (15 KiB by default, counted on its text: the leading comment counts, the body's
    comments are dropped at load): a longer claim
    statement is sent unnamed and planned again every round (about 2 ms each)."""
    cap = 15 * 1024
    for query in (Q.job_complete_and_claim, Q.job_complete_and_claim_lean):
        assert len(query.sql.encode()) <= cap, (query.name, len(query.sql.encode()))


@pytest.mark.parametrize("file", ["queries.sql", "console.sql", "access.sql"])
def test_no_dropped_comment_line_sits_inside_a_literal(file: str) -> None:
    """The loader drops whole-line ``--`` comments from a statement's body: that is
    only safe while no string literal or dollar-quoted body spans such a line."""
    from pgfleet.db.queries import expand

    text = expand((PACKAGE / "db" / file).read_text())
    assert "$$" not in text and not re.search(r"\$[A-Za-z_]*\$", text), file
    quotes = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("--"):
            assert quotes % 2 == 0, f"{file}: comment line {lineno} inside a string literal"
            continue
        quotes += line.split("--", 1)[0].count("'") if quotes % 2 == 0 else line.count("'")
