"""The development kit: what the tests, the load tests, the benchmarks and the
native fleet share, outside the installed package.

- :mod:`tools.devkit.postgres`: find a PostgreSQL (environment, local server,
  testcontainers, embedded pgserver); throwaway databases (create, drop, fresh and
  migrated); DSN helpers.
- :mod:`tools.devkit.procs`: child processes that die with their parent
  (PR_SET_PDEATHSIG set in the child, never ``preexec_fn``), stopping them, free ports.
- :mod:`tools.devkit.wait`: wait until another process did something.
"""

from tools.devkit.postgres import (
    DB_NAME,
    LOCAL_DSN,
    NoPostgres,
    Server,
    create_database,
    drop_database,
    embedded,
    find_postgres,
    find_postgres_sync,
    fresh_database,
    quoted,
    redact,
    with_database,
)
from tools.devkit.procs import describe_exit, free_port, free_ports, guarded, stop
from tools.devkit.wait import until, until_sync

__all__ = [
    "DB_NAME",
    "LOCAL_DSN",
    "NoPostgres",
    "Server",
    "create_database",
    "describe_exit",
    "drop_database",
    "embedded",
    "find_postgres",
    "find_postgres_sync",
    "free_port",
    "free_ports",
    "fresh_database",
    "guarded",
    "quoted",
    "redact",
    "stop",
    "until",
    "until_sync",
    "with_database",
]
