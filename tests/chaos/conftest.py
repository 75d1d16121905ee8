"""Fixtures of the chaos suite: one private PostgreSQL cluster per session (never the
shared server: the suite restarts it), a migrated template database on it, and the
session's results table (printed at the end and written to ``chaos-results/``)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from tests.chaos import app, cluster, harness
from tools.devkit import postgres as kit

TEMPLATE = "chaos_tpl"
_names = itertools.count(1)
_results: harness.Results | None = None


async def _make_template(c: cluster.PrivateCluster) -> None:
    conn = await asyncpg.connect(await kit.fresh_database(c.admin_dsn, TEMPLATE))
    try:
        await conn.execute(app.SCHEMA)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def chaos_profile() -> harness.Profile:
    return harness.profile()


@pytest.fixture(scope="session")
def chaos_cluster() -> Iterator[cluster.PrivateCluster]:
    reason = cluster.why_unavailable()
    if reason is not None:
        pytest.skip(f"chaos suite needs a private PostgreSQL it can restart: {reason}")
    c = cluster.PrivateCluster()
    try:
        c.init()
        c.start()
        asyncio.run(_make_template(c))
        yield c
    finally:
        c.destroy()


@pytest.fixture(scope="session")
def chaos_results(chaos_profile: harness.Profile) -> harness.Results:
    global _results
    if _results is None:
        _results = harness.Results(chaos_profile)
    return _results


async def new_database(c: cluster.PrivateCluster, empty: bool = False) -> str:
    name = f"chaos_{next(_names)}"
    await kit.drop_database(c.admin_dsn, name)
    await kit.create_database(c.admin_dsn, name, template="template0" if empty else TEMPLATE)
    return name


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _results is not None and _results.rows:
        terminalreporter.section(f"chaos results ({_results.profile.name} profile)")
        terminalreporter.write(harness.markdown(_results.rows, _results.profile))
        terminalreporter.write(f"\nwritten to {_results.dir}/chaos-{_results.profile.name}.md\n")
