"""Chaos: real `pgfleet worker` processes drain jobs from a private PostgreSQL reached
through a proxy the test controls, while a fault hits a third of the way in; one worker
gets SIGTERM during the fault. Nothing may be lost, no worker may stall, and a job may
run twice only when the fault cut its attempt.

Profiles: ``PGFLEET_CHAOS_PROFILE=short`` (default, in ``make test``) or ``long``
(``make chaos``). Each scenario prints its row; the session's table is written to
``chaos-results/chaos-<profile>.{md,json}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import pgfleet
from pgfleet import EnqueueOptions, EnqueueRequest
from tests.chaos import app, conftest, harness
from tests.chaos.cluster import PrivateCluster
from tests.chaos.harness import Row, Run
from tests.procs import Proc, start

PROFILE = harness.profile()

pytestmark = [pytest.mark.slow, pytest.mark.timeout(PROFILE.test_timeout)]


# --- faults ---------------------------------------------------------------------------
# Each injects its fault, SIGTERMs the last worker while the fault holds, heals and
# sets run.healed_at (from then on the stall clock runs).


async def fault_none(run: Run) -> None:
    run.healed_at = time.monotonic()


async def fault_sigkill(run: Run) -> None:
    """SIGKILL workers 0 and 1 in turn, one a `kill_interval`; each is restarted at
    once, as a process manager would."""
    p = run.prof
    for i in range(p.kills):
        index = i % 2
        run.workers[index].signal(signal.SIGKILL)
        await run.workers[index].process.wait()
        await run.restart_worker(index)
        if i == p.kills // 2:
            run.sigterm_victim()
        await asyncio.sleep(p.kill_interval)
    run.healed_at = time.monotonic()


async def fault_restart(run: Run) -> None:
    run.sigterm_victim()
    await asyncio.to_thread(run.cluster.restart, "fast")
    run.healed_at = time.monotonic()


async def fault_terminate(run: Run) -> None:
    """pg_terminate_backend on every connection to the database but the test's own,
    once a second; the listener's backend (its last statement a LISTEN) included."""
    listener_hits = 0
    terminated = 0
    for i in range(run.prof.terminate_rounds):
        rows = await run.monitor.fetch(
            "SELECT pg_terminate_backend(pid) AS ok, query ILIKE 'LISTEN%' AS listener "
            "FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        )
        for r in rows or []:
            terminated += int(bool(r["ok"]))
            listener_hits += int(bool(r["ok"] and r["listener"]))
        if i == run.prof.terminate_rounds // 2:
            run.sigterm_victim()
        await asyncio.sleep(1)
    run.notes.append(f"{terminated} backends terminated, {listener_hits} of them listeners")
    assert listener_hits > 0, "no listener backend was terminated: the scenario missed it"
    run.healed_at = time.monotonic()


async def fault_reset(run: Run) -> None:
    """Every open connection reset (RST), and each new one for a second."""
    assert run.proxy is not None
    n = run.proxy.reset_all()
    run.proxy.mode = "reset"
    run.sigterm_victim()
    await asyncio.sleep(1)
    await run.proxy.heal()
    run.notes.append(f"{n} connections reset")
    run.healed_at = time.monotonic()


async def fault_partition(run: Run) -> None:
    assert run.proxy is not None
    run.proxy.partition()
    run.sigterm_victim()
    await asyncio.sleep(run.prof.partition_s)
    await run.proxy.heal()
    run.healed_at = time.monotonic()


async def fault_hang(run: Run) -> None:
    """Every connection stops answering and is never closed; after `hang_s` new
    connections get through again (the hung ones stay hung). /readyz of the other
    workers is probed meanwhile: it must say unready."""
    assert run.proxy is not None
    n = run.proxy.hang()
    run.sigterm_victim()
    deadline = time.monotonic() + run.prof.hang_s
    await asyncio.sleep(min(2.0, run.prof.hang_s / 2))
    while time.monotonic() < deadline:
        probes = await asyncio.gather(*(run.probe_readyz(i) for i in (0, 1)))
        run.readyz += probes
        await asyncio.sleep(max(0.0, min(1.0, deadline - time.monotonic())))
    await run.proxy.heal()
    run.healed_at = time.monotonic()
    forwarding, hung = run.proxy.open_links()
    run.notes.append(
        f"{n} connections hung; /readyz during the hang: {sorted(set(run.readyz))}; "
        f"at heal {hung} hung, {forwarding} forwarding"
    )


async def fault_refuse(run: Run) -> None:
    """Postgres unreachable: open connections reset, new ones refused for `refuse_s`."""
    assert run.proxy is not None
    run.proxy.reset_all()
    await run.proxy.refuse()
    run.sigterm_victim()
    await asyncio.sleep(run.prof.refuse_s)
    await run.proxy.heal()
    run.healed_at = time.monotonic()


@dataclass(frozen=True)
class Scenario:
    fault: Callable[[Run], Coroutine[Any, Any, None]]
    label: str
    # How long after the heal an execution may still have been cut by the fault: the
    # hung connections stay hung until the worker's client-side bound drops them.
    settle_s: float = 2.0


SCENARIOS = {
    "none": Scenario(fault_none, "no fault"),
    "sigkill": Scenario(fault_sigkill, f"SIGKILL a worker every 1 s, {PROFILE.kills} times"),
    "restart": Scenario(fault_restart, "Postgres restart (fast)"),
    "terminate": Scenario(
        fault_terminate, f"pg_terminate_backend on all, {PROFILE.terminate_rounds} times"
    ),
    "reset": Scenario(fault_reset, "every connection reset (RST)"),
    "partition": Scenario(
        fault_partition, f"partition {PROFILE.partition_s:.0f} s (held, then delivered)"
    ),
    "hang": Scenario(
        fault_hang, f"connections hang forever (new ones pass after {PROFILE.hang_s:.0f} s)", 30
    ),
    "refuse": Scenario(fault_refuse, f"connections refused {PROFILE.refuse_s:.0f} s"),
}


def _keep(results: harness.Results, name: str, row: Row, tmp_path: Path) -> None:
    if row.verdict != "ok":
        row.notes.append(f"full logs: {results.keep_logs(name, tmp_path)}")
    results.add(row)


# --- draining under each fault -------------------------------------------------------


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_drain_under_fault(
    name: str,
    chaos_cluster: PrivateCluster,
    chaos_results: harness.Results,
    tmp_path: Path,
) -> None:
    row = asyncio.run(_drain(SCENARIOS[name], chaos_cluster, tmp_path))
    _keep(chaos_results, f"drain-{name}", row, tmp_path)
    assert row.verdict == "ok", "\n".join(row.notes)


async def _drain(scn: Scenario, cluster: PrivateCluster, tmp_path: Path) -> Row:
    p = PROFILE
    row = Row(scn.label)
    database = await conftest.new_database(cluster)
    async with Run(cluster, database, tmp_path, p) as run:
        await run.start_workers(p.workers)
        enqueued = await run.enqueue(run.work_requests(p.jobs))
        ids = {str(i) for i in enqueued}
        fault = None if scn.fault is fault_none else scn.fault
        drain = await harness.drain_under_fault(run, p.jobs, fault, p.jobs // 3)
        await run.victim_done()
        live = run.live_workers()
        idle = await _probe_every_worker(run, live, p.jobs) if not drain.stalled else []
        if scn.fault is fault_hang and run.proxy is not None:
            run.notes.append(
                f"{run.proxy.open_links()[1]} hung connections still open after the drain"
            )
        alive = harness.alive_count(live)
        codes = await harness.stop_workers(run, live)
        lost_rows = await run.monitor.fetch(
            "SELECT id, status::text AS status, attempt, last_error FROM pgfleet.jobs_all "
            "WHERE status <> 'succeeded' ORDER BY id LIMIT 5"
        )
        tally = await run.monitor.fetch(
            "SELECT count(*) FILTER (WHERE status = 'succeeded' AND id = ANY($1)) AS drained, "
            "count(*) FILTER (WHERE status <> 'succeeded') AS lost FROM pgfleet.jobs_all",
            enqueued,
        )
        executions = run.executions()
        problems: list[str] = list(run.notes)
        # The symptom of a connection used after it was handed back.
        misuse = run.log_lines("released back to the pool")
        noise = run.stray_errors()

        assert tally is not None, "the database did not answer after the run"
        row.finished = f"{tally[0]['drained']}/{p.jobs}"
        row.lost = int(tally[0]["lost"])  # the probe's jobs included
        row.drain_s = drain.drain_s
        row.recover_s = drain.recover_s
        twice = {j: r for j, r in executions.items() if len(r) > 1}
        row.ran_twice = len(twice)
        healed = run.healed_at or 0.0
        # wall-clock time of the heal, to compare with the handlers' time.time() stamps
        healed_wall = time.time() - (time.monotonic() - healed)
        after_heal = {
            j: r
            for j, r in twice.items()
            if any(t > healed_wall + scn.settle_s for t, _, _ in r[:-1])
        }
        row.twice_after_heal = len(after_heal)
        row.alive = f"{alive}/{len(live)}"
        never_ran = ids - set(executions)
        if run.victim is not None:
            v = run.victim
            row.sigterm_exit_s = (
                v.exit_s if v.exit_s is not None else f"> {p.grace + p.sigterm_slack_s:.0f}"
            )
            if v.exit_s is None:
                problems.append(
                    f"SIGTERMed worker (pid {v.proc.pid}) still running "
                    f"{p.grace + p.sigterm_slack_s:.0f} s later: killed"
                )
            else:
                problems.append(f"SIGTERMed worker exited {v.code} after {v.exit_s:.1f} s")

    if drain.stalled:
        problems.append(f"STALLED: {drain.stalled}")
    if row.lost:
        problems.append(f"LOST {row.lost} jobs, e.g. {[dict(r) for r in lost_rows or []]}")
    if never_ran and not drain.stalled:
        problems.append(f"{len(never_ran)} jobs never ran")
    if after_heal:
        sample = list(after_heal.items())[:3]
        problems.append(f"{len(after_heal)} jobs ran again after the fault healed: {sample}")
    if alive != len(live):
        problems.append(f"only {alive} of {len(live)} workers alive at the end")
    if idle:
        problems.append(f"STALLED worker: pids {idle} ran no job after the fault healed")
    if any(c != 0 for c in codes):
        problems.append(f"final SIGTERM exit codes {codes} (None: outlived grace + slack)")
    if run.victim is not None and run.victim.exit_s is None:
        pass  # already a problem above
    if misuse:
        problems.append(f"connection used after release ({len(misuse)} lines): {misuse[:3]}")
    if noise:
        problems.append(f"{len(noise)} stray tracebacks/asyncio reports, e.g. {noise[:2]}")
    if scn.fault is fault_hang and "503" not in run.readyz:
        problems.append(f"/readyz never answered 503 during the hang: {run.readyz}")

    failed = (
        bool(drain.stalled)
        or bool(row.lost)
        or bool(after_heal)
        or alive != len(live)
        or bool(idle)
        or bool(misuse)
        or any(pr.startswith("STALLED") for pr in problems)
        or any(c != 0 for c in codes)
        or (run.victim is not None and run.victim.exit_s is None)
        or (scn.fault is fault_hang and "503" not in run.readyz)
    )
    row.verdict = "FAIL" if failed else "ok"
    row.notes = problems
    if failed:
        row.notes.append("log excerpt:\n" + run.log_excerpt())
    return row


async def _probe_every_worker(run: Run, live: list[Proc], done_before: int) -> list[int]:
    """After the drain, one job of 1 s per handler slot of the fleet: every worker has
    to take its share, so a worker whose claim loop stalled shows. Returns the pids of
    live workers that ran no job since the fault healed."""
    p = run.prof
    healed = run.healed_at or time.monotonic()
    n = p.concurrency * len(live)
    await run.enqueue([EnqueueRequest("work", {"ms": 1000}, EnqueueOptions(max_attempts=25))] * n)
    probe = await harness.drain_under_fault(run, done_before + n, None, 0)
    run.healed_at = healed
    if probe.stalled:
        run.notes.append(f"STALLED after the drain: {probe.stalled}")
    since = time.time() - (time.monotonic() - healed)
    ran = {pid for runs in run.executions().values() for t, _, pid in runs if t > since}
    return [w.pid for w in live if w.pid not in ran]


# --- a limited name ------------------------------------------------------------------

#: The concurrency limit of the limited-name scenarios (below the fleet's 48 slots).
LIMIT = 8


@pytest.mark.parametrize("name", ["sigkill", "partition"])
def test_limited_name_under_fault(
    name: str,
    chaos_cluster: PrivateCluster,
    chaos_results: harness.Results,
    tmp_path: Path,
) -> None:
    row = asyncio.run(_limited(SCENARIOS[name], chaos_cluster, tmp_path))
    _keep(chaos_results, f"limited-{name}", row, tmp_path)
    assert row.verdict == "ok", "\n".join(row.notes)


async def _limited(scn: Scenario, cluster: PrivateCluster, tmp_path: Path) -> Row:
    """A name limited to ``LIMIT`` at once drains under the fault: nothing lost, and
    its running jobs, sampled from Postgres every 20 ms from outside the workers,
    never more than the limit (a killed or partitioned worker's jobs keep counting
    until the rescue gives them back)."""
    p = PROFILE
    total = p.jobs // 2
    row = Row(f"concurrency={LIMIT} name, {scn.label}")
    database = await conftest.new_database(cluster)
    async with Run(cluster, database, tmp_path, p) as run:
        pool = await asyncpg.create_pool(run.direct_dsn, min_size=1, max_size=2)
        try:
            await pgfleet.Queue(pool).set_limits("work", concurrency=LIMIT)
        finally:
            await pool.close()
        await run.start_workers(p.workers)
        enqueued = await run.enqueue(run.work_requests(total))
        ids = {str(i) for i in enqueued}
        stop = asyncio.Event()
        seen: list[int] = []

        async def sample() -> None:
            conn = await asyncpg.connect(run.direct_dsn)
            try:
                while not stop.is_set():
                    seen.append(
                        await conn.fetchval(
                            "SELECT count(*) FROM pgfleet.jobs "
                            "WHERE name = 'work' AND status = 'running'"
                        )
                    )
                    await asyncio.sleep(0.02)
            finally:
                await conn.close()

        sampler = asyncio.create_task(sample())
        try:
            drain = await harness.drain_under_fault(run, total, scn.fault, total // 3)
            await run.victim_done()
        finally:
            stop.set()
            await sampler
        live = run.live_workers()
        codes = await harness.stop_workers(run, live)
        tally = await run.monitor.fetch(
            "SELECT count(*) FILTER (WHERE status = 'succeeded' AND id = ANY($1)) AS drained, "
            "count(*) FILTER (WHERE status <> 'succeeded') AS lost FROM pgfleet.jobs_all",
            enqueued,
        )
        executions = run.executions()
    problems = list(run.notes)
    assert tally is not None, "the database did not answer after the run"
    row.finished = f"{tally[0]['drained']}/{total}"
    row.lost = int(tally[0]["lost"])
    row.drain_s = drain.drain_s
    row.recover_s = drain.recover_s
    row.ran_twice = sum(1 for r in executions.values() if len(r) > 1)
    peak = max(seen, default=0)
    problems.append(f"running at once: at most {peak} in {len(seen)} samples (limit {LIMIT})")
    never_ran = ids - set(executions)
    if drain.stalled:
        problems.append(f"STALLED: {drain.stalled}")
    if row.lost:
        problems.append(f"LOST {row.lost} jobs")
    if never_ran and not drain.stalled:
        problems.append(f"{len(never_ran)} jobs never ran")
    if peak > LIMIT:
        problems.append(f"OVER THE LIMIT: {peak} running at once")
    if peak < LIMIT:
        problems.append(f"the limit was never reached ({peak}): the scenario tested nothing")
    if any(c != 0 for c in codes):
        problems.append(f"final SIGTERM exit codes {codes}")
    failed = bool(
        drain.stalled
        or row.lost
        or (never_ran and not drain.stalled)
        or peak != LIMIT
        or any(c != 0 for c in codes)
    )
    row.verdict = "FAIL" if failed else "ok"
    row.notes = problems
    return row


# --- poison outcomes -----------------------------------------------------------------


def test_poison_outcomes_do_not_block_other_jobs(
    chaos_cluster: PrivateCluster, chaos_results: harness.Results, tmp_path: Path
) -> None:
    row = asyncio.run(_poison(chaos_cluster, tmp_path))
    _keep(chaos_results, "poison", row, tmp_path)
    assert row.verdict == "ok", "\n".join(row.notes)


async def _poison(cluster: PrivateCluster, tmp_path: Path) -> Row:
    """Handlers raising with a NUL, a lone surrogate and 1 MB in the message, among
    ordinary jobs: every other job completes; each poison job ends failed (after its
    retry) with a readable error; the workers stop cleanly."""
    p = PROFILE
    n = max(p.jobs // 2, 100)
    row = Row("poison outcomes (NUL, lone surrogate, 1 MB message)")
    database = await conftest.new_database(cluster)
    async with Run(cluster, database, tmp_path, p) as run:
        await run.start_workers(2)
        requests = run.work_requests(n)
        poison = EnqueueOptions(max_attempts=2)
        for i, kind in enumerate(app.POISON_MESSAGES):
            requests.insert((i + 1) * n // 4, EnqueueRequest("poison", {"kind": kind}, poison))
        ids = await run.enqueue(requests)
        total = len(ids)
        drain = await harness.drain_under_fault(run, total, None, 0)
        alive = harness.alive_count(run.workers)
        codes = await harness.stop_workers(run, run.workers)
        rows = await run.monitor.fetch(
            "SELECT name, status::text AS status, attempt, last_error FROM pgfleet.jobs_all "
            "WHERE name = 'poison' OR status <> 'succeeded'"
        )
        counts = await run.counts() or {}
        logs = "\n".join(w.output() for w in run.all_procs)
        excerpt = run.log_excerpt()
    problems: list[str] = []
    others_ok = counts.get("succeeded", 0)
    row.finished = f"{others_ok}/{n} (+{len(app.POISON_MESSAGES)} poison)"
    row.lost = n - others_ok
    row.drain_s = drain.drain_s
    row.alive = f"{alive}/2"
    if drain.stalled:
        problems.append(f"STALLED: {drain.stalled}")
    if row.lost:
        problems.append(f"{row.lost} ordinary jobs did not succeed")
    for r in rows or []:
        if r["name"] != "poison":
            continue
        err = r["last_error"]
        readable = (
            r["status"] in ("failed", "queued")
            and isinstance(err, str)
            and "poison" in err
            and "\x00" not in err
        )
        if not readable:
            problems.append(
                f"poison job ended {r['status']} (attempt {r['attempt']}) with error "
                f"{(err or '')[:200]!r}"
            )
        elif r["status"] == "failed":
            problems.append(
                f"poison job failed after {r['attempt']} attempts, error "
                f"{len(err)} chars: {err[:80]!r}"
            )
    if "could not write" in logs:
        problems.append("a worker could not write job outcomes")
    if codes != [0, 0]:
        problems.append(f"final SIGTERM exit codes {codes}")
    failed = bool(drain.stalled) or bool(row.lost) or "could not write" in logs or codes != [0, 0]
    failed = failed or any(pr.startswith("poison job ended") for pr in problems)
    row.verdict = "FAIL" if failed else "ok"
    row.notes = problems + (["log excerpt:\n" + excerpt] if failed else [])
    return row


# --- a sync handler that never returns ----------------------------------------------


def test_sync_handler_that_never_returns(
    chaos_cluster: PrivateCluster, chaos_results: harness.Results, tmp_path: Path
) -> None:
    row = asyncio.run(_stuck(chaos_cluster, tmp_path))
    _keep(chaos_results, "stuck-sync", row, tmp_path)
    assert row.verdict == "ok", "\n".join(row.notes)


async def _stuck(cluster: PrivateCluster, tmp_path: Path) -> Row:
    """A sync handler blocks forever (handler timeout 2 s, 2 attempts) next to async
    and sync jobs: the worker runs the rest, buries the stuck job, and SIGTERM still
    ends the process within grace + slack although the blocked thread never ends."""
    p = PROFILE
    n = 100
    row = Row("sync handler that never returns")
    database = await conftest.new_database(cluster)
    async with Run(cluster, database, tmp_path, p) as run:
        await run.start_workers(1, concurrency=8)
        requests = [
            EnqueueRequest("stuck_sync", None, EnqueueOptions(max_attempts=2)),
            *run.work_requests(n // 2),
            *[EnqueueRequest("sync_work", {"ms": 20}) for _ in range(n // 2)],
        ]
        ids = await run.enqueue(requests)
        stuck_id = ids[0]

        async def stuck_failed() -> bool:
            got = await run.monitor.fetch(
                "SELECT status::text AS s FROM pgfleet.jobs_all WHERE id = $1", stuck_id
            )
            return got is not None and len(got) > 0 and got[0]["s"] == "failed"

        drain = await harness.drain_under_fault(run, len(ids), None, 0)
        buried = await stuck_failed()
        stuck_row = await run.monitor.fetch(
            "SELECT status::text AS status, attempt, last_error FROM pgfleet.jobs_all WHERE id = $1",
            stuck_id,
        )
        counts = await run.counts() or {}
        t = time.monotonic()
        codes = await harness.stop_workers(run, run.workers)
        exit_s = time.monotonic() - t
        excerpt = run.log_excerpt()
    problems: list[str] = []
    others = counts.get("succeeded", 0)
    row.finished = f"{others}/{n} (+1 stuck)"
    row.lost = n - others
    row.drain_s = drain.drain_s
    row.alive = "1/1" if codes[0] is not None else "0/1"
    row.sigterm_exit_s = exit_s if codes[0] is not None else f"> {p.grace + p.sigterm_slack_s:.0f}"
    if drain.stalled:
        problems.append(f"STALLED: {drain.stalled}")
    if row.lost:
        problems.append(f"{row.lost} other jobs did not succeed")
    if stuck_row:
        problems.append(f"stuck job: {dict(stuck_row[0])}")
    if not buried:
        problems.append("the stuck job was not failed after its attempts timed out")
    if codes != [0]:
        problems.append(f"SIGTERM exit code {codes[0]} after {exit_s:.1f} s (None: killed)")
    failed = bool(drain.stalled) or bool(row.lost) or not buried or codes != [0]
    row.verdict = "FAIL" if failed else "ok"
    row.notes = problems + (["log excerpt:\n" + excerpt] if failed else [])
    return row


# --- five concurrent migrations ------------------------------------------------------


def test_five_concurrent_migrations(
    chaos_cluster: PrivateCluster, chaos_results: harness.Results, tmp_path: Path
) -> None:
    row = asyncio.run(_migrate(chaos_cluster, tmp_path))
    _keep(chaos_results, "migrate", row, tmp_path)
    assert row.verdict == "ok", "\n".join(row.notes)


async def _schema(dsn: str) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT c.relkind::text AS kind, c.relname::text AS name FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgfleet' "
            "UNION ALL SELECT 'migration', version::text || ' ' || name "
            "FROM pgfleet.schema_migrations ORDER BY 1, 2"
        )
        return [(r["kind"], r["name"]) for r in rows]
    finally:
        await conn.close()


async def _migrate(cluster: PrivateCluster, tmp_path: Path) -> Row:
    row = Row("5 x `pgfleet migrate` at once, fresh database")
    database = await conftest.new_database(cluster, empty=True)
    dsn = cluster.dsn(database)
    procs = [
        await start(["migrate", "--dsn", dsn], tmp_path / "logs", f"migrate{i}") for i in range(5)
    ]
    codes = [await asyncio.wait_for(pr.process.wait(), 120) for pr in procs]
    got = await _schema(dsn)
    want = await _schema(cluster.dsn(conftest.TEMPLATE))
    want = [w for w in want if w != ("r", "chaos_runs")]
    row.finished = f"{sum(c == 0 for c in codes)}/5 exit 0"
    row.alive = "—"
    problems = []
    if codes != [0] * 5:
        problems.append(f"exit codes {codes}")
        problems += [pr.output()[-1500:] for pr, c in zip(procs, codes, strict=True) if c != 0]
    if got != want:
        problems.append(
            f"schema differs from a single migrate: missing {sorted(set(want) - set(got))}, "
            f"extra {sorted(set(got) - set(want))}"
        )
    row.verdict = "ok" if not problems else "FAIL"
    row.notes = problems
    return row


# --- workflows -----------------------------------------------------------------------


def test_workflow_under_sigkill_loop(
    chaos_cluster: PrivateCluster, chaos_results: harness.Results, tmp_path: Path
) -> None:
    row = asyncio.run(_workflow(chaos_cluster, tmp_path))
    _keep(chaos_results, "workflow-sigkill", row, tmp_path)
    assert row.verdict == "ok", "\n".join(row.notes)


async def _workflow(cluster: PrivateCluster, tmp_path: Path) -> Row:
    """Trees of three levels (a root, three children, two grandchildren each) and a
    join after the six grandchildren, drained while workers are SIGKILLed in a loop:
    nothing lost, and no job started before every parent's run had ended."""
    p = PROFILE
    row = Row("workflow: 3 levels and a join, SIGKILL loop")
    database = await conftest.new_database(cluster)
    opts = EnqueueOptions(max_attempts=25)
    work = {"ms": p.job_ms}
    trees = max(p.jobs // 11, 10)
    async with Run(cluster, database, tmp_path, p) as run:
        await run.start_workers(p.workers)
        parents: dict[str, list[str]] = {}
        pool = await asyncpg.create_pool(run.direct_dsn, min_size=1, max_size=2)
        try:
            queue = pgfleet.Queue(pool)
            for _ in range(trees):
                requests = [EnqueueRequest("work", work, opts)]
                for _ in range(3):
                    requests.append(
                        EnqueueRequest("work", work, dataclasses.replace(opts, after=(0,)))
                    )
                for m in range(3):
                    for _ in range(2):
                        requests.append(
                            EnqueueRequest("work", work, dataclasses.replace(opts, after=(1 + m,)))
                        )
                requests.append(
                    EnqueueRequest(
                        "work", work, dataclasses.replace(opts, after=tuple(range(4, 10)))
                    )
                )
                ids = [str(i) for i in await queue.enqueue_many(requests)]
                for index, req in enumerate(requests):
                    parents[ids[index]] = [ids[int(a)] for a in req.options.after]
        finally:
            await pool.close()
        total = len(parents)
        drain = await harness.drain_under_fault(run, total, fault_sigkill, total // 3)
        await run.victim_done()
        live = run.live_workers()
        codes = await harness.stop_workers(run, live)
        tally = await run.monitor.fetch(
            "SELECT count(*) FILTER (WHERE status = 'succeeded') AS done, "
            "count(*) FILTER (WHERE status <> 'succeeded') AS lost FROM pgfleet.jobs_all"
        )
        starts = run.executions()
        ends: dict[str, float] = {}
        for f in run.runs_dir.glob("runs-*.log"):
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) == 5 and parts[0] == "E":
                    ends[parts[1]] = max(ends.get(parts[1], 0.0), float(parts[4]))
    problems = list(run.notes)
    assert tally is not None
    row.finished = f"{tally[0]['done']}/{total}"
    row.lost = int(tally[0]["lost"])
    row.drain_s = drain.drain_s
    row.ran_twice = sum(1 for r in starts.values() if len(r) > 1)
    early = [
        job
        for job, ps in parents.items()
        if job in starts
        and any(starts[job][0][0] < ends.get(parent, float("inf")) for parent in ps)
    ]
    never_ran = set(parents) - set(starts)
    if drain.stalled:
        problems.append(f"STALLED: {drain.stalled}")
    if row.lost:
        problems.append(f"LOST {row.lost} jobs")
    if never_ran:
        problems.append(f"{len(never_ran)} jobs never ran")
    if early:
        problems.append(f"{len(early)} jobs started before a parent had ended, e.g. {early[:3]}")
    failed = bool(drain.stalled or row.lost or never_ran or early)
    if any(c != 0 for c in codes):
        problems.append(f"final SIGTERM exit codes {codes}")
    row.verdict = "FAIL" if failed else "ok"
    row.notes = problems
    return row


def test_batch_callback_once_across_a_postgres_restart(
    chaos_cluster: PrivateCluster, chaos_results: harness.Results, tmp_path: Path
) -> None:
    row = asyncio.run(_batch_restart(chaos_cluster, tmp_path))
    _keep(chaos_results, "batch-restart", row, tmp_path)
    assert row.verdict == "ok", "\n".join(row.notes)


async def fault_restart_only(run: Run) -> None:
    await asyncio.to_thread(run.cluster.restart, "fast")
    run.healed_at = time.monotonic()


async def _batch_restart(cluster: PrivateCluster, tmp_path: Path) -> Row:
    """A batch of the profile's job count with a callback, Postgres restarted once a
    third of it finished: every member succeeded and ran, the callback's row is the
    only one added, it became due with the whole batch's outcome and ran once, after
    every member's run had ended."""
    p = PROFILE
    row = Row("batch with a callback, Postgres restart (fast)")
    database = await conftest.new_database(cluster)
    opts = EnqueueOptions(max_attempts=25)
    work = {"ms": p.job_ms}
    async with Run(cluster, database, tmp_path, p) as run:
        await run.start_workers(p.workers)
        pool = await asyncpg.create_pool(run.direct_dsn, min_size=1, max_size=2)
        try:
            batch_id, member_ids = await pgfleet.Queue(pool).enqueue_batch(
                [EnqueueRequest("work", work, opts) for _ in range(p.jobs)],
                callback=EnqueueRequest("work", {"ms": 1}, opts),
            )
        finally:
            await pool.close()
        members = {str(i) for i in member_ids}
        callback = str(batch_id)
        total = len(members) + 1
        drain = await harness.drain_under_fault(run, total, fault_restart_only, total // 3)
        live = run.live_workers()
        codes = await harness.stop_workers(run, live)
        tally = await run.monitor.fetch(
            "SELECT count(*) AS rows, "
            "count(*) FILTER (WHERE status = 'succeeded') AS done FROM pgfleet.jobs_all"
        )
        outcome = await run.monitor.fetch(
            "SELECT payload->'batch' AS batch FROM pgfleet.jobs_all WHERE id = $1", batch_id
        )
        starts = run.executions()
        ends: dict[str, float] = {}
        for f in run.runs_dir.glob("runs-*.log"):
            for line in f.read_text().splitlines():
                parts = line.split()
                if len(parts) == 5 and parts[0] == "E":
                    ends[parts[1]] = max(ends.get(parts[1], 0.0), float(parts[4]))
    problems = list(run.notes)
    assert tally is not None
    row.finished = f"{tally[0]['done']}/{total}"
    row.lost = int(tally[0]["rows"]) - int(tally[0]["done"])
    row.drain_s = drain.drain_s
    row.recover_s = drain.recover_s
    row.ran_twice = sum(1 for r in starts.values() if len(r) > 1)
    never_ran = members - set(starts)
    callback_runs = starts.get(callback, [])
    last_member_end = max((ends.get(m, float("inf")) for m in members), default=float("inf"))
    raw = outcome[0]["batch"] if outcome else None
    batch = json.loads(raw) if isinstance(raw, str) else raw
    if run.fault_started is None or run.healed_at is None:
        problems.append("the restart never happened")
    if drain.stalled:
        problems.append(f"STALLED: {drain.stalled}")
    if row.lost:
        problems.append(f"LOST {row.lost} jobs")
    if int(tally[0]["rows"]) != total:
        problems.append(f"{tally[0]['rows']} job rows, {total} enqueued")
    if never_ran:
        problems.append(f"{len(never_ran)} members never ran")
    if len(callback_runs) != 1:
        problems.append(f"the callback ran {len(callback_runs)} times: {callback_runs}")
    elif callback_runs[0][0] < last_member_end:
        problems.append("the callback started before every member's run had ended")
    want = {"size": p.jobs, "succeeded": p.jobs, "failed": 0, "cancelled": 0}
    if not isinstance(batch, dict) or {k: batch.get(k) for k in want} != want:
        problems.append(f"the callback's batch outcome is {batch}, not {want}")
    if any(c != 0 for c in codes):
        problems.append(f"final SIGTERM exit codes {codes}")
    row.verdict = "FAIL" if problems[len(run.notes) :] else "ok"
    row.notes = problems
    return row
