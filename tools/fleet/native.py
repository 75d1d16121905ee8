"""NativeFleet: the compose topology as processes on this machine.

Start order: PostgreSQL (the given URL, or an embedded pgserver), ``pgfleet
migrate``, ``pgfleet worker --processes N`` (one supervisor, N processes), ``pgfleet
api``, Prometheus (when on PATH), then the demo producer and the summary. Stop
order is the reverse: producer, then workers and API drain together, Prometheus,
and the embedded PostgreSQL last.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
from pathlib import Path
from typing import TextIO

import aiohttp

from tools.devkit import postgres as kit
from tools.devkit import redact, until
from tools.fleet.children import Child, describe_exit
from tools.fleet.config import APP, CRONS, FleetConfig, write_prometheus_config
from tools.fleet.producer import DemoProducer
from tools.fleet.summary import Watcher

#: The supervisor's line for a worker process that died (it restarts it).
_WORKER_DIED = re.compile(r"worker process \d+ \(pid \d+\) died with .*")
#: What pgfleet processes and Prometheus say when their port is taken.
_PORT_TAKEN = re.compile(r"cannot listen on|address already in use")


class FleetError(Exception):
    """A part of the fleet could not be started."""


class EmbeddedPostgres:
    """A pgserver PostgreSQL in a data directory, kept between runs (the kit's
    embedded server, started off the event loop)."""

    def __init__(self, pgdata: Path) -> None:
        self.pgdata = pgdata
        self._server: kit.Server | None = None

    async def start(self) -> str:
        try:
            self._server = await asyncio.to_thread(kit.embedded, self.pgdata)
        except ImportError:
            raise FleetError(
                "no PGFLEET_DATABASE_URL and no embedded PostgreSQL: install the `embedded` "
                "extra (pip install -e '.[embedded]'; make fleet does) or point "
                "PGFLEET_DATABASE_URL at a server"
            ) from None
        return self._server.admin_dsn

    @property
    def pid(self) -> int | None:
        return None if self._server is None else self._server.pid

    async def stop(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._server.close)
            self._server = None


class NativeFleet:
    """The native fleet. ``await start()``, then ``await stop()`` (also after a
    failed start). ``stop_workers()``/``start_workers()`` take the worker processes
    away and bring them back while everything else keeps running."""

    def __init__(self, config: FleetConfig | None = None, out: TextIO | None = None) -> None:
        self.config = config or FleetConfig()
        self.out = out if out is not None else sys.stdout
        #: Unexpected exits and worker deaths seen so far, as reported.
        self.problems: list[str] = []
        self.database_url = self.config.database_url or ""
        self.embedded: EmbeddedPostgres | None = None
        self.workers: Child | None = None
        self.api: Child | None = None
        self.prometheus: Child | None = None
        self.prometheus_config: Path | None = None
        self.producer: DemoProducer | None = None
        self.watcher = Watcher(self.worker_metrics_urls, self.api_metrics_url)
        self._summary: asyncio.Task[None] | None = None
        self._workers_log_offset = 0
        self._workers_lock = asyncio.Lock()
        self._started = False
        self._stopped = False
        #: True when the credentials came from state_dir (the runner made them).
        self.token_file = False

    # --- where things are ------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.config.ports.api}"

    @property
    def api_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.config.ports.api_metrics}/metrics"

    @property
    def worker_metrics_urls(self) -> list[str]:
        ports = self.config.ports.worker_ports(self.config.processes)
        return [f"http://127.0.0.1:{port}/metrics" for port in ports]

    @property
    def prometheus_url(self) -> str | None:
        """None when Prometheus is not running (not wanted, or not on PATH)."""
        if self.prometheus is None:
            return None
        return f"http://127.0.0.1:{self.config.ports.prometheus}"

    def pids(self) -> dict[str, int]:
        """Processes started by the fleet (worker processes are the supervisor's children)."""
        found = {c.name: c.pid for c in self._children() if c.running}
        if self.embedded is not None and self.embedded.pid is not None:
            found["postgres"] = self.embedded.pid
        return found

    def _children(self) -> list[Child]:
        return [c for c in (self.workers, self.api, self.prometheus) if c is not None]

    # --- start ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start everything and wait until every process answers; on failure, stop
        what was started and raise FleetError."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self.config.logs.mkdir(parents=True, exist_ok=True)
        if not self.database_url:
            self.say(
                f"starting the embedded PostgreSQL in {self._show(self.config.state_dir)}/pgdata"
            )
            self.embedded = EmbeddedPostgres(self.config.state_dir / "pgdata")
            self.database_url = await self.embedded.start()
        await self._migrate()
        await self.start_workers()
        await self._start_api()
        await self._start_prometheus()
        if self.config.rate > 0:
            self.producer = DemoProducer(self.api_url, self.config.rate, self.config.api_token)
            self.producer.start()
        self._started = True

    def start_summary(self, interval: float = 1.0) -> None:
        """Print a summary line every ``interval`` seconds (and report worker deaths)."""
        if self._summary is None:
            self._summary = asyncio.create_task(self._summarise(interval), name="fleet-summary")

    def _env(self, **extra: str | None) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PGFLEET_DATABASE_URL": self.database_url}
        for name, value in extra.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def _pgfleet(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "pgfleet", *args]

    async def _migrate(self) -> None:
        child = Child(
            "migrate", self._pgfleet("migrate"), self.config.logs / "migrate.log", self._env()
        )
        await child.start(lambda _child, _code: None)
        child.stopping = True
        assert child.process is not None
        try:
            code = await asyncio.wait_for(child.process.wait(), self.config.start_timeout)
        except TimeoutError:
            await child.stop(5, 5)
            raise FleetError(f"pgfleet migrate did not finish:\n{child.tail()}") from None
        if code != 0:
            raise FleetError(f"pgfleet migrate failed ({describe_exit(code)}):\n{child.tail()}")

    async def start_workers(self) -> None:
        """Start the worker supervisor (unless it runs) and wait for every process's
        /readyz."""
        async with self._workers_lock:
            if self.workers is not None and self.workers.running:
                return
            argv = self._pgfleet(
                "worker",
                "--app", APP,
                "--crons", CRONS,
                "--processes", str(self.config.processes),
                "--metrics-port", str(self.config.ports.workers),
                "--metrics-host", "127.0.0.1",
                *self.config.worker_args,
            )  # fmt: skip
            log = self.config.logs / "workers.log"
            self._workers_log_offset = log.stat().st_size if log.exists() else 0
            self.workers = Child("workers", argv, log, self._env())
            await self.workers.start(self._exited)
            urls = [url.replace("/metrics", "/readyz") for url in self.worker_metrics_urls]
            await asyncio.gather(*(self._wait_ready(self.workers, url) for url in urls))

    async def stop_workers(self) -> int | None:
        """Drain and stop every worker process (the API and producer keep going).
        Returns the supervisor's exit status (None: none was running)."""
        async with self._workers_lock:
            workers = self.workers
            if workers is None or not workers.running:
                self.workers = None
                return None
            code = await workers.stop(self.config.stop_timeout)
            self.workers = None
            if code != 0 and self._started:  # after a failed start, that failure says it all
                self.problem(f"workers stopped with {describe_exit(code or 0)}; see {workers.log}")
            return code

    async def toggle_workers(self) -> None:
        """Stop the workers when they run, else start them (``kill -USR1`` the runner)."""
        if self.workers is not None and self.workers.running:
            self.say("stopping the workers (the producer keeps posting): signal again to restart")
            await self.stop_workers()
            self.say("workers stopped")
        else:
            self.say("starting the workers")
            await self.start_workers()
            self.say("workers started")

    async def _start_api(self) -> None:
        argv = self._pgfleet(
            "api",
            "--host", "127.0.0.1",
            "--port", str(self.config.ports.api),
            "--metrics-host", "127.0.0.1",
            "--metrics-port", str(self.config.ports.api_metrics),
            "--app", APP,
        )  # fmt: skip
        if not self.config.ui:
            argv.append("--no-ui")
        if self.config.api_credentials:
            env = self._env(PGFLEET_API_CREDENTIALS=self.config.api_credentials)
        else:  # the one-token setup (PGFLEET_API_TOKEN), or no auth
            env = self._env(PGFLEET_API_TOKEN=self.config.api_token)
        self.api = Child("api", argv, self.config.logs / "api.log", env)
        await self.api.start(self._exited)
        await self._wait_ready(self.api, f"{self.api_url}/readyz")
        await self._wait_ready(self.api, self.api_metrics_url.replace("/metrics", "/readyz"))

    async def _start_prometheus(self) -> None:
        if not self.config.prometheus:
            return
        binary = shutil.which("prometheus")
        if binary is None:
            self.say(
                "prometheus is not on PATH: running without it (install it for alerts and "
                "queries: apt-get install prometheus, or a release from prometheus.io)"
            )
            return
        self.prometheus_config = write_prometheus_config(self.config)
        data = self.config.state_dir / "prometheus"
        argv = [
            binary,
            f"--config.file={self.prometheus_config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{self.config.ports.prometheus}",
            "--log.level=warn",
        ]
        self.prometheus = Child(
            "prometheus", argv, self.config.logs / "prometheus.log", self._env()
        )
        await self.prometheus.start(self._exited)
        await self._wait_ready(self.prometheus, f"{self.prometheus_url}/-/ready")

    async def _wait_ready(self, child: Child, url: str) -> None:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def ready() -> bool:
                if not child.running:
                    code = child.returncode
                    raise FleetError(
                        f"{child.name} exited with {describe_exit(code or 0)} while starting; "
                        f"its log ({child.log}):\n{child.tail()}"
                    )
                if _PORT_TAKEN.search(child.output()):
                    # The worker supervisor would restart the process for ever.
                    raise FleetError(f"{child.name} cannot listen:\n{child.tail()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(url) as response:
                        return response.status == 200
                return False

            try:
                await until(ready, self.config.start_timeout, url, interval=0.2)
            except TimeoutError:
                raise FleetError(
                    f"{child.name} did not answer {url} within "
                    f"{self.config.start_timeout:.0f}s; its log ({child.log}):\n{child.tail()}"
                ) from None

    # --- running -------------------------------------------------------------------

    def _exited(self, child: Child, code: int) -> None:
        self.problem(
            f"{child.name} (pid {child.pid}) exited unexpectedly with {describe_exit(code)}; "
            f"last lines of {self._show(child.log)}:\n{child.tail(8)}"
        )

    def problem(self, message: str) -> None:
        self.problems.append(message)
        self.say(f"!! {message}")

    def say(self, line: str) -> None:
        self.out.write(f"{line}\n")
        self.out.flush()

    def _show(self, path: Path) -> str:
        with contextlib.suppress(ValueError):
            return str(path.relative_to(Path.cwd()))
        return str(path)

    def _relay_worker_deaths(self) -> None:
        """Report the supervisor's "worker process i (pid p) died" lines (it restarts them)."""
        if self.workers is None:
            return
        try:
            with self.workers.log.open("rb") as f:
                f.seek(self._workers_log_offset)
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1  # whole lines only
        self._workers_log_offset += end
        for match in _WORKER_DIED.finditer(chunk[:end].decode(errors="replace")):
            self.problem(match.group(0))

    async def summary_line(self) -> str:
        sample = await self.watcher.sample()
        stats = self.producer.stats if self.producer is not None else None
        return self.watcher.line(
            sample,
            enqueued=stats.accepted if stats else 0,
            unsent=stats.unsent if stats else 0,
            refused=sum(stats.refused.values()) if stats else 0,
        )

    async def _summarise(self, interval: float) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            self._relay_worker_deaths()
            self.say(await self.summary_line())
            next_at = max(next_at + interval, loop.time())
            await asyncio.sleep(next_at - loop.time())

    def banner(self) -> str:
        """Where to look, for people."""
        ports = self.config.ports
        if self.embedded is not None:
            pgdata = self._show(self.config.state_dir / "pgdata")
            db = f"embedded PostgreSQL in {pgdata} ({self.database_url})"
        else:
            db = redact(self.database_url)
        workers = ", ".join(str(p) for p in ports.worker_ports(self.config.processes))
        lines = [
            "pgfleet native fleet: Ctrl-C drains and stops everything",
            f"  database    {db}",
            f"  workers     {self.config.processes} processes of worker.app (metrics on "
            f"127.0.0.1:{workers}: /metrics /healthz /readyz)",
            f"  jobs API    {self.api_url}/jobs   (e.g. curl -s{self._auth_header()} "
            f"'{self.api_url}/jobs?limit=5')",
            f"  API metrics {self.api_metrics_url}",
        ]
        if self.config.ui and self.config.api_token:
            if self.token_file:
                where = f"the operator token: {self._show(self.config.state_dir)}/operator-token"
            else:
                where = "PGFLEET_API_TOKEN"
            lines.append(f"  console     {self.api_url}/ui/   (log in with {where})")
        elif self.config.ui:
            lines.append("  console     off: operators sign in with a credential (none given)")
        if self.prometheus_url:
            lines.append(
                f"  prometheus  {self.prometheus_url}  (alerts: {self.prometheus_url}/alerts; "
                f"config {self._show(self.prometheus_config or Path())})"
            )
        else:
            lines.append("  prometheus  not running")
        lines.append(
            "  grafana     needs Docker: cp .env.example .env; docker compose up "
            "(http://127.0.0.1:3000)"
        )
        if self.producer is not None:
            lines.append(
                f"  producer    {self.config.rate:g} jobs/s to the API: noop, sleep, cpu, "
                "send_email, flaky (retried, some dead), fail (dead)"
            )
        lines.append(f"  logs        {self._show(self.config.logs)}/")
        lines.append(
            f"  try         kill -USR1 {os.getpid()}: stops the workers while the producer "
            "goes on (the backlog alert fires); again: starts them"
        )
        lines.append(
            "summary every second: finished attempts since start, backlog from the queue gauges"
        )
        return "\n".join(lines)

    def _auth_header(self) -> str:
        if not self.config.api_token:
            return ""
        if self.token_file:
            # Listing jobs is an operator's (or viewer's) right, not the producer's.
            token = f"$(cat {self._show(self.config.state_dir)}/operator-token)"
        else:
            token = "$PGFLEET_API_TOKEN"
        return f' -H "Authorization: Bearer {token}"'

    # --- stop ----------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop everything: producer, then workers and API (draining), Prometheus, the
        embedded PostgreSQL. Safe to call twice and after a failed start."""
        if self._stopped:
            return
        self._stopped = True
        if self._summary is not None:
            self._summary.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._summary
        if self.producer is not None:
            await self.producer.stop()
        await asyncio.gather(self.stop_workers(), self._stop_api())
        if self.prometheus is not None:
            await self.prometheus.stop(30)
        await self.watcher.close()
        if self.embedded is not None:
            await self.embedded.stop()

    async def _stop_api(self) -> None:
        if self.api is not None and self.api.running:
            code = await self.api.stop(self.config.stop_timeout)
            if code != 0 and self._started:
                self.problem(f"api stopped with {describe_exit(code or 0)}; see {self.api.log}")

    def hurry(self) -> None:
        """A second Ctrl-C: tell the pgfleet processes to stop without draining."""
        for child in (self.workers, self.api):
            if child is not None:
                child.signal(signal.SIGTERM)
