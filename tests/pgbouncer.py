"""A private PgBouncer for the tests: generated ini and userlist, a free port on
127.0.0.1, in front of the test server. Never the system service."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tools.devkit import free_port, until_sync

CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def find_binary() -> str | None:
    for path in CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("pgbouncer")


@dataclass
class Bouncer:
    port: int
    pool_mode: str
    directory: Path
    process: subprocess.Popen[bytes]
    user: str

    def dsn(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # immediate shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)


def start(server_dsn: str, pool_mode: str, *, pool_size: int = 4) -> Bouncer:
    """PgBouncer in ``pool_mode`` with at most ``pool_size`` server connections per
    database and user, forwarding every database name to ``server_dsn``'s server.
    No ``max_prepared_statements``: like PgBouncer before 1.21, named prepared
    statements do not survive a change of server connection."""
    binary = find_binary()
    if binary is None:
        raise RuntimeError("pgbouncer is not installed (Debian package pgbouncer)")
    parts = urlsplit(server_dsn)
    host = parts.hostname or "127.0.0.1"
    server_port = parts.port or 5432
    user = parts.username or "postgres"
    directory = Path(tempfile.mkdtemp(prefix="pgfleet-pgbouncer-"))
    port = free_port()
    (directory / "userlist.txt").write_text(f'"{user}" ""\n')
    (directory / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={server_port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        f"unix_socket_dir = {directory}\n"
        "auth_type = trust\n"
        f"auth_file = {directory / 'userlist.txt'}\n"
        f"pool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\n"
        "min_pool_size = 0\n"
        "reserve_pool_size = 0\n"
        f"max_db_connections = {pool_size}\n"
        "max_client_conn = 1000\n"
        "server_reset_query = DISCARD ALL\n"
        "server_reset_query_always = 0\n"
        "server_check_delay = 10\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        f"logfile = {directory / 'pgbouncer.log'}\n"
        f"pidfile = {directory / 'pgbouncer.pid'}\n"
        "log_connections = 0\n"
        "log_disconnections = 0\n"
        "admin_users = " + user + "\n"
    )
    run_as = _unprivileged_user(directory)
    with (directory / "stderr.log").open("wb") as err:
        process = subprocess.Popen(
            [binary, "-q", str(directory / "pgbouncer.ini")],
            user=run_as,
            group=run_as,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    bouncer = Bouncer(port, pool_mode, directory, process, user)

    def listening() -> bool:
        if process.poll() is not None:
            stderr = (directory / "stderr.log").read_text(errors="replace")
            shutil.rmtree(directory, ignore_errors=True)
            raise RuntimeError(f"pgbouncer exited at start: {stderr}{bouncer.log()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return True
        return False

    try:
        until_sync(listening, 20, "pgbouncer to listen")
    except TimeoutError:
        bouncer.stop()
        raise RuntimeError("pgbouncer did not listen within 20s") from None
    return bouncer


def _unprivileged_user(directory: Path) -> str | None:
    """PgBouncer refuses to run as root (CI runs as root): run it as the postgres
    user, or nobody, owning its directory."""
    if os.geteuid() != 0:
        return None
    import pwd

    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            for path in (directory, *directory.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            return name
    raise RuntimeError("running as root and no postgres or nobody user to run pgbouncer as")


def with_port(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = f"{parts.username or 'postgres'}@127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
