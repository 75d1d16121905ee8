"""``pgfleet worker --processes N``: run N worker processes and keep them running.

Process i serves its metrics on ``--metrics-port + i`` (one port each, so Prometheus
scrapes every process; list them all as targets). A child that dies is restarted
with a fresh worker id after a backoff; the jobs it held are recovered by the
fleet leader once its heartbeat expires. SIGTERM/SIGINT are forwarded: every child
drains, and the supervisor exits 0 when all of them did. On Linux the children are
also told to drain if the supervisor itself dies.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time

log = logging.getLogger("pgfleet")

RESTART_BASE = 0.5
RESTART_CAP = 30.0
#: A child that lived this long resets the restart backoff.
HEALTHY_AFTER = 30.0

#: Set by the supervisor itself; the DSN travels in the environment instead, so a
#: password never shows in `ps`.
_CHILD_OVERRIDES = {"processes", "metrics_port", "dsn", "listen_dsn"}


def child_argv(args: argparse.Namespace, index: int) -> list[str]:
    """The command line of child ``index``: every option of the parent, with one
    process and its own metrics port."""
    from pgfleet.service.worker_cmd import add_arguments

    worker = argparse.ArgumentParser(add_help=False)
    add_arguments(worker)
    argv = [sys.executable, "-m", "pgfleet", "worker", "--processes", "1"]
    port = int(args.metrics_port)
    argv += ["--metrics-port", str(port + index if port else 0)]
    for action in worker._actions:
        dest = action.dest
        if dest in _CHILD_OVERRIDES or dest == "help" or not action.option_strings:
            continue
        value = getattr(args, dest, None)
        if value is None:
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:  # store_true
            if value:
                argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def child_env(args: argparse.Namespace) -> dict[str, str]:
    env = {**os.environ, "PGFLEET_DATABASE_URL": args.dsn}
    if getattr(args, "listen_dsn", None):
        env["PGFLEET_LISTEN_DATABASE_URL"] = args.listen_dsn
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # Own process group: a Ctrl-C in the terminal reaches the supervisor only, which
    # forwards it once, instead of every child receiving it twice.
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Supervisor:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.count = int(args.processes)
        self.children: dict[int, asyncio.subprocess.Process] = {}
        self.stopping = asyncio.Event()
        self.restarts = 0

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        from pgfleet.service.worker_cmd import _early_signals

        if _early_signals:  # stopped before the loop took over: start nothing
            self.stopping.set()
        log.info("supervising %d worker processes", self.count)
        from pgfleet.service.worker_cmd import build_config, log_budget, pool_size_of

        config = build_config(self.args)
        log_budget(self.args, config, pool_size_of(self.args, config), self.count)
        results = await asyncio.gather(*(self._keep(i) for i in range(self.count)))
        failed = [code for code in results if code != 0]
        log.info("all worker processes stopped%s", f" ({len(failed)} unclean)" if failed else "")
        return 0 if not failed else 1

    def _on_signal(self, sig: signal.Signals) -> None:
        first = not self.stopping.is_set()
        self.stopping.set()
        if first:
            log.info("received %s: draining %d worker processes", sig.name, len(self.children))
        for child in list(self.children.values()):
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(sig if first else signal.SIGTERM)

    async def _keep(self, index: int) -> int:
        """Run child ``index`` until shutdown, restarting it when it dies."""
        delay = RESTART_BASE
        while True:
            if self.stopping.is_set():
                return 0
            started = time.monotonic()
            child = await asyncio.create_subprocess_exec(
                *child_argv(self.args, index),
                preexec_fn=_die_with_parent,
                env=child_env(self.args),
            )
            self.children[index] = child
            log.info("worker process %d started (pid %d)", index, child.pid)
            if self.stopping.is_set():  # a signal arrived while it was starting
                with contextlib.suppress(ProcessLookupError):
                    child.terminate()
            code = await child.wait()
            if self.stopping.is_set():
                log.info("worker process %d (pid %d) exited with %d", index, child.pid, code)
                if code in (-signal.SIGTERM, -signal.SIGINT):
                    # Killed by our own forwarded signal before its handler was up:
                    # it was still starting, so there was nothing to drain.
                    return 0
                return code
            self.restarts += 1
            if time.monotonic() - started > HEALTHY_AFTER:
                delay = RESTART_BASE
            log.warning(
                "worker process %d (pid %d) died with %s; restarting in %.1fs",
                index,
                child.pid,
                _describe(code),
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)
            if self.stopping.is_set():
                return 0
            delay = min(delay * 2, RESTART_CAP)


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


def supervise(args: argparse.Namespace) -> int:
    from pgfleet.service.worker_cmd import install_uvloop

    install_uvloop()
    return asyncio.run(Supervisor(args).run())
