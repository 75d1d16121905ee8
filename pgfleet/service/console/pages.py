"""The console's pages: data in, :class:`Markup` out. No I/O here.

Every value reaches the page through :func:`el` or :func:`escape`, so nothing a
producer wrote (a job name, a key, an error, a payload) can become markup.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from pgfleet.jobs import BatchProgress, Job, JobStatus, Relative, WorkerInfo
from pgfleet.service.console.auth import CSRF_FIELD, LOGIN_CSRF_FIELD
from pgfleet.service.console.data import JobFilter, JobPage, Overview
from pgfleet.service.console.html import Child, Markup, el, join

BASE = "/ui"
STATIC = f"{BASE}/static"
#: What each job status allows: the console's buttons, by state.
ACTIONS: dict[JobStatus, tuple[str, ...]] = {
    JobStatus.QUEUED: ("cancel", "reschedule", "fail"),
    JobStatus.RUNNING: ("cancel", "fail"),
    JobStatus.FAILED: ("retry",),
    JobStatus.CANCELLED: ("retry",),
    JobStatus.SUCCEEDED: (),
    JobStatus.WAITING: ("cancel",),
}
DONE_MESSAGES = {
    "retried": "Retried: the job is queued again with fresh attempts.",
    "cancelled": "Cancelled.",
    "cancel_requested": "Cancel requested: the worker running the job is stopping it.",
    "failed": "Failed permanently.",
    "rescheduled": "Rescheduled.",
}


@dataclass(frozen=True, slots=True)
class Frame:
    """What every page around its content needs."""

    csrf: str | None
    title: str
    section: str
    refresh: int = 0
    notice: str | None = None
    error: str | None = None
    #: Who is signed in: "name (role)".
    who: str | None = None
    #: False for a read-only role: no action buttons or links.
    can_act: bool = True


# ---------------------------------------------------------------- formatting


def when(value: datetime | None, now: datetime | None = None) -> Markup:
    if value is None:
        return Markup("")
    text = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if now is None:
        return el("time", {"datetime": value.isoformat()}, text)
    return el("time", {"datetime": value.isoformat(), "title": text}, ago(value, now))


def ago(value: datetime, now: datetime) -> str:
    seconds = (now - value).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    if seconds < 60:
        text = f"{seconds:.0f}s"
    elif seconds < 3600:
        text = f"{seconds / 60:.0f}m"
    elif seconds < 86400:
        text = f"{seconds / 3600:.1f}h"
    else:
        text = f"{seconds / 86400:.1f}d"
    return f"in {text}" if future else f"{text} ago"


def duration(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def url(path: str, **query: object) -> str:
    params = {k: str(v) for k, v in query.items() if v is not None and v != ""}
    return f"{path}?{urlencode(params)}" if params else path


def badge(status: str) -> Markup:
    return el("span", {"class": f"badge {status}"}, "dead" if status == "failed" else status)


def first_line(text: str | None, width: int = 80) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def table(headers: Sequence[str], rows: Iterable[Sequence[Child]], empty: str) -> Markup:
    body = [el("tr", None, [el("td", None, cell) for cell in row]) for row in rows]
    if not body:
        body = [el("tr", None, el("td", {"colspan": len(headers), "class": "empty"}, empty))]
    return el(
        "table",
        None,
        el("thead", None, el("tr", None, [el("th", None, h) for h in headers])),
        el("tbody", None, body),
    )


def post_form(action: str, csrf: str, button: str, *fields: Child, danger: bool = False) -> Markup:
    return el(
        "form",
        {"method": "post", "action": action, "class": "inline"},
        el("input", {"type": "hidden", "name": CSRF_FIELD, "value": csrf}),
        fields,
        el("button", {"type": "submit", "class": "danger" if danger else None}, button),
    )


# ---------------------------------------------------------------- layout

_NAV = (
    ("overview", f"{BASE}/", "Overview"),
    ("jobs", f"{BASE}/jobs", "Jobs"),
    ("workers", f"{BASE}/workers", "Workers"),
    ("crons", f"{BASE}/crons", "Cron"),
)


def layout(frame: Frame, *content: Child) -> Markup:
    nav: list[Child] = [
        el("a", {"href": href, "class": "current" if key == frame.section else None}, label)
        for key, href, label in _NAV
    ]
    if frame.csrf is not None:
        if frame.who:
            nav.append(el("span", {"class": "who"}, frame.who))
        nav.append(post_form(f"{BASE}/logout", frame.csrf, "Log out"))
    body_attrs = {"data-refresh": frame.refresh or None}
    return join(
        Markup("<!doctype html>"),
        el(
            "html",
            {"lang": "en"},
            el(
                "head",
                None,
                el("meta", {"charset": "utf-8"}),
                el("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}),
                el("title", None, f"{frame.title} · pgfleet"),
                el("link", {"rel": "stylesheet", "href": f"{STATIC}/console.css"}),
                el("link", {"rel": "icon", "href": f"{STATIC}/favicon.svg"}),
                el("script", {"src": f"{STATIC}/console.js", "defer": True}),
            ),
            el(
                "body",
                body_attrs,
                el("header", None, el("strong", None, "pgfleet"), el("nav", None, nav)),
                el(
                    "main",
                    None,
                    el("h1", None, frame.title),
                    frame.notice and el("p", {"class": "notice", "role": "status"}, frame.notice),
                    frame.error and el("p", {"class": "error", "role": "alert"}, frame.error),
                    content,
                ),
            ),
        ),
    )


def message_page(title: str, text: str, csrf: str | None = None) -> Markup:
    return layout(
        Frame(csrf, title, ""), el("p", None, text), el("a", {"href": f"{BASE}/"}, "Back")
    )


def login_page(login_csrf: str, next_path: str, error: str | None) -> Markup:
    return layout(
        Frame(None, "Log in", "", error=error),
        el(
            "form",
            {"method": "post", "action": f"{BASE}/login", "class": "login"},
            el("label", {"for": "token"}, "Credential"),
            el(
                "input",
                {
                    "type": "password",
                    "id": "token",
                    "name": "token",
                    "required": True,
                    "autocomplete": "current-password",
                    "autofocus": True,
                },
            ),
            el("input", {"type": "hidden", "name": LOGIN_CSRF_FIELD, "value": login_csrf}),
            el("input", {"type": "hidden", "name": "next", "value": next_path}),
            el("button", {"type": "submit"}, "Log in"),
        ),
        el(
            "p",
            {"class": "hint"},
            "The secret of a viewer or operator credential of this API "
            "(PGFLEET_API_CREDENTIALS, or PGFLEET_API_TOKEN in a one-token setup).",
        ),
    )


# ---------------------------------------------------------------- overview


def overview_page(frame: Frame, data: Overview, holder: UUID | None) -> Markup:
    now = data.now
    per_name = [
        (
            el("a", {"href": url(f"{BASE}/jobs", name=r.name)}, r.name),
            r.queued,
            r.scheduled,
            r.running,
            el("a", {"href": url(f"{BASE}/jobs", status="failed", name=r.name)}, r.dead)
            if r.dead
            else 0,
            duration(r.oldest_age),
            join(
                el("a", {"href": url(f"{BASE}/bulk", action="retry", name=r.name)}, "retry dead"),
                " · ",
                el(
                    "a",
                    {"href": url(f"{BASE}/bulk", action="cancel", name=r.name)},
                    "cancel dead",
                ),
            )
            if r.dead and frame.can_act
            else "",
        )
        for r in data.names
    ]
    alive = [w for w in data.workers if w.alive]
    by_id = {w.id: w for w in data.workers}
    roles = []
    for lease in data.leases:
        roles.append(
            (
                lease["role"],
                holder_text(lease["holder"], by_id, holder),
                "yes" if lease["live"] else "expired",
                when(lease["acquired_at"], now),
                when(lease["expires_at"], now),
            )
        )
    return layout(
        frame,
        el(
            "section",
            {"class": "cards"},
            card("Workers alive", f"{len(alive)} / {len(data.workers)}", f"{BASE}/workers"),
            card(
                "Queued (due)",
                sum(r.queued for r in data.names),
                f"{BASE}/jobs?status=queued",
            ),
            card("Running", sum(r.running for r in data.names), f"{BASE}/jobs?status=running"),
            card(
                "Waiting on parents",
                sum(data.waiting_on_parents.values()),
                f"{BASE}/jobs?status=waiting",
            ),
            card("Dead", sum(r.dead for r in data.names), f"{BASE}/jobs?status=failed"),
        ),
        el("h2", None, "Per job name"),
        table(
            ["Name", "Queued (due)", "Scheduled", "Running", "Dead", "Oldest due", "Dead jobs"],
            per_name,
            "No queued, running or dead jobs.",
        ),
        *_flow_section(data),
        el("h2", None, "Fleet roles"),
        table(["Role", "Holder", "Live", "Since", "Expires"], roles, "No leader or lease yet."),
        el(
            "p",
            {"class": "hint"},
            f"Database time {now.astimezone(UTC):%H:%M:%SZ}. ",
            el("button", {"type": "button", "id": "refresh-toggle", "hidden": True}, "Pause"),
        ),
    )


def _flow_section(data: Overview) -> list[Markup]:
    """Limits, pauses and the due jobs waiting on them (nothing when none)."""
    if not data.limits and not data.paused_queues:
        return []
    waiting: dict[str, list[str]] = {}
    for name, reason, n in data.waiting:
        waiting.setdefault(name, []).append(f"{n} {reason}")
    rows: list[Sequence[Child]] = [
        (
            el("a", {"href": url(f"{BASE}/jobs", name=lim.name)}, lim.name),
            "" if lim.concurrency is None else lim.concurrency,
            "" if lim.rate is None else f"{lim.rate} per {lim.per:g} s",
            "yes" if lim.per_key else "",
            lim.source,
            when(lim.paused_at, data.now),
            ", ".join(waiting.get(lim.name, [])),
        )
        for lim in data.limits
    ]
    rows += [
        (f"queue {p.name}", "", "", "", "operator", when(p.paused_at, data.now), "")
        for p in data.paused_queues
    ]
    return [
        el("h2", None, "Flow control"),
        table(
            ["Name", "Concurrency", "Rate", "Per key", "Source", "Paused since", "Waiting"],
            rows,
            "No limits and no pauses.",
        ),
    ]


def card(label: str, value: object, href: str) -> Markup:
    return el(
        "a",
        {"class": "card", "href": href},
        el("span", {"class": "value"}, str(value)),
        el("span", {"class": "label"}, label),
    )


def holder_text(uid: UUID, workers: dict[UUID, WorkerInfo], own: UUID | None) -> Markup:
    worker = workers.get(uid)
    if worker is not None:
        return join(
            el("a", {"href": f"{BASE}/workers#w-{uid}"}, f"worker {worker.hostname}:{worker.pid}"),
        )
    if own is not None and uid == own:
        return join("this api process ", el("code", None, str(uid)[:8]))
    return join("another process ", el("code", None, str(uid)[:8]))


# ---------------------------------------------------------------- jobs


def jobs_page(
    frame: Frame, f: JobFilter, page: JobPage, before: UUID | None, now: datetime
) -> Markup:
    query = {
        "status": f.status.value if f.status else None,
        "name": f.name,
        "queue": f.queue,
        "key": f.key,
        "from": f.since.strftime("%Y-%m-%dT%H:%M") if f.since else None,
        "to": f.until.strftime("%Y-%m-%dT%H:%M") if f.until else None,
    }
    rows = [
        (
            el("a", {"href": f"{BASE}/jobs/{r['id']}", "class": "mono"}, str(r["id"])),
            r["name"],
            badge(r["status"]),
            f"{r['attempt']}/{r['max_attempts']}",
            r["queue_name"] or "",
            r["limit_key"] or "",
            when(r["created_at"], now),
            when(r["run_at"], now) if r["status"] == "queued" else when(r["finished_at"], now),
            el("span", {"class": "err"}, first_line(r["last_error"])),
        )
        for r in page.rows
    ]
    paging: list[Child] = []
    if before is not None:
        paging.append(el("a", {"href": url(f"{BASE}/jobs", **query)}, "« Newest"))
    if page.older is not None:
        paging.append(el("a", {"href": url(f"{BASE}/jobs", **query, before=page.older)}, "Older »"))
    if page.searched_to is not None:
        paging.append(
            join(
                f"No index serves this filter: this page searched only the {page.window:,} "
                "jobs before it. ",
                el(
                    "a",
                    {"href": url(f"{BASE}/jobs", **query, before=page.searched_to)},
                    "Search older jobs »",
                ),
            )
        )
    name_bulk: Child = None
    if f.name and f.status is JobStatus.FAILED:
        name_bulk = el(
            "p",
            None,
            el(
                "a",
                {"href": url(f"{BASE}/bulk", action="retry", name=f.name)},
                f"Retry every dead {f.name} job…",
            ),
            " · ",
            el(
                "a",
                {"href": url(f"{BASE}/bulk", action="cancel", name=f.name)},
                f"Cancel every dead {f.name} job…",
            ),
        )
    return layout(
        frame,
        filter_form(f),
        name_bulk,
        table(
            [
                "Id",
                "Name",
                "Status",
                "Attempt",
                "Queue",
                "Limit key",
                "Created",
                "Run at / finished",
                "Last error",
            ],
            rows,
            "No job matches.",
        ),
        el("p", {"class": "paging"}, paging),
    )


def filter_form(f: JobFilter) -> Markup:
    options = [el("option", {"value": ""}, "any status")]
    for status in JobStatus:
        label = "dead (failed)" if status is JobStatus.FAILED else status.value
        options.append(el("option", {"value": status.value, "selected": f.status is status}, label))
    return el(
        "form",
        {"method": "get", "action": f"{BASE}/jobs", "class": "filters"},
        el("label", None, "Status ", el("select", {"name": "status", "id": "f-status"}, options)),
        el(
            "label",
            None,
            "Name ",
            el("input", {"name": "name", "id": "f-name", "value": f.name or "", "size": 16}),
        ),
        el(
            "label",
            None,
            "Queue ",
            el("input", {"name": "queue", "id": "f-queue", "value": f.queue or "", "size": 12}),
        ),
        el(
            "label",
            None,
            "Limit key ",
            el("input", {"name": "key", "id": "f-key", "value": f.key or "", "size": 12}),
        ),
        el(
            "label",
            None,
            "Created from (UTC) ",
            el(
                "input",
                {
                    "type": "datetime-local",
                    "name": "from",
                    "id": "f-from",
                    "value": f.since.strftime("%Y-%m-%dT%H:%M") if f.since else "",
                },
            ),
        ),
        el(
            "label",
            None,
            "to ",
            el(
                "input",
                {
                    "type": "datetime-local",
                    "name": "to",
                    "id": "f-to",
                    "value": f.until.strftime("%Y-%m-%dT%H:%M") if f.until else "",
                },
            ),
        ),
        el("button", {"type": "submit"}, "Filter"),
    )


def job_page(
    frame: Frame,
    job: Job,
    now: datetime,
    *,
    payloads: bool,
    show_payload: bool,
    hidden_note: str = "Payload display is turned off on this console.",
    parents: Sequence[Relative] = (),
    children: Sequence[Relative] = (),
    batch: BatchProgress | None = None,
) -> Markup:
    fields: list[tuple[str, Child]] = [
        ("Id", el("code", None, str(job.id))),
        ("Name", el("a", {"href": url(f"{BASE}/jobs", name=job.name)}, job.name)),
        ("Status", badge(job.status.value)),
        (
            "Attempts",
            f"{job.attempt} of {job.max_attempts}"
            + (" (none left)" if job.attempt >= job.max_attempts else ""),
        ),
        ("Priority", job.priority),
        ("Named queue", job.queue_name or "—"),
        ("Job key", job.job_key or "—"),
        (
            "Limit key",
            el("a", {"href": url(f"{BASE}/jobs", key=job.limit_key)}, job.limit_key)
            if job.limit_key
            else "—",
        ),
        ("Run at", join(when(job.run_at), " (", ago(job.run_at, now), ")")),
        ("Created", when(job.created_at)),
        ("Started (last attempt)", when(job.started_at) if job.started_at else "—"),
        ("Finished", when(job.finished_at) if job.finished_at else "—"),
        (
            "Held by worker",
            el("a", {"href": f"{BASE}/workers#w-{job.worker_id}"}, str(job.worker_id))
            if job.worker_id and job.status is JobStatus.RUNNING
            else "—",
        ),
    ]
    if job.snoozes:
        fields.append(("Snoozes", job.snoozes))
    if job.cancel_requested_at is not None:
        fields.append(("Cancel requested", when(job.cancel_requested_at)))
    if job.cancelled_by:
        fields.append(("Cancelled by", job.cancelled_by))
    details = el(
        "dl", {"class": "fields"}, [(el("dt", None, k), el("dd", None, v)) for k, v in fields]
    )
    error = el(
        "section",
        None,
        el("h2", None, "Last error"),
        el("pre", {"class": "error-text"}, job.last_error)
        if job.last_error
        else el("p", None, "None."),
    )
    history: Child = ""
    if job.errors:
        omitted = (
            el("p", {"class": "hint"}, f"{job.errors_omitted} older failed attempts not kept.")
            if job.errors_omitted
            else ""
        )
        history = el(
            "section",
            {"id": "errors"},
            el("h2", None, "Failed attempts"),
            omitted,
            table(
                ["Attempt", "At", "Worker", "Error"],
                [
                    [
                        str(e.attempt),
                        when(e.at),
                        str(e.worker_id) if e.worker_id else "—",
                        el("pre", {"class": "error-text"}, e.error),
                    ]
                    for e in job.errors
                ],
                "None.",
            ),
        )
    result: Child = ""
    if job.status is JobStatus.SUCCEEDED:
        result = el(
            "section",
            {"id": "result"},
            el("h2", None, "Result"),
            el(
                "pre",
                {"class": "payload"},
                json.dumps(job.result, indent=2, ensure_ascii=False, default=str),
            )
            if payloads
            else el("p", {"class": "hint"}, hidden_note.replace("Payload", "Result")),
        )
    if not payloads:
        payload: Child = el("p", {"class": "hint"}, hidden_note)
    elif show_payload:
        payload = el(
            "pre",
            {"class": "payload", "id": "payload"},
            json.dumps(job.payload, indent=2, ensure_ascii=False, default=str),
        )
    else:
        payload = el(
            "p",
            None,
            el(
                "a", {"href": f"{BASE}/jobs/{job.id}/payload", "id": "show-payload"}, "Show payload"
            ),
        )
    return layout(
        frame,
        details,
        job_actions(frame.csrf or "", job) if frame.can_act else "",
        batch_section(batch) if batch is not None else "",
        relatives_section("Waits on", "parents", parents) if parents else "",
        relatives_section("Children", "children", children) if children else "",
        result,
        error,
        history,
        el("section", None, el("h2", None, "Payload"), payload),
    )


def relatives_section(title: str, key: str, relatives: Sequence[Relative]) -> Markup:
    """A job's parents or children, each linked, with its status."""
    rows = [
        [
            el("a", {"href": f"{BASE}/jobs/{r.id}"}, str(r.id)),
            r.name or "(pruned)",
            badge(r.status.value),
            "runs anyway" if r.run_anyway else "",
        ]
        for r in relatives
    ]
    return el(
        "section",
        {"id": key},
        el("h2", None, f"{title} ({len(relatives)}{'+' if len(relatives) >= 100 else ''})"),
        table(["Job", "Name", "Status", ""], rows, "None."),
    )


