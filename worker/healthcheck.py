"""Container health check: GET /healthz on the metrics port of the pgfleet process.

The image's HEALTHCHECK runs ``python /app/worker/healthcheck.py``: a slim image has
no curl or wget. One image runs ``pgfleet worker`` (health on 9464) and ``pgfleet api``
(health on its metrics port, 9465), so the port is, in order:

1. the first argument;
2. ``PGFLEET_HEALTH_PORT``;
3. read from the command the container runs (``/proc/1/cmdline``, past an init such
   as ``docker-init``): ``--metrics-port`` on its command line, else the variable
   that command reads (``PGFLEET_API_METRICS_PORT`` for ``pgfleet api``,
   ``PGFLEET_METRICS_PORT`` otherwise), else that command's default (9465, 9464).
   An api whose metrics port is off (0) is probed on its API port instead;
4. ``PGFLEET_METRICS_PORT``, else 9464.

Exit status 0 when the endpoint answers 2xx within the timeout, 1 otherwise (with the
reason on stderr, which Docker keeps in ``docker inspect``).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

TIMEOUT = 4.0
CMDLINE = Path("/proc/1/cmdline")

#: subcommand -> ((metrics flag, its variable, its default), (fallback flag, variable, default))
_PORTS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "api": (
        ("--metrics-port", "PGFLEET_API_METRICS_PORT", 9465),
        ("--port", "PGFLEET_API_PORT", 8000),
    ),
    "worker": (("--metrics-port", "PGFLEET_METRICS_PORT", 9464),),
}


def read_cmdline(path: Path = CMDLINE) -> list[str]:
    """The argv of the container's main process, [] when it cannot be read."""
    try:
        raw = path.read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def pgfleet_command(cmdline: Sequence[str]) -> tuple[str, list[str]] | None:
    """(subcommand, its arguments) of a ``pgfleet`` command line, past any init."""
    args = list(cmdline)
    for i, arg in enumerate(args):
        name = arg.rsplit("/", 1)[-1]
        if name == "pgfleet" and i + 1 < len(args):
            return args[i + 1], args[i + 2 :]
        module = args[i + 1 : i + 3] == ["-m", "pgfleet"]
        if name.startswith("python") and module and i + 3 < len(args):
            return args[i + 3], args[i + 4 :]
    return None


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag V`` or ``--flag=V`` (the last one wins, as in argparse)."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1 :]
    return value


def port_from(argv: Sequence[str], environ: Mapping[str, str], cmdline: Sequence[str] = ()) -> int:
    for value in (argv[1] if len(argv) > 1 else None, environ.get("PGFLEET_HEALTH_PORT")):
        if value:
            return int(value)
    command = pgfleet_command(cmdline)
    if command is not None and command[0] in _PORTS:
        subcommand, args = command
        for flag, variable, default in _PORTS[subcommand]:
            port = int(flag_value(args, flag) or environ.get(variable) or default)
            if port:
                return port
    return int(environ.get("PGFLEET_METRICS_PORT") or 9464)


def check(port: int, host: str = "127.0.0.1", timeout: float = TIMEOUT) -> str | None:
    """None when /healthz answers 2xx, else why not."""
    url = f"http://{host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            if 200 <= response.status < 300:
                return None
            return f"{url} answered {response.status}"
    except urllib.error.HTTPError as exc:
        return f"{url} answered {exc.code}"
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"


def main(argv: list[str]) -> int:
    try:
        port = port_from(argv, os.environ, read_cmdline())
    except ValueError as exc:
        print(f"healthcheck: bad port: {exc}", file=sys.stderr)
        return 1
    problem = check(port)
    if problem is not None:
        print(f"healthcheck: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
