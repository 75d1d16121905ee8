"""Page render times of the operator console on a table of retained jobs.

    python -m tools.console_bench                      # 1M jobs in a scratch database
    python -m tools.console_bench --jobs 200000 --rounds 20 --json out.json

Creates (or reuses, with --keep) the database ``pgfleet_console_bench`` on the server
of ``--dsn`` (default: PGFLEET_BENCH_DSN or 127.0.0.1:5432), fills ``pgfleet.jobs``
with a realistic history (mostly succeeded, some dead, cancelled, queued, scheduled
and running jobs over 30 days, eight job names, a few named queues), then serves the
console in this process and times every page over real HTTP: the server's own render
time (its Server-Timing header) and the wall time the client saw. It reports; it
asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tools.devkit import drop_database, fresh_database, with_database

DEFAULT_DSN = os.environ.get("PGFLEET_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
DATABASE = "pgfleet_console_bench"
TOKEN = "console-bench-token-6Jd3qXw9Lk2"

# A UUIDv7 from a timestamp and a row number: 48 bits of milliseconds, version 7,
# variant 10, the rest from md5 of the row number (unique enough for a benchmark).
_SEED = """
INSERT INTO pgfleet.jobs (id, name, payload, status, attempt, max_attempts, priority,
                          queue_name, run_at, created_at, started_at, finished_at,
                          last_error, locked_by, lock_token)
