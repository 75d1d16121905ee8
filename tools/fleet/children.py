"""The fleet's child processes: started in their own process group, ending with the
runner (the development kit's die-with-parent guard), logged to a file, stopped by
signal, and watched so that an unexpected exit is reported."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from tools.devkit import describe_exit, guarded, stop
from tools.fleet.config import ROOT

__all__ = ["Child", "describe_exit"]


class Child:
    """One process of the fleet (the worker supervisor, the API, Prometheus...)."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.env = env
        self.process: asyncio.subprocess.Process | None = None
        #: Set once the fleet asked this process to stop: its exit is expected.
        self.stopping = False
        self._log_start = 0
        self._watch: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    async def start(self, on_unexpected_exit: Callable[[Child, int], None]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.stopping = False
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            out.write(f"--- {self.name}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.process = await asyncio.create_subprocess_exec(
                *guarded(self.argv),
                cwd=str(ROOT),
                env=self.env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                # Own process group: a Ctrl-C in the terminal reaches the runner
                # alone, which stops the children in order (producer, then workers
                # and API, then Prometheus) instead of all of them at once.
                process_group=0,
            )
        self._watch = asyncio.create_task(self._watch_exit(on_unexpected_exit))

    async def _watch_exit(self, on_unexpected_exit: Callable[[Child, int], None]) -> None:
        assert self.process is not None
        code = await self.process.wait()
        if not self.stopping:
            on_unexpected_exit(self, code)

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(sig)

    async def stop(self, timeout: float, hurry: float = 15.0) -> int | None:
        """SIGTERM (drain), then SIGTERM again after ``timeout`` (pgfleet processes
        stop at once on a second signal), then SIGKILL after ``hurry`` more."""
        if self.process is None:
            return None
        self.stopping = True
        await stop(self.process, timeout, again_after=hurry)
        if self._watch is not None:
            await self._watch
        return self.process.returncode

    def output(self) -> str:
        """What this run of the process wrote (its log is appended to across runs)."""
        try:
            with self.log.open("rb") as f:
                f.seek(self._log_start)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 15) -> str:
        """The last lines of the log (read from its end: logs grow for as long as the
        fleet runs)."""
        try:
            with self.log.open("rb") as f:
                f.seek(max(f.seek(0, os.SEEK_END) - 64 * 1024, 0))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
