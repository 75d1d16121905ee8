"""What every pgfleet command process needs, whatever it runs: environment
variables, the database URL and its check, logging, the event loop, signals and
a clean exit.

Standard library only, and nothing from the commands: they all import it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("pgfleet")

#: Exit statuses of every ``pgfleet`` command (``pgfleet jobs`` adds 3 and 4):
#: the database could not be used (unreachable, refused the login, no schema), or
#: the process could not run (a port in use).
EXIT_DATABASE = 1
#: Bad input: a missing or malformed option, database URL or ``--app``; argparse's
#: own usage errors exit 2 too.
EXIT_USAGE = 2

#: The variable every ``--dsn`` flag falls back to.
DATABASE_URL = "PGFLEET_DATABASE_URL"
#: Said by every command started without a database.
NO_DATABASE = f"no database: pass --dsn or set {DATABASE_URL}"

_OFF = ("", "0", "false", "no")


# ---------------------------------------------------------------- environment


def env_default(name: str, fallback: Any = None) -> Any:
    """``$PGFLEET_<name>``, else ``fallback``: the default of a flag."""
    return os.environ.get(f"PGFLEET_{name}", fallback)


def env_flag(name: str) -> bool:
    """An on/off ``$PGFLEET_<name>``: unset, empty, 0, false and no are off."""
    return str(env_default(name, "")).strip().lower() not in _OFF


def database_url() -> str | None:
    """The database URL from the environment: the default of every ``--dsn``
    (the flag, when given, wins)."""
    return os.environ.get(DATABASE_URL) or None


def dsn_problem(dsn: str) -> str | None:
    """What is wrong with a connection string, or None. Never repeats a password."""
    try:
        parts = urlsplit(dsn)
        parts.port  # noqa: B018 - raises on a non-numeric port
    except ValueError as exc:
        return f"invalid database URL: {exc}"
    if parts.scheme not in ("postgres", "postgresql"):
        return (
            f"invalid database URL {dsn.split('@')[-1]!r}: it must start "
            "with postgresql:// (for example postgresql://user@host:5432/dbname)"
        )
    if parts.password and "change-me" in parts.password.lower():
        return "the database URL's password is an example placeholder (change-me…): set a real one"
    return None


class UsageError(Exception):
    """Bad input to a command: the ``pgfleet`` entry point prints the message, one
    line, and exits with :data:`EXIT_USAGE`."""


def check_dsn(dsn: str | None, command: str) -> None:
    """Refuse a malformed connection string before anything starts (a missing one
    is the command's to refuse)."""
    problem = dsn_problem(dsn) if dsn else None
    if problem:
        raise UsageError(f"pgfleet {command}: {problem}")


# ---------------------------------------------------------------- logging and the loop


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s [pid %(process)d] %(message)s",
        stream=sys.stderr,
    )


def install_uvloop() -> str:
    """Run asyncio on uvloop when it is installed; returns the loop's name."""
    try:
        import uvloop  # lazy: optional dependency (the service extra)
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


# ---------------------------------------------------------------- signals

_early_signals: list[signal.Signals] = []


def catch_early_signals() -> None:
    """From process start until the event loop takes over, remember SIGTERM/SIGINT
    instead of dying from them, so a stop during start-up is still a clean drain."""

    def remember(signum: int, _frame: Any) -> None:
        if _early_signals:  # asked twice while still starting: give up now
            raise SystemExit(128 + signum)
        _early_signals.append(signal.Signals(signum))

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, remember)


def stopped_early() -> bool:
    """A SIGTERM/SIGINT arrived before the event loop took over."""
    return bool(_early_signals)


class Stopper:
    """First SIGTERM/SIGINT: drain. Another one, a second or more later: stop now.

    (Signals within a second of the first count as the same request: a process
    group signalled as a whole must not skip the drain.)"""

    REPEAT_WINDOW = 1.0

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.signals = 0
        self.first_at = 0.0
        self.main: asyncio.Task[Any] | None = None

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        self.main = asyncio.current_task()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if _early_signals:  # arrived while the process was still importing
            self._on_signal(_early_signals[0])

    def _on_signal(self, sig: signal.Signals) -> None:
        now = time.monotonic()
        if self.signals and now - self.first_at < self.REPEAT_WINDOW:
            return
        self.signals += 1
        if self.signals == 1:
            self.first_at = now
            log.info("received %s: draining", sig.name)
            self.event.set()
        else:
            log.warning("received %s again: stopping now, requeueing running jobs", sig.name)
            if self.main is not None:
                self.main.cancel()


# ---------------------------------------------------------------- exit


def stuck_job_threads(settle: float = 1.0) -> list[threading.Thread]:
    """The sync-handler threads still alive after up to ``settle`` seconds. The pool
    is shut down without waiting, so its idle threads are still exiting when the
    worker returns: they are gone within that time, and only a thread running a
    handler is left."""
    deadline = time.monotonic() + settle
    stuck = []
    for thread in threading.enumerate():
        if thread.name.startswith("pgfleet-job"):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                stuck.append(thread)
    return stuck


def exit_despite_stuck_threads(code: int) -> None:
    """Exit now when sync handlers still run in threads (they cannot be stopped, and
    the interpreter would wait for them); otherwise return."""
    stuck = stuck_job_threads()
    if stuck:
        log.warning(
            "%d sync handlers are still running in threads; exiting without them "
            "(their jobs were requeued)",
            len(stuck),
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# ---------------------------------------------------------------- child processes

#: Run in the child before the real command: ask the kernel for SIGTERM when the
#: parent dies (1 is PR_SET_PDEATHSIG), check the parent is still the one that
#: started it, then exec the command (same pid; the request survives exec).
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM); "
    "os.getppid() == int(sys.argv[1]) or sys.exit('parent process gone'); "
    "os.execvp(sys.argv[2], sys.argv[2:])"
)


def guarded(argv: list[str]) -> list[str]:
    """``argv``, wrapped so that the process gets SIGTERM when this one dies (Linux;
    elsewhere unchanged).

    The request is made in the child by a tiny program that then execs the command,
    never by a ``preexec_fn``: that runs Python between fork and exec in a copy of a
    parent that may have threads, where a lock another thread held at fork time
    stays locked for ever (CPython documents it as unsafe with threads). The kernel
    signals when the parent *thread* that started the child ends: start guarded
    children from the event loop's thread.
    """
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