def batch_section(progress: BatchProgress) -> Markup:
    """This job is a batch's callback: the members' outcomes so far."""
    done = progress.size - progress.pending
    fields: list[tuple[str, Child]] = [
        ("Members", progress.size),
        ("Finished", f"{done} of {progress.size}"),
        ("Succeeded", progress.succeeded),
        ("Failed", progress.failed),
        ("Cancelled", progress.cancelled),
        ("Pending", progress.pending),
    ]
    return el(
        "section",
        {"id": "batch"},
        el("h2", None, "Batch"),
        el(
            "progress",
            {"max": str(progress.size), "value": str(done)},
            f"{done}/{progress.size}",
        ),
        el("dl", {"class": "fields"}, [(el("dt", None, k), el("dd", None, v)) for k, v in fields]),
    )


def job_actions(csrf: str, job: Job) -> Markup:
    allowed = ACTIONS[job.status]
    base = f"{BASE}/jobs/{job.id}"
    forms: list[Child] = []
    if "retry" in allowed:
        forms.append(post_form(f"{base}/retry", csrf, "Retry now"))
    if "cancel" in allowed:
        forms.append(post_form(f"{base}/cancel", csrf, "Cancel", danger=True))
    if "reschedule" in allowed:
        forms.append(
            post_form(
                f"{base}/reschedule",
                csrf,
                "Reschedule",
                el(
                    "label",
                    None,
                    "in seconds ",
                    el(
                        "input",
                        {"type": "number", "name": "delay", "min": 0, "step": "any", "size": 6},
                    ),
                ),
                el(
                    "label",
                    None,
                    " or at (UTC) ",
                    el("input", {"type": "datetime-local", "name": "at"}),
                ),
            )
        )
    if "fail" in allowed:
        forms.append(
            post_form(
                f"{base}/fail",
                csrf,
                "Fail permanently",
                el(
                    "input",
                    {
                        "name": "reason",
                        "value": "failed by operator",
                        "size": 24,
                        "aria-label": "reason",
                    },
                ),
                danger=True,
            )
        )
    if not forms:
        return el("p", {"class": "hint"}, "No action applies to a succeeded job.")
    return el("section", {"class": "actions"}, el("h2", None, "Actions"), forms)


