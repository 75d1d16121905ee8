"""The chaos suite's machinery: profiles, a run's context, the drain-under-fault loop,
the side-channel count of executions and the results table."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from pgfleet import EnqueueOptions, EnqueueRequest, Queue
from tests.chaos.cluster import PrivateCluster
from tests.chaos.proxy import ChaosProxy
from tests.procs import ROOT, Proc, alive, free_ports, start

# --- profiles ------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    name: str
    jobs: int
    job_ms: int  # each `work` handler sleeps this long
    workers: int
    concurrency: int
    kills: int  # SIGKILLs in the kill loop, one per `kill_interval`
    kill_interval: float
    terminate_rounds: int  # pg_terminate_backend rounds, one a second
    partition_s: float  # traffic held this long
    hang_s: float  # connections hang this long before new ones get through again
    refuse_s: float  # connections refused this long
    heartbeat: float
    dead_worker_timeout: float
    grace: float  # --shutdown-grace-period
    # Liveness bounds, generous on purpose: they tell a stall from a slow machine.
    stall_s: float  # no job finishing this long after the fault healed: stalled
    sigterm_slack_s: float  # a SIGTERMed worker must be gone within grace + this
    test_timeout: float


PROFILES = {
    # A few minutes on 2 cores: `make test` and CI run this one.
    "short": Profile(
        name="short",
        jobs=400,
        job_ms=300,
        workers=3,
        concurrency=16,
        kills=3,
        kill_interval=1.0,
        terminate_rounds=3,
        partition_s=8,
        hang_s=5,
        refuse_s=5,
        heartbeat=2,
        dead_worker_timeout=20,  # above the 15 s database_timeout, as docs/design/reliability.md advises
        grace=3,
        stall_s=60,
        sigterm_slack_s=30,
        test_timeout=360,
    ),
    # `make chaos`: the table, with the worker's default liveness settings.
    "long": Profile(
        name="long",
        jobs=3000,
        job_ms=100,
        workers=3,
        concurrency=16,
        kills=6,
        kill_interval=1.0,
        terminate_rounds=8,
        partition_s=30,
        hang_s=30,
        refuse_s=15,
        heartbeat=5,
        dead_worker_timeout=30,
        grace=10,
        stall_s=90,
        sigterm_slack_s=30,
        test_timeout=1500,
    ),
}


def profile() -> Profile:
    name = os.environ.get("PGFLEET_CHAOS_PROFILE", "short")
    if name not in PROFILES:
        raise ValueError(f"PGFLEET_CHAOS_PROFILE must be one of {sorted(PROFILES)}, got {name!r}")
    return PROFILES[name]


# --- results -------------------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    finished: str = ""
    lost: int | None = None
    ran_twice: int | None = None
    twice_after_heal: int | None = None
    drain_s: float | None = None
    recover_s: float | None = None
    alive: str = ""
    sigterm_exit_s: float | str | None = None
    verdict: str = "?"
    notes: list[str] = field(default_factory=list)


COLUMNS = [
    ("scenario", "scenario"),
    ("finished", "finished"),
    ("lost", "lost"),
    ("ran_twice", "ran twice"),
    ("twice_after_heal", "twice after heal"),
    ("drain_s", "drain s"),
    ("recover_s", "recover s"),
    ("alive", "alive"),
    ("sigterm_exit_s", "SIGTERM exit s"),
    ("verdict", "verdict"),
]


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def markdown(rows: list[Row], prof: Profile) -> str:
    head = (
        f"Chaos profile `{prof.name}`: {prof.workers} worker processes x concurrency "
        f"{prof.concurrency}, {prof.jobs} jobs of {prof.job_ms} ms, fault a third of the way in.\n\n"
    )
    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(getattr(row, key)) for key, _ in COLUMNS) + " |")
    notes = [f"- {row.scenario}: {note}" for row in rows for note in row.notes]
    return head + "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


class Results:
    """Every row of this session, rewritten to disk after each scenario so that a run
    cut short still leaves its table."""

    def __init__(self, prof: Profile) -> None:
        self.profile = prof
        self.rows: list[Row] = []
        self.dir = Path(os.environ.get("PGFLEET_CHAOS_RESULTS_DIR", ROOT / "chaos-results"))

    def keep_logs(self, name: str, work_dir: Path) -> Path:
        """Copy a failed run's process logs (and the private server's) where they
        outlive pytest's temporary directories."""
        dest = self.dir / "logs" / name
        shutil.rmtree(dest, ignore_errors=True)
        if (work_dir / "logs").is_dir():
            shutil.copytree(work_dir / "logs", dest)
        return dest

    def add(self, row: Row) -> None:
        self.rows = [r for r in self.rows if r.scenario != row.scenario] + [row]
        self.dir.mkdir(parents=True, exist_ok=True)
        data = {"profile": asdict(self.profile), "rows": [asdict(r) for r in self.rows]}
        (self.dir / f"chaos-{self.profile.name}.json").write_text(json.dumps(data, indent=2))
        (self.dir / f"chaos-{self.profile.name}.md").write_text(markdown(self.rows, self.profile))
        print("\n" + markdown([row], self.profile), flush=True)


