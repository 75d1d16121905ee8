"""``pgfleet worker --processes N``: run N worker processes and keep them running.

Process i serves its metrics on ``--metrics-port + i`` (one port each, so Prometheus
scrapes every process; list them all as targets). A child that dies is restarted
with a fresh worker id after a backoff; the jobs it held are recovered by the
fleet leader once its heartbeat expires. SIGTERM/SIGINT are forwarded: every child
drains, and the supervisor exits 0 when all of them did. On Linux the children are
also told to drain if the supervisor itself dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Mapping

from pgfleet.service.process import guarded, install_uvloop, stopped_early

log = logging.getLogger("pgfleet")

RESTART_BASE = 0.5
RESTART_CAP = 30.0
#: A child that lived this long resets the restart backoff.
HEALTHY_AFTER = 30.0


#: The command line of child ``index``.
Command = Callable[[int], list[str]]


class Supervisor:
    """Keeps ``count`` children running: ``command(i)`` started with ``env``.

    It knows nothing of what the children are: the caller says how to start them."""

    def __init__(
        self,
        count: int,
        command: Command,
        env: Mapping[str, str],
        on_start: Callable[[], None] | None = None,
    ) -> None:
        self.count = count
        self.command = command
        self.env = dict(env)
        self.on_start = on_start
        self.children: dict[int, asyncio.subprocess.Process] = {}
        self.stopping = asyncio.Event()
        self.restarts = 0

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        if stopped_early():  # stopped before the loop took over: start nothing
            self.stopping.set()
        log.info("supervising %d worker processes", self.count)
        if self.on_start is not None:
            self.on_start()
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
                *guarded(self.command(index)),
                env=self.env,
                # Own session (and process group): a Ctrl-C in the terminal reaches
                # the supervisor only, which forwards it once, instead of every
                # child getting two. (uvloop has no process_group.)
                start_new_session=True,
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


def supervise(
    count: int,
    command: Command,
    env: Mapping[str, str],
    on_start: Callable[[], None] | None = None,
) -> int:
    """Run and keep running ``count`` children until SIGTERM/SIGINT; returns the exit
    code. ``on_start`` runs once the supervisor's loop is up, before any child."""
    install_uvloop()
    return asyncio.run(Supervisor(count, command, env, on_start).run())
