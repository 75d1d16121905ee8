"""A private, throwaway PostgreSQL cluster the chaos tests may stop and restart.

The shared server on 127.0.0.1:5432 is never touched: ``initdb`` makes a new data
directory under a temporary folder, the server listens on a free port on 127.0.0.1
and on a Unix socket inside that folder, with fsync off (the data is thrown away).
``initdb`` refuses to run as root, so as root every server command runs as the
``postgres`` system user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tools.devkit import free_port

SEARCH = ("/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin", "/usr/pgsql-*/bin")


def find_bindir() -> Path | None:
    """A directory holding initdb, pg_ctl and postgres (newest version first), or None."""
    explicit = os.environ.get("PGFLEET_CHAOS_PG_BINDIR")
    candidates: list[Path] = [Path(explicit)] if explicit else []
    for pattern in SEARCH:
        root = Path("/")
        candidates += sorted(root.glob(pattern.lstrip("/")), reverse=True)
    which = shutil.which("initdb")
    if which:
        candidates.append(Path(which).parent)
    for d in candidates:
        if all((d / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return d
    return None


def why_unavailable() -> str | None:
    """None when a private cluster can be made here, else the reason it cannot."""
    if find_bindir() is None:
        return (
            "no initdb/pg_ctl/postgres binaries found (looked in /usr/lib/postgresql/*/bin, "
            "PATH, $PGFLEET_CHAOS_PG_BINDIR): install the postgresql package"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run initdb as"
    return None


class PrivateCluster:
    def __init__(self) -> None:
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError(why_unavailable() or "no PostgreSQL binaries")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="pgfleet-chaos-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.logfile = self.root / "postgres.log"
        self.port = free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run(["mkdir", "-p", str(self.socket_dir)])

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn(self, database: str, port: int | None = None) -> str:
        return f"postgresql://postgres@127.0.0.1:{port or self.port}/{database}"

    def _run(self, argv: list[str], timeout: float = 120) -> str:
        result = subprocess.run(
            [*self._as_user, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=str(self.root),
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {result.returncode}: {result.stdout}{result.stderr}"
                f"\n{self.log_tail()}"
            )
        return result.stdout

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.logfile.read_text(errors="replace")[-chars:]
        return ""

    def init(self) -> None:
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ]
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.socket_dir}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "300",
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] '",
        }
        conf = "".join(f"{k} = {v}\n" for k, v in settings.items())
        # Root may append to the file initdb (as postgres) made; its owner stays postgres.
        with (self.data / "postgresql.conf").open("a") as f:
            f.write(conf)

    def _ctl(self, *args: str) -> None:
        self._run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), *args]
        )

    def start(self) -> None:
        self._ctl("-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-w", "-t", "60", "-m", mode, "stop")

    def restart(self, mode: str = "fast") -> None:
        self._ctl("-w", "-t", "60", "-m", mode, "restart")

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