SELECT (lpad(to_hex((extract(epoch FROM t.created) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid,
       t.job_name,
       jsonb_build_object('n', i, 'note', 'benchmark row'),
       t.status::pgfleet.job_status,
       CASE t.status WHEN 'queued' THEN 0 WHEN 'failed' THEN 5 ELSE 1 END,
       5,
       0,
       CASE WHEN i % 50 = 0 THEN 'tenant-' || (i % 7) END,
       CASE WHEN t.status = 'queued' AND i % 3 = 0 THEN now() + interval '1 hour'
            ELSE t.created END,
       t.created,
       CASE WHEN t.status IN ('succeeded', 'failed', 'running') THEN t.created END,
       CASE WHEN t.status IN ('succeeded', 'failed', 'cancelled')
            THEN t.created + interval '2 seconds' END,
       CASE WHEN t.status = 'failed' THEN 'RuntimeError: upstream said no (row ' || i || ')' END,
       CASE WHEN t.status = 'running' THEN '00000000-0000-4000-8000-000000000001'::uuid END,
       CASE WHEN t.status = 'running' THEN gen_random_uuid() END
FROM generate_series(1, $1::int) AS i,
LATERAL (
    SELECT now() - make_interval(secs => 30 * 86400.0 * ($1::int - i) / $1::int) AS created,
           (ARRAY['send_email', 'resize_image', 'sync_prices', 'charge_card', 'webhook',
                  'report', 'cleanup', 'rare_job'])[
               CASE WHEN i % 1000 = 0 THEN 8 ELSE 1 + (i::bigint * 7919 % 7)::int END] AS job_name,
           CASE WHEN i > $1::int - 20 AND i % 2 = 0 THEN 'running'
                WHEN i % 100 < 2 THEN 'failed'
                WHEN i % 100 = 2 THEN 'cancelled'
                WHEN i % 100 = 3 AND i > $1::int * 0.9 THEN 'queued'
                ELSE 'succeeded' END AS status
) AS t
"""


async def prepare(admin_dsn: str, jobs: int, keep: bool) -> str:
    dsn = with_database(admin_dsn, DATABASE)
    admin = await asyncpg.connect(admin_dsn)
    try:
        exists = await admin.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
        if exists and keep:
            conn = await asyncpg.connect(dsn)
            try:
                have = await conn.fetchval("SELECT count(*) FROM pgfleet.jobs")
            finally:
                await conn.close()
            if have == jobs:
                print(f"reusing {DATABASE}: {have} jobs", flush=True)
                return dsn
    finally:
        await admin.close()
    conn = await asyncpg.connect(await fresh_database(admin_dsn, DATABASE))
    try:
        await conn.execute(
            "INSERT INTO pgfleet.workers (id, hostname, pid, concurrency, job_names, version,"
            " expires_at) VALUES ('00000000-0000-4000-8000-000000000001', 'bench-host', 1, 16,"
            " ARRAY['send_email'], 'bench', now() + interval '1 day')"
        )
        started = time.perf_counter()
        await conn.execute(_SEED, jobs)
        await conn.execute("VACUUM (ANALYZE) pgfleet.jobs")
        print(f"seeded {jobs} jobs in {time.perf_counter() - started:.1f}s", flush=True)
    finally:
        await conn.close()
    return dsn


async def pages(dsn: str) -> list[tuple[str, str]]:
    """The pages to time: (label, path), with real ids from the seeded table."""
    conn = await asyncpg.connect(dsn)
    try:
        dead = await conn.fetchval(
            "SELECT id FROM pgfleet.jobs WHERE status = 'failed' ORDER BY id LIMIT 1 OFFSET 500"
        )
        middle = await conn.fetchval(
            "SELECT id FROM pgfleet.jobs ORDER BY id LIMIT 1 OFFSET (SELECT count(*) / 2 "
            "FROM pgfleet.jobs)"
        )
    finally:
        await conn.close()
    return [
        ("overview", "/ui/"),
        ("jobs, newest", "/ui/jobs"),
        ("jobs, page from the middle", f"/ui/jobs?before={middle}"),
        ("jobs, dead", "/ui/jobs?status=failed"),
        ("jobs, dead of one name", "/ui/jobs?status=failed&name=charge_card"),
        ("jobs, rare name (0.1%)", "/ui/jobs?name=rare_job"),
        ("jobs, named queue", "/ui/jobs?queue=tenant-3"),
        ("jobs, queued", "/ui/jobs?status=queued"),
        ("jobs, running", "/ui/jobs?status=running"),
        ("jobs, one day a week ago", "/ui/jobs?from=" + _days_ago(8) + "&to=" + _days_ago(7)),
        ("jobs, dead, a week ago", "/ui/jobs?status=failed&to=" + _days_ago(7)),
        ("job", f"/ui/jobs/{dead}"),
        ("bulk retry confirmation", "/ui/bulk?action=retry&name=send_email"),
        ("workers", "/ui/workers"),
        ("crons", "/ui/crons"),
    ]


def _days_ago(days: int) -> str:
    from datetime import UTC, datetime, timedelta

    return (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M")


async def measure(dsn: str, rounds: int) -> list[dict[str, Any]]:
    from aiohttp import web

    import pgfleet
    from pgfleet.service.access import AccessConfig, Gate
    from pgfleet.service.console.app import Console, ConsoleConfig
    from pgfleet.service.credentials import load

    console = Console(ConsoleConfig(), Gate(AccessConfig(load(entries=f"bench:operator:{TOKEN}"))))
    app = web.Application()
    await console.attach(app, dsn)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}"
    results = []
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
            await _login(session, base)
            for label, path in await pages(dsn):
                server, wall = [], []
                for _ in range(rounds + 1):
                    started = time.perf_counter()
                    async with session.get(base + path, allow_redirects=False) as resp:
                        await resp.read()
                        if resp.status != 200:
                            raise SystemExit(f"{path}: HTTP {resp.status}")
                        timing = resp.headers.get("Server-Timing", "")
                    wall.append((time.perf_counter() - started) * 1000)
                    server.append(float(timing.rpartition("dur=")[2] or "nan"))
                server, wall = server[1:], wall[1:]  # the first round warms caches
                results.append(
                    {
                        "page": label,
                        "path": path,
                        "server_ms_median": statistics.median(server),
                        "server_ms_max": max(server),
                        "wall_ms_median": statistics.median(wall),
                        "wall_ms_max": max(wall),
                    }
                )
    finally:
        await runner.cleanup()
    del pgfleet
    return results


async def _login(session: aiohttp.ClientSession, base: str) -> None:
    from pgfleet.service.console.auth import LOGIN_CSRF_FIELD

    async with session.get(f"{base}/ui/login") as resp:
        text = await resp.text()
    marker = f'name="{LOGIN_CSRF_FIELD}" value="'
    csrf = text.split(marker, 1)[1].split('"', 1)[0]
    form = {"token": TOKEN, LOGIN_CSRF_FIELD: csrf, "next": "/ui/"}
    async with session.post(f"{base}/ui/login", data=form, allow_redirects=False) as resp:
        if resp.status != 303:
            raise SystemExit(f"login failed: HTTP {resp.status}")


def report(results: list[dict[str, Any]], jobs: int) -> str:
    lines = [
        f"console page render times, {jobs} retained jobs (ms; median and max of the rounds)",
        f"{'page':<30} {'server med':>10} {'server max':>10} {'wall med':>9} {'wall max':>9}",
    ]
    for r in results:
        lines.append(
            f"{r['page']:<30} {r['server_ms_median']:>10.1f} {r['server_ms_max']:>10.1f} "
            f"{r['wall_ms_median']:>9.1f} {r['wall_ms_max']:>9.1f}"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    dsn = await prepare(args.dsn, args.jobs, args.keep)
    results = await measure(dsn, args.rounds)
    print(report(results, args.jobs))
    if args.json:
        text = json.dumps({"jobs": args.jobs, "rounds": args.rounds, "pages": results}, indent=2)
        await asyncio.to_thread(Path(args.json).write_text, text + "\n", "utf-8")
    if not args.keep:
        await drop_database(args.dsn, DATABASE)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.console_bench", description=__doc__)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="a server to create the database on")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="retained jobs (default 1M)")
    parser.add_argument("--rounds", type=int, default=10, help="requests per page (default 10)")
    parser.add_argument("--keep", action="store_true", help="keep (and reuse) the database")
    parser.add_argument("--json", help="also write the results to this file")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