# --- a run's context -----------------------------------------------------------------


class Monitor:
    """The test's own view of the database: a direct connection (never through the
    proxy), reopened after faults such as a restart; ``None`` while it cannot answer."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: asyncpg.Connection | None = None
        self._lock = asyncio.Lock()  # the drain loop and a fault may both ask

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record] | None:
        async with self._lock:
            try:
                if self.conn is None or self.conn.is_closed():
                    self.conn = await asyncpg.connect(self.dsn, timeout=5)
                return list(await self.conn.fetch(sql, *args, timeout=10))
            except asyncpg.PostgresSyntaxError:
                raise  # the test's own mistake
            except Exception:  # any connection trouble during a fault: ask again later
                if self.conn is not None:
                    self.conn.terminate()
                self.conn = None
                return None

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.conn.close(), 5)


TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class Victim:
    proc: Proc
    sent_at: float
    exit_s: float | None = None
    code: int | None = None


class Run:
    def __init__(
        self, cluster: PrivateCluster, database: str, work_dir: Path, prof: Profile
    ) -> None:
        self.cluster = cluster
        self.database = database
        self.prof = prof
        self.dir = work_dir
        self.runs_dir = work_dir / "runs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = work_dir / "logs"
        self.direct_dsn = cluster.dsn(database)
        self.proxy: ChaosProxy | None = None
        self.monitor = Monitor(self.direct_dsn)
        self.workers: list[Proc] = []
        self.all_procs: list[Proc] = []
        self.metrics_base = 0
        self.fault_started: float | None = None
        self.healed_at: float | None = None
        self.victim: Victim | None = None
        self._victim_task: asyncio.Task[None] | None = None
        self.notes: list[str] = []
        self.readyz: list[str] = []

    @property
    def worker_dsn(self) -> str:
        assert self.proxy is not None
        return self.cluster.dsn(self.database, port=self.proxy.port)

    async def __aenter__(self) -> Run:
        self.proxy = ChaosProxy(self.cluster.port)
        await self.proxy.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for p in self.all_procs:
            if p.process.returncode is None:
                p.signal(signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(p.process.wait(), 10)
        if self._victim_task is not None:
            self._victim_task.cancel()
        await self.monitor.close()
        if self.proxy is not None:
            await self.proxy.close()

    # --- workers ---

    def worker_args(self, index: int, concurrency: int | None = None) -> list[str]:
        p = self.prof
        extra = os.environ.get("PGFLEET_CHAOS_WORKER_ARGS", "").split()
        return [
            "worker",
            "--dsn",
            self.worker_dsn,
            "--app",
            "tests.chaos.app:registry",
            "--concurrency",
            str(concurrency or p.concurrency),
            "--metrics-port",
            str(self.metrics_base + index),
            "--heartbeat-interval",
            str(p.heartbeat),
            "--dead-worker-timeout",
            str(p.dead_worker_timeout),
            "--shutdown-grace-period",
            str(p.grace),
            "--poll-interval",
            "1",
            "--backoff-base",
            "0.5",
            "--backoff-cap",
            "5",
            *extra,
        ]

    async def start_worker(self, index: int, concurrency: int | None = None) -> Proc:
        proc = await start(
            self.worker_args(index, concurrency),
            self.log_dir,
            f"worker{index}",
            env={"PGFLEET_CHAOS_RUNS_DIR": str(self.runs_dir)},
        )
        self.all_procs.append(proc)
        return proc

    async def start_workers(self, n: int, concurrency: int | None = None) -> None:
        self.metrics_base = free_ports(n)
        self.workers = [await self.start_worker(i, concurrency) for i in range(n)]
        await self.wait_registered(n)

    async def wait_registered(self, n: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = await self.monitor.fetch(
                "SELECT count(*) AS n FROM pgfleet.workers WHERE expires_at > now()"
            )
            if rows and rows[0]["n"] >= n:
                return
            dead = [p for p in self.workers if p.process.returncode is not None]
            if dead:
                raise AssertionError(f"a worker exited at start:\n{dead[0].output()[-3000:]}")
            await asyncio.sleep(0.2)
        raise AssertionError(f"{n} workers did not register within {timeout} s")

    async def restart_worker(self, index: int) -> None:
        self.workers[index] = await self.start_worker(index)

    def sigterm_victim(self, index: int = -1) -> None:
        """SIGTERM one worker now (during the fault) and time its exit."""
        proc = self.workers[index]
        self.victim = Victim(proc, time.monotonic())
        proc.signal(signal.SIGTERM)
        self._victim_task = asyncio.create_task(self._await_victim(self.victim))

    async def _await_victim(self, victim: Victim) -> None:
        bound = self.prof.grace + self.prof.sigterm_slack_s
        try:
            victim.code = await asyncio.wait_for(victim.proc.process.wait(), bound)
            victim.exit_s = time.monotonic() - victim.sent_at
        except TimeoutError:
            victim.proc.signal(signal.SIGKILL)  # it stalled; do not leak it
            await victim.proc.process.wait()

    async def victim_done(self) -> None:
        if self._victim_task is not None:
            await asyncio.shield(self._victim_task)

    def live_workers(self) -> list[Proc]:
        victim = self.victim.proc if self.victim else None
        return [p for p in self.workers if p is not victim]

    async def probe_readyz(self, index: int) -> str:
        url = f"http://127.0.0.1:{self.metrics_base + index}/readyz"
        try:
            timeout = aiohttp.ClientTimeout(total=6)
            async with aiohttp.ClientSession(timeout=timeout) as s, s.get(url) as r:
                return str(r.status)
        except TimeoutError:
            return "no answer in 6 s"
        except aiohttp.ClientError as e:
            return f"error {type(e).__name__}"

    # --- jobs ---

    async def enqueue(self, requests: list[EnqueueRequest]) -> list[Any]:
        pool = await asyncpg.create_pool(self.direct_dsn, min_size=1, max_size=2)
        try:
            queue = Queue(pool)
            ids: list[Any] = []
            for i in range(0, len(requests), 1000):
                ids += await queue.enqueue_many(requests[i : i + 1000])
            return ids
        finally:
            await pool.close()

    def work_requests(self, n: int) -> list[EnqueueRequest]:
        options = EnqueueOptions(max_attempts=25)
        return [EnqueueRequest("work", {"ms": self.prof.job_ms}, options) for _ in range(n)]

    async def counts(self) -> dict[str, int] | None:
        """Jobs by status, history included: the leader moves finished jobs to
        pgfleet.jobs_history after ``history_move_after`` (60 s), so a drain longer
        than that would see its finished count fall and call the fleet stalled."""
        rows = await self.monitor.fetch(
            "SELECT status::text AS status, count(*) AS n FROM pgfleet.jobs_all GROUP BY 1"
        )
        return None if rows is None else {r["status"]: int(r["n"]) for r in rows}

    def executions(self) -> dict[str, list[tuple[float, int, int]]]:
        """Side channel: job id -> [(start time, attempt, pid)] in start order."""
        out: dict[str, list[tuple[float, int, int]]] = {}
        for f in self.runs_dir.glob("runs-*.log"):
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) == 5 and parts[0] == "S":
                    out.setdefault(parts[1], []).append(
                        (float(parts[4]), int(parts[2]), int(parts[3]))
                    )
        for runs in out.values():
            runs.sort()
        return out

    # --- logs ---

    def log_lines(self, *needles: str) -> list[str]:
        """Lines of every process log of this run containing any of ``needles``."""
        return [
            f"{p.log.name}: {ln}"
            for p in self.all_procs
            for ln in p.output().splitlines()
            if any(n in ln for n in needles)
        ]

    def stray_errors(self) -> list[str]:
        """Tracebacks that do not belong to a handler's failure (those the worker logs
        with the job's outcome), and asyncio's leaked-task and unretrieved-exception
        reports, as 'log file: the record they follow'."""
        out = []
        for p in self.all_procs:
            record = ""
            for ln in p.output().splitlines():
                if ln[:4].isdigit() and ln[4:5] == "-":
                    record = ln
                if (ln.startswith("Traceback") and "job failed" not in record) or (
                    "was never retrieved" in ln or "Task was destroyed" in ln
                ):
                    out.append(f"{p.log.name}: {ln[:80]} after {record[:200]!r}")
        return out

    def log_excerpt(self, lines: int = 40) -> str:
        keys = ("error", "Error", "failed", "lost", "could not", "Traceback", "stalled", "hung")
        out = []
        for p in self.all_procs:
            hits = [ln for ln in p.output().splitlines() if any(k in ln for k in keys)]
            if hits:
                out.append(f"--- {p.log.name} (pid {p.pid}, exit {p.process.returncode})")
                out += hits[:lines]
                if len(hits) > lines:
                    out.append(f"... {len(hits) - lines} more matching lines")
        return "\n".join(out)


# --- draining under a fault ----------------------------------------------------------

Fault = Callable[[Run], Coroutine[Any, Any, None]]


@dataclass
class Drain:
    done: int = 0
    drain_s: float | None = None
    recover_s: float | None = None
    stalled: str | None = None
    counts: dict[str, int] = field(default_factory=dict)


async def drain_under_fault(
    run: Run, total: int, fault: Fault | None, trigger: int, extra_heal_settle: float = 0.0
) -> Drain:
    """Watch ``total`` jobs drain; start ``fault`` once ``trigger`` of them finished.
    Stalled: no job finished for ``stall_s`` after the fault healed (or since the
    start when there is no fault) while some were still unfinished."""
    p = run.prof
    result = Drain()
    t0 = time.monotonic()
    last_progress = t0
    fault_task: asyncio.Task[None] | None = None
    overall = p.test_timeout - 60
    if fault is None:
        run.healed_at = t0
    try:
        while True:
            counts = await run.counts()
            now = time.monotonic()
            if counts is not None:
                done = sum(counts.get(s, 0) for s in TERMINAL)
                result.counts = counts
                if done > result.done:
                    if (
                        result.recover_s is None
                        and run.healed_at is not None
                        and fault is not None
                        and now >= run.healed_at
                    ):
                        result.recover_s = now - run.healed_at
                    result.done = done
                    last_progress = now
                if done >= total:
                    result.drain_s = now - t0
                    break
                if fault is not None and fault_task is None and done >= trigger:
                    run.fault_started = now
                    fault_task = asyncio.create_task(fault(run))
            if fault_task is not None and fault_task.done():
                fault_task.result()  # a broken fault is a broken test: raise it
            if run.healed_at is not None:
                quiet = now - max(last_progress, run.healed_at + extra_heal_settle)
                if quiet > p.stall_s:
                    result.stalled = (
                        f"no job finished for {quiet:.0f} s after the fault healed "
                        f"({result.done}/{total} done, counts {result.counts})"
                    )
                    break
            if now - t0 > overall:
                result.stalled = f"not drained after {overall:.0f} s ({result.done}/{total})"
                break
            await asyncio.sleep(0.25)
    finally:
        if fault_task is not None and not fault_task.done():
            fault_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await fault_task
        if run.proxy is not None and run.proxy.mode != "pass":
            await run.proxy.heal()
    return result


async def stop_workers(run: Run, procs: list[Proc]) -> list[int | None]:
    """SIGTERM each; None for a process that outlived grace + slack (then killed)."""
    for proc in procs:
        proc.signal(signal.SIGTERM)
    codes: list[int | None] = []
    bound = run.prof.grace + run.prof.sigterm_slack_s
    for proc in procs:
        try:
            codes.append(await asyncio.wait_for(proc.process.wait(), bound))
        except TimeoutError:
            proc.signal(signal.SIGKILL)
            await proc.process.wait()
            codes.append(None)
    return codes


def alive_count(procs: list[Proc]) -> int:
    return sum(1 for p in procs if p.process.returncode is None and alive(p.pid))