def bulk_page(frame: Frame, action: str, name: str, count: int) -> Markup:
    verb = "Retry" if action == "retry" else "Cancel"
    effect = (
        "They are queued again now, with fresh attempts (a job whose key another queued "
        "or running job holds is skipped)."
        if action == "retry"
        else "They are marked cancelled: they leave the dead count and keep their last error."
    )
    if not count:
        return layout(frame, el("p", None, f"There are no dead {name} jobs."))
    return layout(
        frame,
        el(
            "p",
            {"class": "confirm", "id": "confirm-text"},
            f"{verb} {count} dead {name} job{'s' if count != 1 else ''}?",
        ),
        el("p", None, effect),
        post_form(
            f"{BASE}/bulk",
            frame.csrf or "",
            f"Yes, {verb.lower()} {count} job{'s' if count != 1 else ''}",
            el("input", {"type": "hidden", "name": "action", "value": action}),
            el("input", {"type": "hidden", "name": "name", "value": name}),
            el("input", {"type": "hidden", "name": "expected", "value": count}),
            danger=action == "cancel",
        ),
        el("a", {"href": url(f"{BASE}/jobs", status="failed", name=name)}, "No, back to the jobs"),
    )


# ---------------------------------------------------------------- workers


def workers_page(frame: Frame, workers: list[WorkerInfo], now: datetime) -> Markup:
    rows = []
    for w in workers:
        rows.append(
            (
                el("code", {"id": f"w-{w.id}"}, str(w.id)[:8]),
                f"{w.hostname}:{w.pid}",
                el(
                    "span",
                    {"class": "badge " + ("succeeded" if w.alive else "failed")},
                    "alive" if w.alive else "gone",
                ),
                "leader" if w.is_leader else "",
                f"{w.running_jobs} / {w.concurrency}",
                when(w.heartbeat_at, now),
                when(w.expires_at, now),
                when(w.started_at, now),
                w.version,
                el("a", {"href": f"{BASE}/workers/{w.id}/unlock"}, "force-unlock…")
                if frame.can_act
                else "",
            )
        )
    return layout(
        frame,
        table(
            [
                "Id",
                "Host:pid",
                "Heartbeat",
                "Role",
                "Running / slots",
                "Last heartbeat",
                "Expires",
                "Started",
                "Version",
                "",
            ],
            rows,
            "No worker is registered.",
        ),
        el(
            "p",
            {"class": "hint"},
            "A worker is alive while its heartbeat has not expired. The leader rescues the "
            "jobs of expired workers by itself; force-unlock does it now.",
        ),
    )


