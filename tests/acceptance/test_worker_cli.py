"""`pgfleet worker` and `pgfleet migrate` refuse bad input with a clear message and a
non-zero exit, before touching anything: status 2 for bad input and 1 when the
database cannot be used, as `pgfleet jobs` (and argparse) answer."""

from __future__ import annotations

import socket
from pathlib import Path

import asyncpg
import pytest

import pgfleet
from pgfleet.service.process import EXIT_DATABASE, EXIT_USAGE
from tests.procs import eventually, free_port, start

pytestmark = pytest.mark.slow


async def run(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> tuple[int, str]:
    proc = await start(args, tmp_path, "cli", env=env)
    code = await proc.process.wait()
    return code, proc.output()


APP = "tests.apps.runtime_app:registry"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["worker", "--dsn", "mysql://x/y", "--app", APP], "invalid database URL 'mysql://x/y'"),
        (
            ["worker", "--dsn", "mysql://u:s3cret@host/db", "--app", APP],
            "invalid database URL 'host/db'",
        ),
        (["worker", "--dsn", "postgresql://h:port/db", "--app", APP], "invalid database URL"),
        (["worker", "--app", APP], "no database: pass --dsn or set PGFLEET_DATABASE_URL"),
        (["worker", "--dsn", "postgresql://h/db"], "no application"),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", "no.such.module:r"],
            "cannot import 'no.such.module'",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", "tests.apps.runtime_app:nope"],
            "has no attribute 'nope'",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", "tests.apps.runtime_app"],
            "must look like module.path:attribute",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", "tests.apps.runtime_app:SCHEMA"],
            "is a str, not a pgfleet.Registry",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", APP, "--concurrency", "0"],
            "concurrency must be an integer from 1 to 10000",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", APP, "--job-names", "ghost"],
            "job_names ['ghost'] have no handler",
        ),
        (  # the deprecated spelling still works
            ["worker", "--dsn", "postgresql://h/db", "--app", APP, "--kinds", "ghost"],
            "job_names ['ghost'] have no handler",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", APP, "--processes", "0"],
            "--processes out of range",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", APP, "--metrics-port", "70000"],
            "--metrics-port out of range",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", APP, "--poll-interval", "-1"],
            "poll_interval must be positive",
        ),
        (
            ["worker", "--dsn", "postgresql://h/db", "--app", APP, "--prune-interval", "0"],
            "prune_interval must be positive",
        ),
        (["migrate"], "no database given"),
        (["migrate", "--dsn", "mysql://x/y"], "invalid database URL 'mysql://x/y'"),
        (["api", "--dsn", "mysql://x/y"], "invalid database URL 'mysql://x/y'"),
        (["api", "--dsn", "postgresql://h/db", "--strict"], "--strict needs --app"),
        (["api", "--dsn", "postgresql://h/db", "--port", "http"], "--port must be an integer"),
    ],
)
async def test_bad_input_is_refused_clearly(args: list[str], message: str, tmp_path: Path) -> None:
    code, output = await run(args, tmp_path, env={"PGFLEET_DATABASE_URL": ""})
    assert code == EXIT_USAGE, output[-2000:]
    assert message in output, output[-2000:]
    assert "Traceback" not in output
    assert "s3cret" not in output


def _error_lines(output: str) -> list[str]:
    """What a command printed besides its log records (timestamped lines)."""
    return [line for line in output.splitlines() if line and not line[:4].isdigit()]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "postgres@127.0.0.1:5432/pgfleet_no_such_database",
            'database "pgfleet_no_such_database" does not exist',
        ),
        (
            "pgfleet_no_such_role@127.0.0.1:5432/postgres",
            'role "pgfleet_no_such_role" does not exist',
        ),
    ],
)
async def test_a_missing_database_or_role_is_one_line_for_every_command(
    target: str, message: str, tmp_path: Path
) -> None:
    dsn = f"postgresql://{target}"
    for args in (
        ["worker", "--dsn", dsn, "--app", APP, "--metrics-port", "0"],
        ["migrate", "--dsn", dsn],
        ["jobs", "counts", "--dsn", dsn],
    ):
        code, output = await run(args, tmp_path)
        assert code == EXIT_DATABASE, output[-2000:]
        assert "Traceback" not in output
        (line,) = _error_lines(output)
        assert line.startswith(f"pgfleet {args[0]}"), line
        assert "cannot connect to the database" in line and message in line, line
    code, output = await run(
        ["worker", "--dsn", dsn, "--app", APP, "--metrics-port", "0"], tmp_path
    )
    assert "at 127.0.0.1:5432" in output, "the worker names the server it was refused by"


async def test_a_database_that_does_not_answer_is_named_by_host_and_port(tmp_path: Path) -> None:
    port = free_port()
    proc = await start(
        [
            "worker",
            "--dsn",
            f"postgresql://postgres@127.0.0.1:{port}/x",
            "--app",
            APP,
            "--metrics-port",
            "0",
        ],
        tmp_path,
        "worker",
    )

    async def reported() -> bool:
        return "database unavailable at worker start" in proc.output()

    try:
        await eventually(reported, 60, "the worker to report the database unavailable")
    finally:
        assert await proc.stop() == 0, "still retrying, and it drains on SIGTERM"
    assert f"database unavailable at worker start (127.0.0.1:{port}: " in proc.output()


async def test_env_configures_the_worker_and_flags_override(tmp_path: Path) -> None:
    code, output = await run(
        ["worker", "--concurrency", "0"],
        tmp_path,
        env={
            "PGFLEET_DATABASE_URL": "postgresql://h/db",
            "PGFLEET_APP": APP,
            "PGFLEET_CONCURRENCY": "4",
        },
    )
    assert code == EXIT_USAGE and "concurrency must be an integer from 1 to 10000" in output


async def test_a_metrics_port_in_use_is_a_clear_error(database: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, output = await run(
            ["worker", "--dsn", database, "--app", APP, "--metrics-port", str(port)], tmp_path
        )
    assert code == EXIT_DATABASE, "a port in use is no bad input: the process could not run"
    assert f"cannot listen on 127.0.0.1:{port} for metrics and health" in output
    assert "Traceback" not in output


async def test_an_unmigrated_database_is_refused(
    pool: asyncpg.Pool, database: str, tmp_path: Path
) -> None:
    await pool.execute("DROP SCHEMA pgfleet CASCADE")
    code, output = await run(
        ["worker", "--dsn", database, "--app", APP, "--metrics-port", "0"], tmp_path
    )
    assert code == EXIT_DATABASE and "run pgfleet.migrate(pool) or `pgfleet migrate`" in output
    code, output = await run(["migrate", "--dsn", database], tmp_path)
    shipped = [m.version for m in pgfleet.migrations()]
    assert code == 0 and f"applied migrations {shipped}" in output
    code, output = await run(["migrate", "--dsn", database], tmp_path)
    assert code == 0 and "up to date" in output


async def test_migrate_print_sql(tmp_path: Path) -> None:
    code, output = await run(["migrate", "--print-sql"], tmp_path)
    assert code == 0
    assert "CREATE TABLE pgfleet.jobs" in output and output.rstrip().endswith("COMMIT;")
