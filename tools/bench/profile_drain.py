"""Where one drain's cost goes, per job: statements, tuples, WAL records, Python.

    python -m tools.bench.profile_drain --dsn postgresql://postgres@127.0.0.1:5432/postgres \\
        --contender pgfleet --concurrency 16 --jobs 200000 [--py-spy out.txt] [--explain]

Queues ``--jobs`` no-op jobs in a scratch database (``--database``, dropped after),
drains them with one contender (``pgfleet``: the in-process ``Worker`` of
``make bench-peers``; ``graphile-default``/``graphile-batched``: graphile-worker's
``runOnce``, see tools/bench/graphile.py) and prints, per job:

- the database's transactions and tuple writes (``pg_stat_database`` and the
  queue table's ``pg_stat_user_tables``: updates, HOT updates, deletes);
- pgfleet's claim rounds (calls of ``Store.job_complete_and_claim``, counted by a
  wrapper installed here: outcomes and jobs per round) or graphile-worker's
  statements by name (counted inside its process);
- the WAL it wrote: the LSN difference, and with ``pg_waldump`` (when the server's
  WAL directory is readable here: same host, enough rights) the records of this
  database by resource manager, operation and relation, with full-page images,
  and the commit records of its transactions (a temporary replication slot of
  the profiler's own session keeps that WAL from being recycled meanwhile);
- with ``--py-spy FILE``: py-spy (``pip install py-spy``) samples this process
  during the drain alone (raw collapsed stacks into FILE; ``--py-spy-native`` for
  the C frames too) and the busiest functions are listed, by own time, by source
  file and by time inside them;
- with ``--explain``: EXPLAIN (ANALYZE, BUFFERS, WAL) of pgfleet's claim round,
  rolled back, on a representative round (``--explain-limit`` jobs claimed,
  as many outcomes written).

A CHECKPOINT precedes the drain (as in bench-peers) so that full-page images are
counted alike; as there, the queue is neither vacuumed nor analysed after its fill
unless ``--vacuum`` says so. Run it under ``flock /tmp/pgfleet-bench.lock`` like any benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from pgfleet import create_pool
from pgfleet.db import store as store_module
from tools.bench import graphile, rawsql
from tools.bench import suite as fb
from tools.devkit import drop_database

WALDUMP = "/usr/lib/postgresql/15/bin/pg_waldump"

DB_STATS = (
    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, "
    "blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database()"
)
TABLE_STATS = (
    "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables "
    "WHERE schemaname = $1 AND relname = $2"
)
CLEAR_SNAPSHOT = "SELECT pg_stat_clear_snapshot()"
DATABASE_OID = "SELECT oid FROM pg_database WHERE datname = current_database()"
FILENODES = (
    "SELECT pg_relation_filenode(c.oid)::text AS node, n.nspname || '.' || c.relname AS name "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE pg_relation_filenode(c.oid) IS NOT NULL"
)
WAL_DIR = "SELECT current_setting('data_directory') || '/pg_wal'"

_RECORD = re.compile(
    r"rmgr: (\S+)\s+len \(rec/tot\):\s*(\d+)/\s*(\d+), tx:\s*(\d+), .*?desc: (\S+)(.*)$"
)
_BLOCK = re.compile(r"blkref #\d+: rel \d+/(\d+)/(\d+)(?: fork \w+)? blk \d+( FPW)?")


async def _snapshot(conn: Any, table: tuple[str, str]) -> dict[str, int]:
    await conn.execute(CLEAR_SNAPSHOT)
    db = dict(await conn.fetchrow(DB_STATS))
    tab = await conn.fetchrow(TABLE_STATS, *table)
    return {**db, **(dict(tab) if tab else {})}


async def _settled_snapshot(conn: Any, table: tuple[str, str]) -> dict[str, int]:
    """Backends report their counters at most once a second: read until they stop moving."""
    last = await _snapshot(conn, table)
    for _ in range(10):
        await asyncio.sleep(1.1)
        now = await _snapshot(conn, table)
        if now == last:
            return now
        last = now
    return last


class Rounds:
    """Counts pgfleet's claim rounds by wrapping Store.job_complete_and_claim."""

    def __init__(self) -> None:
        self.calls = 0
        self.outcomes = 0
        self.claimed = 0
        self.sizes: collections.Counter[int] = collections.Counter()
        self.seconds = 0.0

    @contextlib.contextmanager
    def installed(self) -> Any:
        original = store_module.Store.job_complete_and_claim

        async def counted(store: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            rows = await original(store, **kwargs)
            self.seconds += time.perf_counter() - start
            self.calls += 1
            self.outcomes += len(kwargs["ids"])
            claimed = sum(1 for r in rows if r["claimed"])
            self.claimed += claimed
            self.sizes[_bucket(claimed)] += 1
            return rows

        store_module.Store.job_complete_and_claim = counted  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            store_module.Store.job_complete_and_claim = original  # type: ignore[method-assign]


def _bucket(n: int) -> int:
    for edge in (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        if n <= edge:
            return edge
    return 4096


def waldump(
    start: str, end: str, wal_dir: str, db_oid: int, names: dict[str, str]
) -> dict[str, Any] | None:
    """This database's WAL records between two LSNs, by (rmgr, op, relation), plus the
    commit records of the transactions that wrote them. None when pg_waldump cannot
    read the WAL here."""
    binary = shutil.which("pg_waldump") or WALDUMP
    if not Path(binary).exists() or not os.access(wal_dir, os.R_OK):
        return None
    proc = subprocess.Popen(
        [binary, "-p", wal_dir, "-s", start, "-e", end],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ours = str(db_oid)
    groups: dict[tuple[str, str, str], list[int]] = {}
    xids: set[str] = set()
    commits: dict[str, tuple[int, int]] = {}
    others = [0, 0]
    for line in proc.stdout:
        m = _RECORD.match(line)
        if m is None:
            continue
        rmgr, _rec, tot, xid, op, rest = m.groups()
        blocks = _BLOCK.findall(rest)
        size = int(tot)
        if rmgr == "Transaction":
            commits[xid] = (commits.get(xid, (0, 0))[0] + 1, commits.get(xid, (0, 0))[1] + size)
            continue
        if not blocks:
            if xid in xids:
                key = (rmgr, op, "-")
                g = groups.setdefault(key, [0, 0, 0])
                g[0] += 1
                g[1] += size
            else:
                others[0] += 1
                others[1] += size
            continue
        if blocks[0][0] != ours:
            others[0] += 1
            others[1] += size
            continue
        if xid != "0":
            xids.add(xid)
        rel = names.get(blocks[0][1], f"filenode {blocks[0][1]}")
        g = groups.setdefault((rmgr, op, rel), [0, 0, 0])
        g[0] += 1
        g[1] += size
        g[2] += sum(1 for b in blocks if b[2])
    proc.wait()
    commit_n = sum(commits[x][0] for x in xids if x in commits)
    commit_b = sum(commits[x][1] for x in xids if x in commits)
    groups[("Transaction", "COMMIT", "-")] = [commit_n, commit_b, 0]
    return {
        "groups": groups,
        "other_records": others[0],
        "other_bytes": others[1],
        "error": (proc.stderr.read().strip()[-300:] if proc.stderr else "")
        if proc.returncode
        else "",
    }


_IDLE = ("epoll_wait", "wait4", "_do_waitpid", "select (selectors.py)")


def summarize_py_spy(path: Path, top: int = 25) -> str:
    """Own and inclusive shares of the busiest functions in py-spy's raw output, and
    own time by source file. Samples waiting in epoll or for a child (the event
    loop idle, asyncio's child watcher thread: py-spy --native counts them as busy)
    are set apart."""
    own: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    files: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        if any(mark in stack for mark in _IDLE):
            idle += n
            continue
        total += n
        raw = stack.split(";")
        frames = [_frame(f) for f in raw]
        own[frames[-1]] += n
        files[_source(raw)] += n
        for f in set(frames):
            inside[f] += n
    if not total:
        return "py-spy recorded no busy samples"
    lines = [
        f"py-spy: {total} busy samples of the drain ({idle} more idle in epoll/wait4)",
        "  own time:",
    ]
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines.append("  own time by source (the innermost Python file, or native library):")
    lines += [f"    {100 * n / total:5.1f}%  {f}" for f, n in files.most_common(top)]
    lines.append("  time inside (inclusive; frames under 90% of samples):")
    lines += [
        f"    {100 * n / total:5.1f}%  {f}"
        for f, n in inside.most_common(top + 15)
        if n < 0.9 * total
    ][:top]
    return "\n".join(lines)


def _source(frames: list[str]) -> str:
    """Where the innermost Python frame of a stack lives (pgfleet/_runtime/x.py,
    asyncio/x.py, asyncpg ...), native frames charged to it."""
    for frame in reversed(frames):
        m = re.match(r".* \((.*?\.pyx?)(?::\d+)?\)$", frame)
        if m is None:
            continue
        path = m.group(1)
        for anchor in ("pgfleet/", "asyncpg/", "asyncio/", "tools/"):
            if anchor in path:
                return anchor + path.split(anchor, 1)[1]
        return Path(path).name
    return _frame(frames[-1])


def _frame(frame: str) -> str:
    # "function (path/to/file.py:123)" -> "function (file.py)"; native frames as they are.
    m = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if m is None:
        return frame
    return f"{m.group(1)} ({Path(m.group(2)).name})"


@contextlib.asynccontextmanager
async def py_spy(output: Path | None, native: bool = False) -> Any:
    """py-spy sampling this process while the block runs. Python frames only, without
    pausing the process (``--nonblocking``, 250 samples a second), or with
    ``native`` the C frames too (asyncpg's Cython, the interpreter): py-spy must then
    pause the process for each sample (100 a second), and its samples land in
    system calls more often than the time spent there (getpid, send, recv)."""
    if output is None:
        yield
        return
    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    mode = ["--native", "--rate", "100"] if native else ["--nonblocking", "--rate", "250"]
    proc = await asyncio.create_subprocess_exec(
        binary,
        "record",
        "--pid",
        str(os.getpid()),
        *mode,
        "--format",
        "raw",
        "--output",
        str(output),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    await asyncio.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = await proc.communicate()
        if not await asyncio.to_thread(output.exists):
            print(f"py-spy wrote nothing: {err.decode()[-500:]}")


RESERVE_WAL = "SELECT pg_create_physical_replication_slot($1, true, true) IS NOT NULL"


async def _reserve_wal(conn: Any) -> bool:
    """A temporary physical replication slot reserving WAL from now on, dropped when
    this session ends (however it ends). False where that is not allowed."""
    try:
        return bool(await conn.fetchval(RESERVE_WAL, f"pgfleet_profile_{os.getpid()}"))
    except asyncpg.PostgresError as exc:
        print(f"(no temporary replication slot: {exc}; pg_waldump may miss recycled WAL)")
        return False


async def _drain_pgfleet(pool: Any, concurrency: int, *, remove: bool) -> None:
    """The drain of bench-peers' pgfleet (``remove``: pgfleet-noretain's, a worker
    that removes succeeded jobs at completion)."""
    if not remove:
        await fb._drain_in_process(pool, concurrency)
        return
    import dataclasses

    from pgfleet import Worker

    config = dataclasses.replace(fb._bench_config(concurrency), remove_succeeded_jobs=True)
    await Worker(pool, fb._noop_registry(), config).run(burst=True)


async def _explain_round(dsn: str, limit: int, action: str = "succeeded") -> str:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) of one claim round that writes ``limit``
    outcomes and claims ``limit`` jobs (their first ``limit`` start now), rolled back."""
    from pgfleet.db.queries import Q

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "SET enable_bitmapscan = off; SET enable_seqscan = off; "
            "SET plan_cache_mode = force_generic_plan; SET jit = off"
        )
        worker = uuid.uuid4()

        def args(ids: list[Any], tokens: list[Any]) -> tuple[Any, ...]:
            return (
                ids,
                tokens,
                [action] * len(ids),
                [0.0] * len(ids),
                [None] * len(ids),
                worker,
                ["noop"],
                None,
                limit,
                limit,
                [],
                [None] * len(ids),
                None,  # no results: the round's results go as one text
            )

        tr = conn.transaction()
        await tr.start()
        try:
            # A first round claims the jobs whose outcomes the explained round writes.
            rows = await conn.fetch(Q.job_complete_and_claim.sql, *args([], []))
            ids = [r["id"] for r in rows if r["claimed"]]
            tokens = [r["lock_token"] for r in rows if r["claimed"]]
            plan = await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS, WAL, VERBOSE OFF, COSTS OFF) "
                + Q.job_complete_and_claim.sql,
                *args(ids, tokens),
            )
        finally:
            await tr.rollback()
        return "\n".join(r[0] for r in plan)
    finally:
        await conn.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    dsn = await fb._fresh_database(args.dsn, args.database)
    install = None
    try:
        if args.contender.startswith("graphile"):
            install = await asyncio.to_thread(graphile.provision)
            await graphile.setup(install, dsn)
            table = ("graphile_worker", "_private_jobs")
        else:
            table = ("pgfleet", "jobs")
        pool = await create_pool(dsn, min_size=4, max_size=8)
        admin = await asyncpg.connect(dsn)
        try:
            if install is None:
                if args.fillfactor is not None:
                    # An experiment: the jobs table's fill factor for the pages the
                    # fill writes (migration 0001 sets 90).
                    await admin.execute(
                        f"ALTER TABLE pgfleet.jobs SET (fillfactor = {int(args.fillfactor)})"
                    )
                await fb._fill(pool, args.jobs)
            else:
                await pool.execute(graphile.ENSURE_TASK)
                await pool.execute(graphile.FILL, args.jobs)
            if args.vacuum:
                await admin.execute("VACUUM (ANALYZE) " + ".".join(table))
            explain = (
                await _explain_round(
                    dsn,
                    args.explain_limit,
                    "remove" if args.contender == "pgfleet-noretain" else "succeeded",
                )
                if args.explain
                else None
            )
            db_oid = await admin.fetchval(DATABASE_OID)
            names = {r["node"]: r["name"] for r in await admin.fetch(FILENODES)}
            wal_dir = await admin.fetchval(WAL_DIR)
            await admin.execute(rawsql.CHECKPOINT)
            # The WAL of the drain must outlive the checkpoints of others (this
            # server's neighbours checkpoint too) until pg_waldump has read it: a
            # temporary slot of this session keeps it, and goes with the session.
            slot = await _reserve_wal(admin)
            before = await _settled_snapshot(admin, table)
            lsn0 = await admin.fetchval(rawsql.WAL_LSN)
            rounds = Rounds()
            queries: dict[str, int] = {}
            started = time.perf_counter()
            if install is None:
                with rounds.installed():
                    async with py_spy(args.py_spy, args.py_spy_native):
                        started = time.perf_counter()
                        await _drain_pgfleet(
                            pool, args.concurrency, remove=args.contender == "pgfleet-noretain"
                        )
            else:
                mode = args.contender.removeprefix("graphile-")
                async with graphile.child(
                    install,
                    dsn,
                    "drain",
                    str(args.concurrency),
                    mode,
                    env={"PGFLEET_GRAPHILE_COUNT_QUERIES": "1"},
                ) as c:
                    started = time.perf_counter()
                    await c.run()
                    queries = c.report.get("queries", {})
            elapsed = time.perf_counter() - started
            lsn1 = await admin.fetchval(rawsql.WAL_LSN)
            wal = float(await admin.fetchval(rawsql.WAL_SINCE, lsn0))
            await pool.close()
            after = await _settled_snapshot(admin, table)
            dump = await asyncio.to_thread(waldump, lsn0, lsn1, wal_dir, db_oid, names)
        finally:
            await admin.close()
            with contextlib.suppress(Exception):
                await pool.close()
    finally:
        if not args.keep:
            await drop_database(args.dsn, args.database)
    n = args.jobs
    out: dict[str, Any] = {
        "contender": args.contender,
        "concurrency": args.concurrency,
        "jobs": n,
        "jobs_per_s": n / elapsed,
        "per_job": {k: (after[k] - before.get(k, 0)) / n for k in after},
        "wal_bytes_per_job_server_wide": wal / n,
        "wal_reserved_by_temporary_slot": slot,
    }
    lines = [
        f"{args.contender} at concurrency {args.concurrency}: {n:,} jobs in {elapsed:.2f} s "
        f"({n / elapsed:,.0f} jobs/s)",
        "per job: "
        + ", ".join(f"{k} {v:.3f}" for k, v in out["per_job"].items() if not k.startswith("blks"))
        + f"; buffers hit {out['per_job']['blks_hit']:.1f}",
        f"WAL (server-wide LSN difference): {wal / n:,.0f} bytes per job, {wal / 2**20:,.1f} MiB",
    ]
    if install is None:
        out["rounds"] = {
            "calls": rounds.calls,
            "per_job": rounds.calls / n,
            "outcomes_per_round": rounds.outcomes / max(1, rounds.calls),
            "claimed_per_round": rounds.claimed / max(1, rounds.calls),
            "seconds_in_rounds": rounds.seconds,
            "claimed_histogram": dict(sorted(rounds.sizes.items())),
        }
        r = out["rounds"]
        lines.append(
            f"claim rounds: {r['calls']:,} ({r['per_job']:.4f} per job), "
            f"{r['outcomes_per_round']:.1f} outcomes and {r['claimed_per_round']:.1f} jobs "
            f"claimed per round; {r['seconds_in_rounds']:.2f} s awaiting rounds; "
            f"claimed per round (<= bucket: rounds) {r['claimed_histogram']}"
        )
    else:
        out["queries"] = queries
        lines.append("statements sent by graphile-worker (per job):")
        for name, count in sorted(queries.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {count:>9,} ({count / n:.4f})  {name}")
    if dump is not None:
        groups = dump["groups"]
        total_b = sum(g[1] for g in groups.values())
        total_r = sum(g[0] for g in groups.values())
        out["wal_records"] = {
            " ".join(k): {"records_per_job": g[0] / n, "bytes_per_job": g[1] / n, "fpi": g[2]}
            for k, g in groups.items()
        }
        lines.append(
            f"WAL of this database (pg_waldump): {total_r / n:.2f} records, "
            f"{total_b / n:,.0f} bytes per job; other databases meanwhile: "
            f"{dump['other_bytes'] / 2**20:,.1f} MiB"
        )
        if dump["error"]:
            # pg_waldump stops where a segment is gone (recycled after a checkpoint):
            # the breakdown then covers part of the drain only.
            lines.append(f"  pg_waldump stopped early, the counts are partial: {dump['error']}")
        lines.append("  records/job  bytes/job  FPIs  rmgr op relation")
        for key, g in sorted(groups.items(), key=lambda kv: -kv[1][1]):
            if g[1] / n < 0.5:
                continue
            lines.append(f"  {g[0] / n:11.3f}  {g[1] / n:9.1f}  {g[2]:5d}  {' '.join(key)}")
    else:
        lines.append("(pg_waldump cannot read the server's WAL here: records not broken down)")
    if explain:
        out["explain"] = explain
        lines.append(f"EXPLAIN (ANALYZE, BUFFERS, WAL) of a claim round of {args.explain_limit}:")
        lines.append(explain)
    if args.py_spy is not None and args.py_spy.exists():
        summary = summarize_py_spy(args.py_spy)
        out["py_spy"] = summary
        lines.append(summary)
    print("\n".join(lines), flush=True)
    return out


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGFLEET_BENCH_DSN"))
    parser.add_argument("--database", default="pgfleet_profile")
    parser.add_argument(
        "--contender",
        default="pgfleet",
        choices=("pgfleet", "pgfleet-noretain", "graphile-default", "graphile-batched"),
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--py-spy", type=Path, help="record the drain with py-spy into this file")
    parser.add_argument(
        "--py-spy-native",
        action="store_true",
        help="with the C frames (pauses the process per sample; system calls over-sampled)",
    )
    parser.add_argument(
        "--vacuum",
        action="store_true",
        help="VACUUM (ANALYZE) the filled queue before the drain (bench-peers does not)",
    )
    parser.add_argument(
        "--fillfactor",
        type=int,
        choices=range(10, 101),
        metavar="10..100",
        help="pgfleet: set pgfleet.jobs' fill factor before the fill (an experiment)",
    )
    parser.add_argument("--explain", action="store_true", help="EXPLAIN a claim round first")
    parser.add_argument("--explain-limit", type=int, default=1024)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--json", type=Path)
    fb.add_loop_argument(parser)
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("--dsn (or PGFLEET_BENCH_DSN) is required")
    fb.install_loop(args.loop)
    out = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    cli()
