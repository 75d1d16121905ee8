"""The capacity-planning report: Locust's CSVs and the harness's database samples
of one results directory, as ``report.md`` with matplotlib plots beside it.

    python -m loadtest.report loadtest/results/<run> [--out DIR]

Also writes ``summary.json``: the headline numbers and the consistency checks
(every job Locust counted was committed and, where workers ran, done; no request
failed), which the smoke test reads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from loadtest import autoscale, locustcsv

#: A soak shorter than this cannot see pruning and vacuum (each every 60 s) settle.
MIN_SOAK_SECONDS = 180

MODE_STYLE = {
    "transaction": ("tab:red", "o", "notify per commit"),
    "coalesced": ("tab:blue", "s", "coalesced notify"),
    "off": ("tab:green", "^", "no notify"),
    "external": ("tab:gray", "x", "external API"),
}


@dataclass
class Report:
    results: Path
    out: Path
    lines: list[str] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    headline: dict[str, Any] = field(default_factory=dict)
    plots: list[str] = field(default_factory=list)

    def add(self, *text: str) -> None:
        self.lines.extend(text)

    def check(self, what: str, ok: bool, detail: str) -> None:
        self.checks.append({"what": what, "ok": bool(ok), "detail": detail})

    def figure(self, fig: Any, name: str, alt: str) -> None:
        fig.tight_layout()
        fig.savefig(self.out / name, dpi=110)
        plt.close(fig)
        self.plots.append(name)
        self.add(f"![{alt}]({name})", "")


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.0f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*out, ""]


@dataclass(frozen=True)
class Plateau:
    """Where a throughput curve flattens, robust to one lucky point."""

    level: float  # the median of the points from ``start`` on
    start: float  # the first x whose y reaches ``share`` of the best
    best: float  # the best single point
    best_at: float


def plateau(xs: Sequence[float], ys: Sequence[float], share: float = 0.8) -> Plateau:
    best = max(ys)
    best_at = xs[ys.index(best)] if isinstance(ys, list) else xs[list(ys).index(best)]
    start = next(i for i, y in enumerate(ys) if y >= share * best)
    level = statistics.median(ys[start:])
    return Plateau(level, xs[start], best, best_at)


# ------------------------------------------------------------------ header


def header(rep: Report, run: dict[str, Any]) -> None:
    machine = run.get("machine", {})
    pg = run.get("postgres", {})
    settings = pg.get("settings", {})
    rep.add(
        "# pgfleet capacity-planning report",
        "",
        f"Run {run.get('started', '?')} - {run.get('finished', '?')}, profile "
        f"`{run.get('profile')}`, fleet `{run.get('fleet')}`, Postgres from "
        f"{run.get('postgres_source')}.",
        "",
        f"- **Machine:** {machine.get('cores')} cores ({machine.get('cpu')}), "
        f"{machine.get('memory_gib')} GiB memory, Linux {machine.get('kernel')}, "
        f"Python {machine.get('python')}. Load generator, workers, API and Postgres "
        "share it.",
        f"- **pgfleet** {run.get('pgfleet_version')}; **PostgreSQL** {pg.get('version', '?')}.",
    )
    if settings:
        rep.add(
            "- **Postgres settings:** "
            + ", ".join(f"`{k}={v}`" for k, v in settings.items() if v is not None)
            + "."
        )
    cpu_note = (
        "Postgres CPU is read from `/proc/<pid>/stat` (utime + stime) of the client "
        "backends of the run's database plus the server's background processes."
        if pg.get("local")
        else "Postgres is not local: no Postgres CPU figures."
    )
    rep.add(f"- {cpu_note}", "")


# ------------------------------------------------------------------ contention


def contention(rep: Report, doc: dict[str, Any]) -> None:
    points = doc["points"]
    rows = []
    for p in points:
        s = locustcsv.summarize(rep.results / p["csv"])
        p["locust"] = s
        commits = p["jobs_committed"] / p["batch"]
        span = p.get("db_span_seconds")
        p["db_commits_per_s"] = commits / span if span else None
        cpu = (p.get("pg_cpu_seconds") or {}).get("total")
        p["cpu_us_per_commit"] = cpu / commits * 1e6 if cpu is not None and commits else None
        rows.append(p)
        rep.check(
            f"contention {p['name']}: jobs counted by Locust were committed",
            s.jobs == p["jobs_committed"] and s.failures == 0,
            f"Locust {s.jobs} jobs ({s.failures} failed requests), database {p['jobs_committed']}",
        )
    rep.add(
        "## Notification-commit contention",
        "",
        "Producers commit enqueue transactions as fast as they can, each on its own "
        "connection; nothing drains them, and one idle session LISTENs, as a worker "
        "would. Per commit, `transaction` carries a `pg_notify` inside every enqueue "
        "transaction; `coalesced` commits bare and one notifier per load-generator "
        "process sends a `pg_notify` after commits, at most one in flight (pgfleet's "
        "default); `off` never notifies. Postgres serialises the commits of "
        "transactions that notified on one global lock, so only `transaction` should "
        "stop scaling with producers. The load generator is one Locust process on the "
        "same two cores as Postgres, so the no-notify curve is this machine's ceiling "
        "for it, not Postgres'. Each point is a single run of a few seconds on a shared "
        "machine: read the levels of the curves rather than single points.",
        "",
    )
    db = [p for p in rows if p["user"] == "db"]
    http = [p for p in rows if p["user"] == "http"]
    batches = sorted({p["batch"] for p in db})
    if db:
        fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4), squeeze=False)
        for ax, batch in zip(axes[0], batches, strict=True):
            _mode_lines(ax, [p for p in db if p["batch"] == batch], lambda p: p["locust"].rps)
            ax.set_title(f"database producers, {batch} job(s) per transaction")
            ax.set_ylabel("commits/s")
        rep.figure(fig, "contention_commits.png", "commit rate vs producers per notify mode")
        fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4), squeeze=False)
        for ax, batch in zip(axes[0], batches, strict=True):
            _mode_lines(ax, [p for p in db if p["batch"] == batch], lambda p: p["locust"].p95_ms)
            ax.set_title(f"enqueue latency p95, batch {batch}")
            ax.set_ylabel("ms")
        rep.figure(fig, "contention_latency.png", "p95 enqueue latency vs producers")
        _contention_knees(rep, db)
    if http:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        _mode_lines(ax, http, lambda p: p["locust"].rps)
        ax.set_title("through the jobs API, 1 job per request")
        ax.set_ylabel("accepted jobs/s")
        rep.figure(fig, "contention_http.png", "API enqueue rate vs clients per notify mode")
        _http_knees(rep, http)
    rep.add(
        *_table(
            [
                "user",
                "notify",
                "batch",
                "producers",
                "commits/s (Locust)",
                "commits/s (db)",
                "jobs/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "notifications",
                "PG CPU µs/commit",
            ],
            [
                (
                    p["user"],
                    p["notify"],
                    p["batch"],
                    p["producers"],
                    _fmt(p["locust"].rps),
                    _fmt(p["db_commits_per_s"]),
                    _fmt(p["locust"].jobs_per_s),
                    _fmt(p["locust"].p50_ms),
                    _fmt(p["locust"].p95_ms),
                    _fmt(p["locust"].p99_ms),
                    p["notifications_received"],
                    _fmt(p["cpu_us_per_commit"]),
                )
                for p in rows
            ],
        )
    )


def _mode_lines(ax: Any, points: list[dict[str, Any]], y: Any) -> None:
    for mode in MODE_STYLE:
        mine = sorted((p for p in points if p["notify"] == mode), key=lambda p: p["producers"])
        if not mine:
            continue
        color, marker, label = MODE_STYLE[mode]
        ax.plot(
            [p["producers"] for p in mine],
            [y(p) for p in mine],
            marker=marker,
            color=color,
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({p["producers"] for p in points}))
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.set_xlabel("concurrent producers")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()


def _curve(points: list[dict[str, Any]], mode: str, batch: int) -> tuple[list[int], list[float]]:
    mine = sorted(
        (p for p in points if p["notify"] == mode and p["batch"] == batch),
        key=lambda p: p["producers"],
    )
    return [p["producers"] for p in mine], [p["locust"].rps for p in mine]


def _contention_knees(rep: Report, db: list[dict[str, Any]]) -> None:
    words = []
    for batch in sorted({p["batch"] for p in db}):
        found: dict[str, Plateau] = {}
        for mode in ("transaction", "coalesced", "off"):
            xs, ys = _curve(db, mode, batch)
            if xs:
                found[mode] = plateau(xs, ys)
        if "transaction" not in found:
            continue
        cap = found["transaction"]
        jobs = "single-job" if batch == 1 else f"{batch}-job batch"
        sentence = (
            f"On this machine, a notification per commit caps {jobs} enqueue at about "
            f"**{cap.level:,.0f} commits/s** ({cap.level * batch:,.0f} jobs/s) from "
            f"{cap.start:g} producer(s) on (best single point {cap.best:,.0f}/s at "
            f"{cap.best_at:g}); more producers only add latency."
        )
        if "coalesced" in found:
            lifted = found["coalesced"]
            sentence += (
                f" Coalescing lifts it to about **{lifted.level:,.0f} commits/s** "
                f"({lifted.level * batch:,.0f} jobs/s, {lifted.level / cap.level:.1f}x, "
                f"from {lifted.start:g} producers on)"
            )
            if "off" in found:
                sentence += (
                    f", against about {found['off'].level:,.0f}/s with no notification at all"
                )
            sentence += "."
        words.append(sentence)
        rep.headline[f"contention_batch{batch}"] = {m: round(f.level) for m, f in found.items()}
    rep.add(
        "**Knees** (a plateau is the median of a curve's points from the first one within "
        "80 % of its best). " + " ".join(words) + _coalescing_words(db),
        "",
    )


def _http_knees(rep: Report, http: list[dict[str, Any]]) -> None:
    found = {}
    for mode in ("transaction", "coalesced", "off"):
        xs, ys = _curve(http, mode, 1)
        if xs:
            found[mode] = plateau(xs, ys)
    if found:
        rep.headline["contention_http"] = {m: round(f.level) for m, f in found.items()}
        text = ", ".join(
            f"{m} about {f.level:,.0f}/s (best {f.best:,.0f})" for m, f in found.items()
        )
        rep.add(
            f"Through the API (one process, single-job requests) the plateaus were: {text}. "
            "The API process's own CPU joins the bill on the same two cores."
            + _coalescing_words(http),
            "",
        )


def _coalescing_words(points: list[dict[str, Any]]) -> str:
    """How many notifications coalescing sent per commit, at the fewest and the most
    producers: close to one each when commits are sparse, far fewer under load."""
    mine = sorted(
        (p for p in points if p["notify"] == "coalesced" and p["batch"] == 1),
        key=lambda p: p["producers"],
    )
    if len(mine) < 2:
        return ""
    ratios = []
    for p in (mine[0], mine[-1]):
        commits = p["jobs_committed"] / p["batch"]
        ratios.append(p["notifications_received"] / commits if commits else 0.0)
    return (
        f" Coalescing sent {ratios[0]:.2f} notifications per commit with "
        f"{mine[0]['producers']} producer(s) and {ratios[1]:.2f} with {mine[-1]['producers']}: "
        "one after nearly every commit while commits are sparse (an extra statement "
        "each, off the commit path), a few per burst under load."
    )


# ------------------------------------------------------------------ drain


def drain(rep: Report, doc: dict[str, Any]) -> None:
    points = doc["points"]
    for p in points:
        p["load"] = locustcsv.summarize(rep.results / p["csv"])
        span = p["drain_seconds"]
        p["rate"] = p["jobs_done"] / span if span else None
        cpu = (p.get("pg_cpu_seconds") or {}).get("total")
        p["cpu_us_per_job"] = cpu / p["jobs_done"] * 1e6 if cpu and p["jobs_done"] else None
        rep.check(
            f"drain {p['name']}: every loaded job was done",
            p["load"].jobs == p["jobs_queued"] == p["jobs_done"] == p["backlog"]
            and p["load"].failures == 0,
            f"Locust {p['load'].jobs}, queued {p['jobs_queued']}, done {p['jobs_done']}",
        )
    rep.add(
        "## SKIP LOCKED drain throughput",
        "",
        f"A backlog of {doc['params']['backlog']:,} `noop` jobs (loaded by Locust in "
        f"batches of {doc['params']['load_batch']}, notifications off) is drained by "
        "`pgfleet worker --processes N --concurrency C`. The rate is jobs over the "
        "span from the first claim to the last completion (database clock); the CPU "
        "is Postgres' for the whole drain, worker start-up included.",
        "",
    )
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for conc in sorted({p["concurrency"] for p in points}):
        mine = sorted((p for p in points if p["concurrency"] == conc), key=lambda p: p["processes"])
        xs = [p["processes"] for p in mine]
        ax.plot(xs, [p["rate"] for p in mine], marker="o", label=f"concurrency {conc}")
        if any(p["cpu_us_per_job"] for p in mine):
            ax2.plot(
                xs, [p["cpu_us_per_job"] for p in mine], marker="o", label=f"concurrency {conc}"
            )
    for a, title, unit in ((ax, "drain rate", "jobs/s"), (ax2, "Postgres CPU per job", "µs")):
        a.set_xlabel("worker processes")
        a.set_xticks(sorted({p["processes"] for p in points}))
        a.set_ylabel(unit)
        a.set_title(title)
        # Headroom above the curves keeps the one-row legend off them.
        a.set_ylim(0, a.get_ylim()[1] * 1.3)
        a.grid(True, alpha=0.3)
        a.legend(loc="upper left", ncol=3, fontsize="small")
    rep.figure(fig, "drain_rate.png", "drain rate and Postgres CPU per job vs worker processes")
    best = max(points, key=lambda p: p["rate"] or 0)
    rep.headline["drain_best"] = {
        "jobs_per_s": round(best["rate"] or 0),
        "processes": best["processes"],
        "concurrency": best["concurrency"],
    }
    single = [p for p in points if p["processes"] == 1]
    words = (
        f"**Knee.** The drain peaks at about **{best['rate']:,.0f} jobs/s** with "
        f"{best['processes']} process(es) x {best['concurrency']} handlers"
    )
    if single:
        s = max(single, key=lambda p: p["rate"] or 0)
        words += f" (one process: {s['rate']:,.0f} jobs/s at concurrency {s['concurrency']})"
    words += (
        f". With {_cores(rep)} cores shared by the workers and Postgres, processes "
        "beyond the core count add no throughput, only Postgres CPU per job; each "
        "claim round commits once for up to C jobs, so concurrency cuts the commits "
        "(and the CPU) per job."
    )
    rep.add(words, "")
    rep.add(
        *_table(
            [
                "processes",
                "concurrency",
                "jobs",
                "drain s",
                "jobs/s",
                "wall s",
                "PG CPU s",
                "PG CPU µs/job",
                "bulk load jobs/s",
            ],
            [
                (
                    p["processes"],
                    p["concurrency"],
                    p["jobs_done"],
                    _fmt(p["drain_seconds"], 2),
                    _fmt(p["rate"]),
                    _fmt(p["wall_seconds"], 1),
                    _fmt((p.get("pg_cpu_seconds") or {}).get("total"), 2),
                    _fmt(p["cpu_us_per_job"]),
                    _fmt(p["load"].jobs_per_s),
                )
                for p in points
            ],
        )
    )


def _cores(rep: Report) -> str:
    run = _load(rep.results / "run.json") or {}
    return str(run.get("machine", {}).get("cores", "the"))


# ------------------------------------------------------------------ steady


def steady(rep: Report, doc: dict[str, Any]) -> None:
    points = doc["points"]
    params = doc["params"]
    for p in points:
        p["locust"] = locustcsv.summarize(rep.results / p["csv"])
        if "jobs_committed" in p:
            rep.check(
                f"steady {p['name']}: jobs accepted = committed = done",
                p["locust"].jobs == p["jobs_committed"] == p["jobs_done"]
                and p["locust"].failures == 0,
                f"Locust {p['locust'].jobs} ({p['locust'].failures} failed), committed "
                f"{p['jobs_committed']}, done {p['jobs_done']}",
            )
    rep.add(
        "## Steady state: pickup latency vs enqueue rate",
        "",
        f"{params['users']} Locust users POST batches of {params['batch']} `noop` jobs to "
        f"the jobs API (coalesced notifications) at a fixed total rate for "
        f"{params['seconds']:g} s each, while {params['worker_processes']} worker "
        f"process(es) x {params['concurrency']} handlers run. Pickup latency is "
        "`started_at - run_at` of every job of the step (database clock); backlog "
        "age is the oldest runnable job's age, sampled every "
        f"{params['sample_interval']:g} s.",
        "",
    )
    measured = [p for p in points if "pickup" in p and p["pickup"]["jobs"]]
    if measured:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        xs = [p["locust"].jobs_per_s for p in measured]
        for key, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-"), ("max", "x--")):
            ys = [max(p["pickup"][key] or 0, 1e-4) * 1000 for p in measured]
            ax.plot(xs, ys, style, label=key)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("achieved enqueue rate (jobs/s)")
        ax.set_ylabel("pickup latency (ms)")
        ax.set_title("pickup latency percentiles vs enqueue rate")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        rep.figure(fig, "pickup_latency.png", "pickup latency percentiles vs enqueue rate")
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for p in measured:
            t, age = _series(p["samples"], "oldest_age")
            ax.plot(t, age, label=f"{p['target_rate']:g} jobs/s")
        # symlog: the slow steps' milliseconds stay visible next to a growing backlog.
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("seconds into the step")
        ax.set_ylabel("oldest runnable job (s)")
        ax.set_title("backlog age over time, per target rate")
        ax.grid(True, alpha=0.3)
        ax.legend()
        rep.figure(fig, "backlog_age.png", "backlog age over time per enqueue rate")
        _steady_knee(rep, measured)
    rep.add(
        *_table(
            [
                "target jobs/s",
                "achieved jobs/s",
                "request p95 ms",
                "pickup p50 ms",
                "p95 ms",
                "p99 ms",
                "max ms",
                "max backlog",
                "max backlog age s",
            ],
            [
                (
                    _fmt(p["target_rate"]),
                    _fmt(p["locust"].jobs_per_s),
                    _fmt(p["locust"].p95_ms),
                    *(_ms(p.get("pickup", {}).get(k)) for k in ("p50", "p95", "p99", "max")),
                    max((s["runnable"] for s in p.get("samples", [])), default="-"),
                    _fmt(max((s["oldest_age"] for s in p.get("samples", [])), default=None), 2),
                )
                for p in points
            ],
        )
    )


def _series(samples: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    if not samples:
        return [], []
    t0 = samples[0]["t"]
    return [s["t"] - t0 for s in samples], [float(s[key] or 0) for s in samples]


def _steady_knee(rep: Report, measured: list[dict[str, Any]]) -> None:
    kept_up = [
        p
        for p in measured
        if p["locust"].jobs_per_s >= 0.9 * p["target_rate"] and (p["pickup"]["p99"] or 0) < 1.0
    ]
    if kept_up:
        top = max(kept_up, key=lambda p: p["locust"].jobs_per_s)
        words = (
            f"**Knee.** The fleet keeps pickup p99 under a second up to about "
            f"**{top['locust'].jobs_per_s:,.0f} jobs/s** enqueued (p50 "
            f"{_ms(top['pickup']['p50'])} ms, p99 {_ms(top['pickup']['p99'])} ms there)"
        )
        beyond = [p for p in measured if p["target_rate"] > top["target_rate"]]
        if beyond:
            b = beyond[0]
            backlog = max((s["runnable"] for s in b.get("samples", [])), default=0)
            words += (
                f"; at {b['target_rate']:,.0f} jobs/s offered the API still accepted "
                f"{b['locust'].jobs_per_s:,.0f} jobs/s, but the workers fell behind: the "
                f"backlog reached {backlog:,} jobs and pickup p99 {_ms(b['pickup']['p99'])} ms"
            )
        rep.add(words + ".", "")
        rep.headline["steady_keeps_up_to"] = round(top["locust"].jobs_per_s)
    else:
        rep.add("**Knee.** No step kept pickup p99 under a second.", "")


# ------------------------------------------------------------------ soak


def bounded(values: Sequence[float], slack: float = 1.25, floor: float = 1.0) -> bool:
    """Whether a series stopped growing: the maximum of its last third stays within
    ``slack`` times the maximum of its middle third, plus ``floor`` (the noise a
    near-zero series may show without growing)."""
    n = len(values)
    if n < 6:
        return True
    middle = max(values[n // 3 : 2 * n // 3])
    last = max(values[2 * n // 3 :])
    return last <= middle * slack + floor


def soak(rep: Report, doc: dict[str, Any]) -> None:
    p = doc["points"][0]
    params = doc["params"]
    s = locustcsv.summarize(rep.results / p["csv"])
    how = _soak_how(p, params)
    if "history_move_after" in params:
        kept = (
            f"Finished jobs move to history after {params['history_move_after']:g} s (the "
            f"leader's chores every {params['prune_interval']:g} s); history's days are "
            f"dropped past {params['retention_seconds']:g} s."
        )
    else:  # a run from before history (migration 0010)
        kept = f"Finished jobs retained {params['retention_seconds']:g} s, then pruned."
    rep.add(
        "## Soak: does it stay bounded?",
        "",
        f"{params['seconds']:g} s at {p['target_rate']:,.0f} jobs/s ({how}) "
        f"{_soak_generator(p, params)} "
        f"with {params['worker_processes']} worker process(es) x {params['concurrency']} "
        f"handlers. {kept}",
        "",
    )
    samples = p.get("samples") or []
    if "jobs_committed" in p:
        rep.check(
            "soak: jobs accepted = committed = done",
            s.jobs == p["jobs_committed"] == p["jobs_done"] and s.failures == 0,
            f"Locust {s.jobs} ({s.failures} failed), committed {p['jobs_committed']}, "
            f"done {p['jobs_done']} ({p.get('jobs_moved', 0)} moved to history, "
            f"{p['jobs_pruned']} pruned)",
        )
    if not samples:
        return
    _soak_plots(rep, p, params, samples)
    _soak_verdict(rep, p, params, samples, s.jobs)


def _soak_how(p: dict[str, Any], params: dict[str, Any]) -> str:
    capacity = p.get("capacity")
    if not capacity:
        return "a set rate"
    cap = f", capped at {params['max_rate']:g}" if params.get("max_rate") else ""
    if p.get("capacity_mode") == "end-to-end":
        return (
            f"{params['share']:.0%} of the fleet's end-to-end capacity, {capacity:,.0f} jobs/s: "
            f"what the workers finished while the generators offered the drain capacity "
            f"({p.get('drain_capacity', 0):,.0f} jobs/s, no generator running) for "
            f"{params['capacity_seconds']:g} s (counted after {params['capacity_warmup']:g} s; "
            f"they enqueued {p.get('capacity_enqueued_rate', 0):,.0f} jobs/s and left "
            f"{p.get('capacity_backlog_left', 0):,} jobs queued){cap}"
        )
    share = f"{params['share']:.0%}"
    return f"{share} of the fleet's measured drain capacity ({capacity:,.0f} jobs/s{cap})"


def _soak_generator(p: dict[str, Any], params: dict[str, Any]) -> str:
    if p.get("generator") == "db":
        return (
            f"enqueued straight into Postgres in batches of {p['batch']} by {params['users']} "
            f"paced producers in {params.get('generator_processes', 1)} Locust process(es)"
        )
    return "through the API"


def _soak_rate(rep: Report, p: dict[str, Any], verdicts: dict[str, bool]) -> str:
    """The rate the generators delivered against the target (runs that recorded it)."""
    achieved = p.get("achieved_rate")
    if achieved is None:
        return ""
    target = p["target_rate"]
    share = achieved / max(target, 1e-9)
    verdicts["rate reached"] = share >= p.get("min_rate_share", 0.95)
    rep.headline["soak_achieved_rate"] = round(achieved)
    rep.headline["soak_target_rate"] = round(target)
    of_capacity = ""
    if p.get("capacity"):
        rep.headline["soak_capacity_share"] = round(achieved / p["capacity"], 3)
        of_capacity = f", {achieved / p['capacity']:.0%} of the capacity"
    return (
        f" Achieved {achieved:,.0f} jobs/s against a target of {target:,.0f} "
        f"({share:.0%}{of_capacity}; below {p.get('min_rate_share', 0.95):.0%} of the target "
        "fails the verdict)."
    )


def _soak_plots(
    rep: Report, p: dict[str, Any], params: dict[str, Any], samples: list[dict[str, Any]]
) -> None:
    t, _ = _series(samples, "total_bytes")
    _, size = _series(samples, "total_bytes")
    index = [r.get("index_bytes", 0) for r in samples]
    history = [r.get("history_bytes", 0) for r in samples]
    _, dead = _series(samples, "dead_tuples")
    _, vacuums = _series(samples, "vacuums")
    # Whole windows inside the run (the drain after Locust stops is not a rate).
    windows = [w for w in p.get("windows") or [] if w["t"] < params["seconds"]]
    wt = [w["t"] + params.get("window", 60) / 2 for w in windows]
    fig, axes = plt.subplots(6, 1, figsize=(7, 13), sharex=True)
    # The server's checkpoints, where their count went up, on the latency plot.
    marks = [t[i] for i in range(1, len(t)) if _grew(samples, "checkpoints", i)]
    for x in marks:
        axes[0].axvline(x, color="tab:gray", alpha=0.25, linewidth=0.8)
    axes[0].plot(wt, [(w["p50"] or 0) * 1000 for w in windows], label="p50")
    axes[0].plot(wt, [(w["p90"] or 0) * 1000 for w in windows], label="p90")
    axes[0].plot(wt, [(w["p99"] or 0) * 1000 for w in windows], label="p99")
    axes[0].set_ylabel(f"claim latency (ms)\nper {params.get('window', 60):g} s")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[1].plot(wt, [w["drain_rate"] for w in windows], color="tab:green")
    axes[1].set_ylabel("drained (jobs/s)")
    axes[2].plot(t, [b / 2**20 for b in size], color="tab:purple", label="claim table + indexes")
    axes[2].plot(t, [b / 2**20 for b in index], color="tab:pink", label="its indexes")
    axes[2].set_ylabel("claim table (MiB)")
    # History grows by gigabytes an hour: on its own axis, the claim table's few
    # megabytes of change stay readable.
    grown = axes[2].twinx()
    grown.plot(t, [b / 2**30 for b in history], color="tab:brown", label="history (right)")
    grown.set_ylabel("history (GiB)")
    grown.set_ylim(bottom=0)
    lines = axes[2].get_legend_handles_labels()
    more = grown.get_legend_handles_labels()
    axes[2].legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", fontsize=8)
    axes[3].plot(t, dead, color="tab:gray")
    axes[3].set_ylabel("dead tuples")
    axes[4].step(t, [v - vacuums[0] for v in vacuums], color="tab:blue", where="post")
    axes[4].set_ylabel("vacuums of the\nclaim table")
    axes[5].plot(t[1:], _rates(samples, "wal_bytes", 2**20), color="tab:olive")
    axes[5].set_ylabel("WAL (MiB/s)\ngray: checkpoints")
    axes[5].set_xlabel("seconds into the soak")
    axes[0].set_title(f"soak at {p['target_rate']:,.0f} jobs/s")
    for a in axes:
        a.grid(True, alpha=0.3)
        a.set_ylim(bottom=0)
    rep.figure(
        fig,
        "soak.png",
        "claim latency (gray lines: the server's checkpoints), drain rate, table, index "
        "and history sizes, dead tuples, vacuums and WAL written over the soak",
    )


def _grew(samples: list[dict[str, Any]], key: str, i: int) -> bool:
    """Whether counter ``key`` went up from sample ``i - 1`` to sample ``i`` (a run
    recorded before the counter existed has none)."""
    before, after = samples[i - 1].get(key), samples[i].get(key)
    return before is not None and after is not None and after > before


def _rates(samples: list[dict[str, Any]], key: str, unit: float) -> list[float]:
    """Counter ``key`` per second between consecutive samples, in ``unit``s (0 where a
    sample lacks it)."""
    out = []
    for a, b in itertools.pairwise(samples):
        dt = b["t"] - a["t"]
        ok = dt > 0 and a.get(key) is not None and b.get(key) is not None
        out.append((b[key] - a[key]) / dt / unit if ok else 0.0)
    return out


def _soak_verdict(
    rep: Report,
    p: dict[str, Any],
    params: dict[str, Any],
    samples: list[dict[str, Any]],
    jobs: int,
) -> None:
    _, age = _series(samples, "oldest_age")
    _, size = _series(samples, "total_bytes")
    _, dead = _series(samples, "dead_tuples")
    _, backlog = _series(samples, "runnable")
    rate = p["target_rate"]
    # Floors: a second of arrivals for the backlog, a second for its age, 1 MiB of
    # table, and the leader's vacuum threshold for dead tuples.
    verdicts = {
        "backlog": bounded(backlog, floor=rate),
        "backlog age": bounded(age, floor=1.0),
        "claim table size": bounded(size, floor=2**20),
        "dead tuples": bounded(dead, floor=10_000),
    }
    judged = p.get("judged") or []
    drift = ""
    if len(judged) == 2 and judged[0]["p99"] is not None and judged[1]["p99"] is not None:
        first, last = judged[0]["p99"], judged[1]["p99"]
        # 1.2x, with 5 ms of slack for latencies too small to compare as ratios.
        verdicts["claim p99"] = last <= first * 1.2 + 0.005
        span, warmup = p["judge_span"], p.get("judge_warmup", 0)
        after = f" after the first {warmup:g} s" if warmup else ""
        drift = (
            f" Claim latency p99: {first * 1000:.1f} ms in the first {span:g} s{after}, "
            f"{last * 1000:.1f} ms in the last {span:g} s ({last / max(first, 1e-9):.2f}x)."
        )
        rep.headline["soak_p99_ratio"] = round(last / max(first, 1e-9), 3)
    drift += _soak_rate(rep, p, verdicts)
    vacuums = samples[-1]["vacuums"] - samples[0]["vacuums"]
    ok = all(verdicts.values())
    long_enough = params["seconds"] >= MIN_SOAK_SECONDS
    rep.headline["soak_bounded"] = ok if long_enough else None
    verdict = ("bounded" if ok else "NOT bounded") if long_enough else "too short to judge"
    if not long_enough:
        rep.add(
            f"The soak ran under {MIN_SOAK_SECONDS} s: the leader's chores and vacuum "
            "need minutes to settle, so it cannot show whether the table stops growing.",
            "",
        )
    history = samples[-1].get("history_bytes", 0) / 2**20
    rep.add(
        f"**Verdict: {verdict}** ("
        + ", ".join(f"{k} {_word(k, v)}" for k, v in verdicts.items())
        + f"; the last third's maximum against the middle third's).{drift} {jobs:,} jobs, "
        f"{vacuums} vacuum(s) of the claim table, which was at most {max(size) / 2**20:.1f} "
        f"MiB while history grew to {history:.1f} MiB; dead tuples at most {max(dead):,.0f}, "
        f"backlog at most {max(backlog):,.0f} jobs, backlog age at most {max(age):.2f} s.",
        "",
    )


def _word(key: str, ok: bool) -> str:
    if key == "rate reached":
        return "yes" if ok else "NO"
    return "flat" if ok else "growing"


# ------------------------------------------------------------------ assembly


def write_report(results: Path, out: Path | None = None) -> Path:
    out = out or results
    out.mkdir(parents=True, exist_ok=True)
    rep = Report(results, out)
    header(rep, _load(results / "run.json") or {})
    for name, section in (
        ("contention", contention),
        ("drain", drain),
        ("steady", steady),
        ("soak", soak),
    ):
        doc = _load(results / name / "points.json")
        if doc and doc["points"]:
            section(rep, doc)
            if name == "drain":
                # What KEDA would do with this drain rate (loadtest/autoscale.py).
                autoscale.report_section(rep, doc)
    failed = [c for c in rep.checks if not c["ok"]]
    rep.add(
        "## Consistency",
        "",
        f"{len(rep.checks) - len(failed)} of {len(rep.checks)} checks passed "
        "(jobs counted by Locust = jobs committed = jobs done; no failed request).",
        "",
    )
    for c in failed:
        rep.add(f"- **FAILED** {c['what']}: {c['detail']}")
    rep.add("")
    path = out / "report.md"
    path.write_text("\n".join(rep.lines))
    summary = {
        "ok": not failed,
        "checks": rep.checks,
        "headline": rep.headline,
        "plots": rep.plots,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.report")
    parser.add_argument("results", type=Path, help="a results directory of loadtest.run")
    parser.add_argument("--out", type=Path, help="where to write (default: the results dir)")
    args = parser.parse_args(argv)
    print(write_report(args.results, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
