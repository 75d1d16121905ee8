"""Every example of the documentation runs, as a user would run it, against real
Postgres: the files under docs/snippets/ (the pages include them, so what runs here
is what the pages show), the README's example, and the getting-started page's
steps in the order the page gives them."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

import pgfleet
from tests import pgharness
from tests.procs import free_port
from tools.devkit import create_database, drop_database, until

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"
DOCS = ROOT / "docs"


def run(args: list[str], cwd: Path, dsn: str, **env: str) -> str:
    """Run a command as a user would from ``cwd``; its output, or fail showing it."""
    done = subprocess.run(
        args,
        cwd=cwd,
        env={**os.environ, "PGFLEET_DATABASE_URL": dsn, "PYTHONPATH": str(cwd), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{output}"
    return output


def python(script: str, cwd: Path, dsn: str) -> str:
    return run([sys.executable, script], cwd, dsn)


def import_file(path: Path) -> Any:
    """Import a snippet as its own module, with its folder importable (as when run)."""
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"snippet_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def pgfleet_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pgfleet", *args]


@pytest.fixture
async def empty_database(pg_server: pgharness.Server) -> AsyncIterator[str]:
    """A database without the pgfleet schema, as a new user has."""
    name = pg_server.next_name()
    dsn = await create_database(pg_server.admin_dsn, name)
    try:
        yield dsn
    finally:
        await drop_database(pg_server.admin_dsn, name)


async def statuses(dsn: str) -> dict[str, list[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT name, status::text FROM pgfleet.jobs ORDER BY id")
    finally:
        await conn.close()
    out: dict[str, list[str]] = {}
    for row in rows:
        out.setdefault(row["name"], []).append(row["status"])
    return out


# ---------------------------------------------------------------- getting started


async def test_getting_started_takes_a_new_user_to_a_job_run_by_a_worker(
    empty_database: str, tmp_path: Path
) -> None:
    """The page's steps, in order: migrate, enqueue.py, pgfleet worker, pgfleet jobs."""
    page = (DOCS / "getting-started.md").read_text()
    for command in (
        "pgfleet migrate",
        "python enqueue.py",
        "pgfleet worker --app tasks:registry",
        "pgfleet jobs list",
    ):
        assert command in page, f"the page no longer says `{command}`"
    work = tmp_path / "myproject"
    work.mkdir()
    for name in ("tasks.py", "enqueue.py"):
        (work / name).write_text((SNIPPETS / "getting_started" / name).read_text())

    assert "applied migrations" in run(pgfleet_cli("migrate"), work, empty_database)
    enqueued = python("enqueue.py", work, empty_database)
    assert re.search(r"enqueued job [0-9a-f-]{36}", enqueued), enqueued

    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = await asyncio.create_subprocess_exec(
            *pgfleet_cli("worker", "--app", "tasks:registry", "--metrics-port", "0"),
            cwd=work,
            env={**os.environ, "PGFLEET_DATABASE_URL": empty_database, "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        async def succeeded() -> bool:
            return (await statuses(empty_database)).get("send_email") == ["succeeded"]

        await until(succeeded, 60, "the worker to run the job")
    finally:
        worker.send_signal(signal.SIGINT)  # Ctrl-C, as the page says
        code = await asyncio.wait_for(worker.wait(), 60)
    output = log.read_text()
    assert code == 0, output
    assert "sending 'Welcome' to ada@example.com (attempt 1)" in output
    listing = run(pgfleet_cli("jobs", "list"), work, empty_database)
    assert "send_email" in listing and "succeeded" in listing


# ---------------------------------------------------------------- the README


def test_the_readme_example_is_the_tested_quickstart() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert blocks, "the README shows a Python example"
    assert blocks[0] == (SNIPPETS / "quickstart.py").read_text()


async def test_quickstart_runs_on_an_empty_database(empty_database: str) -> None:
    output = python("quickstart.py", SNIPPETS, empty_database)
    assert "sending 'Hi' to ada@example.com" in output and "succeeded: 1" in output


# ---------------------------------------------------------------- how-to guides


async def test_enqueue_options(database: str) -> None:
    assert "100 resize jobs" in python("enqueue_options.py", SNIPPETS, database)
    found = await statuses(database)
    assert len(found["rebuild_index"]) == 1, "the job key kept one job"
    assert len(found["send_receipt"]) == 1, "the transaction committed it"


async def test_workflows(database: str) -> None:
    output = python("workflows.py", SNIPPETS, database)
    assert "imported 9 of 10, 1 failed" in output, output
    assert "batch: 9 succeeded, 1 failed" in output and "merge_pdf waited on 3 jobs" in output
    # merge_pdf ran after its three pages; nothing is left waiting.
    assert output.index("PDF merged") > output.index("page 2 rendered")
    found = await statuses(database)
    assert found["merge_pdf"] == ["succeeded", "succeeded"]
    assert "waiting" not in {s for statuses_ in found.values() for s in statuses_}


def test_the_handler_tests_pass(database: str) -> None:
    output = run(
        [sys.executable, "-m", "pytest", "-q", "test_handlers.py"],
        SNIPPETS,
        database,
    )
    assert "4 passed" in output, output


def test_job_control(database: str) -> None:
    output = python("job_control.py", SNIPPETS, database)
    assert "report: succeeded, 1200 rows for customer 7" in output
    assert "call: succeeded on attempt 3 after 1 snooze" in output
    assert "attempt 1: TimeoutError: the provider did not answer (attempt 1)" in output
    assert "export: cancelled, cleaning up" in output and "export: cancelled by ops" in output


async def test_crons_validate_and_run(pool: asyncpg.Pool) -> None:
    module = import_file(SNIPPETS / "crons.py")
    stop = asyncio.Event()
    worker = pgfleet.Worker(pool, module.registry, crons=module.crons)
    running = asyncio.create_task(worker.run(shutdown=stop.wait()))
    try:
        # The monthly schedule catches up when first recorded: its latest occurrence runs.
        async def caught_up() -> bool:
            status = await pool.fetchval(
                "SELECT status::text FROM pgfleet.jobs WHERE name = 'rebuild_reference_data'"
            )
            return bool(status == "succeeded")

        await until(caught_up, 60, "the catch-up occurrence to run")
    finally:
        stop.set()
        await running
    assert await pool.fetchval("SELECT count(*) FROM pgfleet.crons") == 3


async def test_typed_payloads(database: str) -> None:
    output = python("typed_payloads.py", SNIPPETS, database)
    assert "invoice for Ada: 12.50" in output
    assert "refused:" in output and "succeeded: 2" in output


async def test_sqlalchemy_async_enqueues_in_the_session_transaction(database: str) -> None:
    output = python("sqlalchemy_async.py", SNIPPETS, database)
    assert "committed: send_welcome is queued" in output
    assert "rolled back: None" in output
    assert await statuses(database) == {"send_welcome": ["queued"]}, "only the committed job"


async def test_tracing_gives_a_span_per_job(database: str) -> None:
    output = python("tracing.py", SNIPPETS, database)
    assert '"name": "pgfleet.job send_email"' in output
    assert '"name": "render template"' in output


async def test_the_http_examples_against_a_real_api(database: str, tmp_path: Path) -> None:
    work = tmp_path / "myproject"
    work.mkdir()
    (work / "tasks.py").write_text((SNIPPETS / "getting_started" / "tasks.py").read_text())
    port = free_port()
    api = await asyncio.create_subprocess_exec(
        *pgfleet_cli("api", "--app", "tasks:registry", "--port", str(port), "--metrics-port", "0"),
        cwd=work,
        env={**os.environ, "PGFLEET_DATABASE_URL": database},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def answers() -> bool:
                try:
                    async with session.get(f"{url}/readyz") as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            await until(answers, 60, "pgfleet api to answer")
        output = run(["bash", str(SNIPPETS / "http" / "enqueue.sh")], work, database, API=url)
    finally:
        api.send_signal(signal.SIGTERM)
        await asyncio.wait_for(api.wait(), 60)
    assert "HTTP/1.1 202 Accepted" in output
    assert '"status": "queued"' in output
    assert len((await statuses(database))["send_email"]) == 3, "one plus a batch of two"


async def test_a_worker_embedded_in_a_web_app_serves_its_metrics(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGFLEET_DATABASE_URL", database)
    app_module = import_file(SNIPPETS / "embedding" / "app.py")
    async with TestClient(TestServer(app_module.make_app())) as client:
        async with client.post("/signup", json={"email": "ada@example.com"}) as resp:
            assert resp.status == 202

        async def finished() -> str | None:
            async with client.get("/metrics") as resp:
                text = await resp.text()
            done = 'pgfleet_jobs_finished_total{kind="send_welcome",outcome="succeeded"} 1.0'
            return text if done in text else None

        text = await until(finished, 60, "the embedded worker to run the job")
    assert 'pgfleet_jobs_queued{kind="send_welcome"} 0.0' in text, "the queue gauges too"
    assert "pgfleet_worker_concurrency 4.0" in text
    assert (await statuses(database))["send_welcome"] == ["succeeded"]


# ---------------------------------------------------------------- the rule


async def test_a_new_endpoint_gets_the_access_it_declares() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from pgfleet.service.access import AccessConfig
    from pgfleet.service.api import ApiConfig
    from pgfleet.service.credentials import load, new_token

    snippet = import_file(SNIPPETS / "declare_access.py")
    producer, viewer = new_token(), new_token()
    access = AccessConfig(load(entries=f"p:producer:{producer},v:viewer:{viewer}"))
    api = snippet.MyJobsApi(cast(Any, None), ApiConfig(access=access))
    async with TestClient(TestServer(api.application())) as client:
        for token, status in ((None, 401), (producer, 403), (viewer, 200)):
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            async with client.get("/quotas", headers=headers) as resp:
                assert resp.status == status, token


def test_every_python_example_in_the_docs_is_a_tested_snippet() -> None:
    """A ```python block written inline in a page is not run by anything: pages
    include their examples from docs/snippets/ (run here) or examples/ (run by
    tests/acceptance/test_examples.py and the Django tests) instead."""
    inline = []
    for page in DOCS.rglob("*.md"):
        for block in re.findall(r"```python[^\n]*\n(.*?)```", page.read_text(), re.S):
            if not block.strip().startswith("--8<--"):
                inline.append(f"{page.relative_to(ROOT)}: {block.strip().splitlines()[0]}")
    assert not inline, "inline Python examples (move them to docs/snippets/):\n" + "\n".join(inline)


def test_every_example_a_page_includes_is_a_tested_example_app() -> None:
    """Pages may include files of examples/: only of an app a test runs."""
    tested = {
        "django": ROOT / "tests" / "acceptance" / "test_django_project.py",
        "fastapi-asyncpg": ROOT / "tests" / "acceptance" / "test_examples.py",
        "flask-psycopg": ROOT / "tests" / "acceptance" / "test_examples.py",
    }
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    included = re.findall(r"^(?:--8<-- \")?examples/([^/\"]+)/([^:\"\n]+)", pages, re.M)
    assert included, "the pages show the example apps"
    for app, path in included:
        assert app in tested, f"a page includes examples/{app}/{path}, which no test runs"
        assert (ROOT / "examples" / app / path).is_file(), f"examples/{app}/{path} is gone"
        assert f'"{app}"' in tested[app].read_text(), f"{tested[app].name} no longer runs {app}"


def test_every_snippet_is_shown_by_a_page_and_tested_here() -> None:
    pages = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    tests = Path(__file__).read_text()
    for snippet in SNIPPETS.rglob("*"):
        if snippet.is_file() and snippet.suffix in (".py", ".sh"):
            relative = snippet.relative_to(DOCS).as_posix()
            assert f'--8<-- "{relative}"' in pages, f"no page includes {relative}"
            assert snippet.name in tests, f"no test here runs {relative}"