def unlock_page(frame: Frame, worker: WorkerInfo, jobs: list[Any], now: datetime) -> Markup:
    warning = (
        el(
            "p",
            {"class": "error"},
            f"This worker's heartbeat is live (last {ago(worker.heartbeat_at, now)}): "
            "if it is still running, its jobs may run twice.",
        )
        if worker.alive
        else el("p", None, f"Its heartbeat expired {ago(worker.expires_at, now)}.")
    )
    listing = table(
        ["Job", "Name", "Attempt", "Started"],
        [
            (
                el("a", {"href": f"{BASE}/jobs/{j['id']}"}, str(j["id"])),
                j["name"],
                f"{j['attempt']}/{j['max_attempts']}",
                # Claimed ahead (prefetch), not started yet.
                when(j["started_at"], now) if j["started_at"] is not None else "held",
            )
            for j in jobs
        ],
        "It holds no job.",
    )
    return layout(
        frame,
        el(
            "p",
            {"class": "confirm", "id": "confirm-text"},
            f"Force-unlock worker {worker.hostname}:{worker.pid} ({worker.id})? Its "
            f"{worker.running_jobs} running job{'s go' if worker.running_jobs != 1 else ' goes'} "
            "back to the queue (or fail, when out of attempts) and it is deregistered.",
        ),
        warning,
        listing,
        post_form(
            f"{BASE}/workers/{worker.id}/unlock", frame.csrf or "", "Yes, force-unlock", danger=True
        ),
        el("a", {"href": f"{BASE}/workers"}, "No, back to the workers"),
    )


