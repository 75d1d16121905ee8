"""The command-line flags the ``pgfleet`` commands share, and ``WorkerConfig``'s flags
generated from its table (``pgfleet.config.WORKER_OPTIONS``).

Every flag can also come from a ``PGFLEET_*`` environment variable; the flag wins.
Standard library only at import: the parser is built for every ``pgfleet`` command.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from pgfleet.config import OPTIONS_BY_FIELD, WORKER_OPTIONS, ConfigOption, WorkerConfig
from pgfleet.service.process import DATABASE_URL, database_url, env_default, env_flag

_ARGTYPES: dict[str, Any] = {
    "int": int,
    "seconds": float,
    "seconds-or-off": float,
    "days-or-off": float,
}


def add_dsn(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dsn",
        default=database_url(),
        help=f"PostgreSQL connection string [{DATABASE_URL}]",
    )


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default=env_default("LOG_LEVEL", "info"),
        choices=["debug", "info", "warning", "error"],
        help="log level [PGFLEET_LOG_LEVEL] (default info)",
    )


def add_pgbouncer(parser: argparse.ArgumentParser) -> None:
    """--pgbouncer for the commands that only use a pool (api, jobs): the worker's
    own flag (from ``WORKER_OPTIONS``) also speaks of LISTEN, which they do not do."""
    option = OPTIONS_BY_FIELD["pgbouncer"]
    parser.add_argument(
        option.flag,
        action="store_true",
        default=env_flag(option.env),
        help="--dsn goes through a pooler in transaction mode (PgBouncer): no named "
        f"prepared statements, no session state [{option.variable}]",
    )


def add_common(parser: argparse.ArgumentParser) -> None:
    """--dsn, --pgbouncer and --log-level."""
    add_dsn(parser)
    add_pgbouncer(parser)
    add_log_level(parser)


# ---------------------------------------------------------------- WorkerConfig's flags


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_option(parser: argparse.ArgumentParser, option: ConfigOption) -> None:
    """The flag of one WorkerConfig field: its variable is its default, and the
    field's default is the variable's."""
    text = f"{option.help} [{option.variable}]"
    default = option.default
    if option.kind == "switch":
        parser.add_argument(
            option.flag, action="store_true", default=env_flag(option.env), help=text
        )
        return
    if default is not None:
        text += f" (default {_shown(default)})"
    extra: dict[str, Any] = {}
    if option.kind in _ARGTYPES:
        extra["type"] = _ARGTYPES[option.kind]
    if option.choices:
        extra["choices"] = option.choices
    flags = [option.flag]
    if option.deprecated is not None:
        old_flag, old_env = option.deprecated
        flags.append(old_flag)
        default = env_default(old_env, default)
        text += f"; {old_flag} and PGFLEET_{old_env} are its deprecated spellings"
    parser.add_argument(
        *flags, dest=option.dest, default=env_default(option.env, default), help=text, **extra
    )


def add_config_options(
    parser: argparse.ArgumentParser, options: Iterable[ConfigOption] = WORKER_OPTIONS
) -> None:
    for option in options:
        add_option(parser, option)


def worker_config(args: argparse.Namespace, **fields: Any) -> WorkerConfig:
    """The WorkerConfig the table's flags in ``args`` describe (``fields``: others)."""
    given = {o.field: o.value(getattr(args, o.dest)) for o in WORKER_OPTIONS}
    return WorkerConfig(**given, **fields)


def option_argv(args: argparse.Namespace) -> list[str]:
    """The table's flags in ``args`` as command-line arguments, for a child process;
    the secret ones are left out (see ``option_environment``)."""
    argv: list[str] = []
    for option in WORKER_OPTIONS:
        value = getattr(args, option.dest, None)
        if option.secret or value is None:
            continue
        if option.kind == "switch":
            if value:
                argv.append(option.flag)
        else:
            argv += [option.flag, str(value)]
    return argv


def option_environment(args: argparse.Namespace) -> dict[str, str]:
    """The table's secret flags in ``args``, as the variables they come from."""
    return {
        option.variable: str(value)
        for option in WORKER_OPTIONS
        if option.secret and (value := getattr(args, option.dest, None))
    }
