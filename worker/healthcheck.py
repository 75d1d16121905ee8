"""Container health check: GET /healthz on this process's metrics port.

The image's HEALTHCHECK runs ``python /app/worker/healthcheck.py``: a slim image has
no curl or wget. The port is the first argument, else ``PGFLEET_HEALTH_PORT``, else
``PGFLEET_METRICS_PORT``, else 9464. Exit status 0 when the endpoint answers 2xx
within the timeout, 1 otherwise (with the reason on stderr, which Docker keeps in
``docker inspect``).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping

TIMEOUT = 4.0


def port_from(argv: list[str], environ: Mapping[str, str]) -> int:
    for value in (
        argv[1] if len(argv) > 1 else None,
        environ.get("PGFLEET_HEALTH_PORT"),
        environ.get("PGFLEET_METRICS_PORT"),
    ):
        if value:
            return int(value)
    return 9464


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
        port = port_from(argv, os.environ)
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