# ---------------------------------------------------------------- crons


@dataclass(frozen=True, slots=True)
class CronView:
    row: Any
    zone: str
    upcoming: list[datetime]
    tz: Any
    problem: str | None


def crons_page(frame: Frame, crons: list[CronView], now: datetime) -> Markup:
    rows = []
    for c in crons:
        r = c.row
        last_job: Child = "—"
        if r["last_job_id"] is not None:
            last_job = join(
                el(
                    "a",
                    {"href": f"{BASE}/jobs/{r['last_job_id']}"},
                    str(r["last_job_id"])[:13] + "…",
                ),
                " ",
                badge(r["last_job_status"]) if r["last_job_status"] else "(pruned)",
            )
        upcoming: Child = (
            el("span", {"class": "error"}, c.problem)
            if c.problem
            else el(
                "ul",
                {"class": "plain"},
                [
                    el(
                        "li",
                        None,
                        when(t),
                        " ",
                        el(
                            "small",
                            None,
                            t.astimezone(c.tz).strftime("%a %H:%M %Z"),
                            ", ",
                            ago(t, now),
                        ),
                    )
                    for t in c.upcoming
                ],
            )
        )
        rows.append(
            (
                r["id"],
                r["job_name"],
                r["definition"],
                c.zone,
                upcoming,
                join(
                    when(r["last_occurrence"]),
                    " ",
                    el("small", None, ago(r["last_occurrence"], now)),
                ),
                last_job,
            )
        )
    return layout(
        frame,
        table(
            [
                "Schedule",
                "Job",
                "Definition",
                "Zone",
                "Next occurrences",
                "Last occurrence",
                "Its job",
            ],
            rows,
            "No cron schedule is recorded: workers record theirs when they start (--crons).",
        ),
    )
