"""The operator console: server-rendered pages under /ui of ``pgfleet api``.

Signing in takes the API's own token (a login form that sets an HttpOnly,
SameSite=Strict session cookie). Every change is a POST that must carry the
session's CSRF token and, when the browser says where it comes from, an Origin of
this host. Pages are sent with a strict Content-Security-Policy (scripts and styles
from /ui/static only, no inline script) and are never cached. The console has its
own small pool, which plans every statement with its actual parameters (no
statement cache).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from aiohttp import web

from pgfleet.cron.describe import next_occurrences, parse_definition
from pgfleet.db.deadlines import DEFAULT_DATABASE_TIMEOUT, BoundedPool
from pgfleet.db.deadlines import close_pool as close_bounded_pool
from pgfleet.errors import (
    DatabaseUnavailable,
    DuplicateJobKey,
    InvalidJobState,
    JobNotFound,
    PgfleetError,
    SchemaNotReady,
    ValidationError,
)
from pgfleet.jobs import JobStatus, validate_name
from pgfleet.queue import Queue, create_pool
from pgfleet.service.console import pages
from pgfleet.service.console.auth import (
    COOKIE_PATH,
    CSRF_FIELD,
    LOGIN_COOKIE,
    LOGIN_CSRF_FIELD,
    LOGIN_LIFETIME,
    SESSION_COOKIE,
    Sessions,
)
from pgfleet.service.console.data import ConsoleData, JobFilter
from pgfleet.service.console.html import Markup
from pgfleet.service.console.pages import BASE, Frame

log = logging.getLogger("pgfleet")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
STATIC_TYPES = {
    "console.css": "text/css",
    "console.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
PAGE_SIZE = 50
#: Seconds a failed login waits before answering: guessing tokens stays slow.
LOGIN_FAILURE_DELAY = 0.5

Handler = Callable[[web.Request, "Visit"], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """``pgfleet api`` console flags."""

    #: The API's bearer token; the console refuses every page without one.
    token: str | None
    #: Show payloads (behind a click). False: never rendered.
    payloads: bool = True
    #: Seconds between automatic refreshes of the overview (0: none).
    refresh: int = 5
    #: Seconds a login lasts.
    session_lifetime: float = 12 * 3600
    #: Connections of the console's own pool.
    pool_size: int = 4


@dataclass(frozen=True, slots=True)
class Visit:
    """A signed-in request: its session id and CSRF token."""

    session: str
    csrf: str


class Refused(Exception):
    """A request the console answers with an error page."""

    def __init__(self, status: int, title: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.title = title
        self.text = text


class Console:
    """Adds the console's routes to an aiohttp application."""

    def __init__(self, config: ConsoleConfig, *, metrics_holder: UUID | None = None) -> None:
        self.config = config
        self.metrics_holder = metrics_holder
        self.sessions = (
            None if config.token is None else Sessions(config.token, config.session_lifetime)
        )
        self.data: ConsoleData | None = None
        self._static = {
            name: resources.files("pgfleet.service.console").joinpath("static", name).read_bytes()
            for name in STATIC_TYPES
        }

    async def attach(
        self, app: web.Application, dsn: str, database_timeout: float = DEFAULT_DATABASE_TIMEOUT
    ) -> None:
        """Route /ui on ``app``; the console's pool opens and closes with the app.
        Every call of the console is bounded by ``database_timeout`` seconds."""

        async def open_pool(_app: web.Application) -> None:
            pool = await create_pool(
                dsn,
                min_size=0,
                max_size=self.config.pool_size,
                timeout=5.0,
                # No named prepared statements: each query is planned with its actual
                # parameters (a status filter picks its partial index), and the pool
                # works behind PgBouncer in transaction mode.
                statement_cache_size=0,
            )
            db = BoundedPool(pool, database_timeout)
            self.data = ConsoleData(db, Queue(db))

        async def close_pool(_app: web.Application) -> None:
            if self.data is not None:
                await self.data.queue.flush_notifications()
                await close_bounded_pool(self.data.pool)
                self.data = None

        app.on_startup.append(open_pool)
        app.on_cleanup.append(close_pool)
        self.routes(app)

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get(BASE, self._redirect_home)
        r.add_get(f"{BASE}/static/{{name}}", self.static)
        r.add_get(f"{BASE}/login", self._page(self.login_form, public=True))
        r.add_post(f"{BASE}/login", self._page(self.login, public=True))
        r.add_post(f"{BASE}/logout", self._action(self.logout))
        r.add_get(f"{BASE}/", self._page(self.overview))
        r.add_get(f"{BASE}/jobs", self._page(self.jobs))
        r.add_get(f"{BASE}/jobs/{{id}}", self._page(self.job))
        r.add_get(f"{BASE}/jobs/{{id}}/payload", self._page(self.job_payload))
        for action in ("retry", "cancel", "fail", "reschedule"):
            r.add_post(f"{BASE}/jobs/{{id}}/{action}", self._action(self.job_action))
        r.add_get(f"{BASE}/bulk", self._page(self.bulk_confirm))
        r.add_post(f"{BASE}/bulk", self._action(self.bulk))
        r.add_get(f"{BASE}/workers", self._page(self.workers))
        r.add_get(f"{BASE}/workers/{{id}}/unlock", self._page(self.unlock_confirm))
        r.add_post(f"{BASE}/workers/{{id}}/unlock", self._action(self.unlock))
        r.add_get(f"{BASE}/crons", self._page(self.crons))

    # ------------------------------------------------------------ plumbing

    def _page(self, handler: Handler, *, public: bool = False) -> Any:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, handler, public=public, action=False)

        return wrapped

    def _action(self, handler: Handler) -> Any:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, handler, public=False, action=True)

        return wrapped

    async def _serve(
        self, request: web.Request, handler: Handler, *, public: bool, action: bool
    ) -> web.StreamResponse:
        started = time.perf_counter()
        visit: Visit | None = None
        response: web.StreamResponse
        try:
            if self.sessions is None:
                raise Refused(
                    403,
                    "Console unavailable",
                    "The console signs in with the API's token, and this API has none: "
                    "start pgfleet api with PGFLEET_API_TOKEN (or --auth-token).",
                )
            if request.method == "POST":
                self._check_origin(request)
            session = self.sessions.session_id(request.cookies.get(SESSION_COOKIE))
            if session is not None:
                visit = Visit(session, self.sessions.csrf(session))
            elif not public:
                if action:
                    raise Refused(
                        403, "Not signed in", "Sign in first: this request had no valid session."
                    )
                response = _redirect(pages.url(f"{BASE}/login", next=request.path_qs))
                return self._finish(response, started)
            if action:
                assert visit is not None
                form = await request.post()
                if not self.sessions.csrf_ok(visit.session, _field(form, CSRF_FIELD)):
                    raise Refused(
                        403,
                        "Refused",
                        "Missing or invalid CSRF token: reload the page and try again.",
                    )
            response = await handler(request, visit or Visit("", ""))
        except Refused as exc:
            response = self._html(
                pages.message_page(exc.title, exc.text, visit.csrf if visit else None), exc.status
            )
        except JobNotFound as exc:
            response = self._html(pages.message_page("Not found", str(exc), _csrf(visit)), 404)
        except (InvalidJobState, DuplicateJobKey) as exc:
            response = self._html(
                pages.message_page("Refused", f"{exc}; nothing was changed.", _csrf(visit)), 409
            )
        except ValidationError as exc:
            response = self._html(pages.message_page("Bad request", str(exc), _csrf(visit)), 400)
        except (DatabaseUnavailable, SchemaNotReady) as exc:
            # The details (addresses, driver messages) go to the log, not the page.
            log.warning("console: %s", exc)
            text = (
                "The database schema is not ready: run pgfleet migrate."
                if isinstance(exc, SchemaNotReady)
                else "The database did not answer; the api's log says why. Try again shortly."
            )
            response = self._html(
                pages.message_page("Database unavailable", text, _csrf(visit)), 503
            )
        except PgfleetError as exc:
            log.error("console: %s", exc)
            response = self._html(pages.message_page("Error", "internal error", _csrf(visit)), 500)
        return self._finish(response, started)

    def _finish(self, response: web.StreamResponse, started: float) -> web.StreamResponse:
        elapsed = (time.perf_counter() - started) * 1000
        response.headers.update(SECURITY_HEADERS)
        response.headers["Cache-Control"] = "no-store"
        response.headers["Server-Timing"] = f"render;dur={elapsed:.1f}"
        return response

    def _check_origin(self, request: web.Request) -> None:
        origin = request.headers.get("Origin")
        if origin is None:
            return
        if origin == "null" or urlsplit(origin).netloc != request.host:
            raise Refused(403, "Refused", "This request came from another site.")

    def _html(self, body: Markup, status: int = 200) -> web.Response:
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    def _frame(self, visit: Visit, title: str, section: str, **kw: Any) -> Frame:
        return Frame(visit.csrf or None, title, section, **kw)

    @property
    def _data(self) -> ConsoleData:
        if self.data is None:
            raise DatabaseUnavailable("the console's pool is not open")
        return self.data

    async def _redirect_home(self, _request: web.Request) -> web.StreamResponse:
        return _redirect(f"{BASE}/")

    async def static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self._static:
            return web.Response(status=404, text="not found")
        return web.Response(
            body=self._static[name],
            content_type=STATIC_TYPES[name],
            headers={**SECURITY_HEADERS, "Cache-Control": "max-age=300"},
        )

    # ------------------------------------------------------------ login

    async def login_form(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        return self._login_response(request, None, 200)

    def _login_response(self, request: web.Request, error: str | None, status: int) -> web.Response:
        assert self.sessions is not None
        nonce = self.sessions.login_nonce()
        next_path = _safe_next(request.query.get("next"))
        response = self._html(
            pages.login_page(self.sessions.login_csrf(nonce), next_path, error), status
        )
        _set_cookie(response, request, LOGIN_COOKIE, nonce, LOGIN_LIFETIME)
        return response

    async def login(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        assert self.sessions is not None
        form = await request.post()
        if not self.sessions.login_csrf_ok(
            request.cookies.get(LOGIN_COOKIE), _field(form, LOGIN_CSRF_FIELD)
        ):
            raise Refused(
                403, "Refused", "The login form expired or came from elsewhere: reload it."
            )
        if not self.sessions.token_matches(_field(form, "token") or ""):
            await asyncio.sleep(LOGIN_FAILURE_DELAY)
            log.warning("console: failed login from %s", request.remote)
            return self._login_response(request, "Wrong token.", 401)
        response = _redirect(_safe_next(_field(form, "next")))
        _set_cookie(
            response,
            request,
            SESSION_COOKIE,
            self.sessions.issue(),
            int(self.config.session_lifetime),
        )
        response.del_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
        return response

    async def logout(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        response = _redirect(f"{BASE}/login")
        response.del_cookie(SESSION_COOKIE, path=COOKIE_PATH)
        return response

    # ------------------------------------------------------------ pages

    async def overview(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        data = await self._data.overview()
        notice = _bulk_notice(request)
        frame = self._frame(
            visit, "Overview", "overview", refresh=self.config.refresh, notice=notice
        )
        return self._html(pages.overview_page(frame, data, self.metrics_holder))

    async def jobs(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        q = request.query
        f = JobFilter(
            status=_status(q.get("status")),
            name=_job_name(q),
            queue=q.get("queue") or None,
            since=_moment(q.get("from"), "from"),
            until=_moment(q.get("to"), "to"),
        )
        before = _uuid(q.get("before"), "before") if q.get("before") else None
        page = await self._data.jobs(f, before, PAGE_SIZE)
        now = await self._data.now()
        return self._html(pages.jobs_page(self._frame(visit, "Jobs", "jobs"), f, page, before, now))

    async def job(
        self, request: web.Request, visit: Visit, *, show: bool = False
    ) -> web.StreamResponse:
        job_id = request.match_info["id"]
        job = await self._data.queue.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        if show and not self.config.payloads:
            raise Refused(403, "Payload hidden", "Payload display is turned off on this console.")
        now = await self._data.now()
        done = pages.DONE_MESSAGES.get(request.query.get("done", ""))
        live = job.status in (JobStatus.QUEUED, JobStatus.RUNNING)
        frame = self._frame(visit, f"Job {job.name}", "jobs", notice=done, refresh=3 if live else 0)
        page = pages.job_page(frame, job, now, payloads=self.config.payloads, show_payload=show)
        return self._html(page)

    async def job_payload(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        return await self.job(request, visit, show=True)

    async def job_action(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        job_id = request.match_info["id"]
        action = request.path.rsplit("/", 1)[1]
        queue = self._data.queue
        form = await request.post()
        if action == "retry":
            job = await queue.retry(job_id)
            done = "retried"
        elif action == "cancel":
            job = await queue.cancel(job_id)
            done = "cancelled"
        elif action == "fail":
            reason = (_field(form, "reason") or "").strip() or "failed by operator"
            job = await queue.permanently_fail(job_id, reason[:1000])
            done = "failed"
        else:
            at = _moment(_field(form, "at"), "at")
            delay_text = (_field(form, "delay") or "").strip()
            delay = _number(delay_text, "delay") if delay_text else None
            if at is not None and delay is not None:
                raise Refused(400, "Bad request", "Give a delay or a time, not both.")
            job = await queue.reschedule(job_id, run_at=at, delay=delay)
            done = "rescheduled"
        log.info("console: %s job %s (%s)", action, job.id, job.name)
        return _redirect(pages.url(f"{BASE}/jobs/{job.id}", done=done))

    async def bulk_confirm(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        action, name = _bulk_args(request.query.get("action"), _job_name(request.query))
        count = await self._data.dead_count(name)
        verb = "Retry" if action == "retry" else "Cancel"
        frame = self._frame(visit, f"{verb} dead {name} jobs", "jobs")
        return self._html(pages.bulk_page(frame, action, name, count))

    async def bulk(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        form = await request.post()
        action, name = _bulk_args(
            _field(form, "action"), _field(form, "name") or _field(form, "kind")
        )
        if action == "retry":
            done, skipped = await self._data.retry_dead(name)
        else:
            done, skipped = await self._data.cancel_dead(name), 0
        log.info(
            "console: bulk %s of dead %s jobs: %d done, %d skipped", action, name, done, skipped
        )
        return _redirect(
            pages.url(
                f"{BASE}/",
                bulk=action,
                name=name,
                n=done,
                skipped=skipped,
                expected=_field(form, "expected"),
            )
        )

    async def workers(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        workers = await self._data.queue.workers()
        now = await self._data.now()
        notice = None
        if request.query.get("unlocked"):
            notice = (
                f"Worker force-unlocked: {_int(request.query.get('requeued'))} job(s) requeued, "
                f"{_int(request.query.get('failed'))} failed."
            )
        frame = self._frame(visit, "Workers", "workers", refresh=self.config.refresh, notice=notice)
        return self._html(pages.workers_page(frame, workers, now))

    async def unlock_confirm(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        worker_id = _uuid(request.match_info["id"], "worker id")
        worker = next((w for w in await self._data.queue.workers() if w.id == worker_id), None)
        if worker is None:
            raise Refused(404, "Not found", f"No registered worker {worker_id}.")
        jobs = await self._data.worker_jobs(worker_id)
        now = await self._data.now()
        frame = self._frame(visit, f"Force-unlock {worker.hostname}:{worker.pid}", "workers")
        return self._html(pages.unlock_page(frame, worker, jobs, now))

    async def unlock(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        worker_id = _uuid(request.match_info["id"], "worker id")
        result = await self._data.queue.force_unlock_worker(worker_id)
        log.info("console: force-unlocked worker %s: %s", worker_id, result)
        return _redirect(
            pages.url(
                f"{BASE}/workers",
                unlocked=1,
                requeued=result.get("requeued", 0),
                failed=result.get("failed", 0),
            )
        )

    async def crons(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        now, rows = await self._data.crons()
        views = []
        for row in rows:
            try:
                cron = parse_definition(row["id"], row["job_name"], row["definition"])
            except ValueError as exc:
                views.append(pages.CronView(row, "?", [], UTC, str(exc)))
                continue
            upcoming = next_occurrences(cron, max(now, row["last_occurrence"]), 3)
            views.append(
                pages.CronView(row, cron.timezone or "UTC (interval)", upcoming, cron.zone, None)
            )
        frame = self._frame(visit, "Cron schedules", "crons")
        return self._html(pages.crons_page(frame, views, now))


# ---------------------------------------------------------------- helpers


def _csrf(visit: Visit | None) -> str | None:
    return visit.csrf if visit is not None and visit.csrf else None


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def _set_cookie(
    response: web.Response, request: web.Request, name: str, value: str, max_age: int
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _safe_next(value: str | None) -> str:
    """Only a path of this console: never another site (//evil, https://...)."""
    if value and value.startswith(f"{BASE}/") and not value.startswith("//") and "\\" not in value:
        return value
    return f"{BASE}/"


def _status(value: str | None) -> JobStatus | None:
    if not value:
        return None
    if value == "dead":
        return JobStatus.FAILED
    try:
        return JobStatus(value)
    except ValueError:
        allowed = ", ".join(s.value for s in JobStatus)
        raise Refused(
            400, "Bad request", f"unknown status {value!r}: use one of {allowed}"
        ) from None


def _moment(value: str | None, what: str) -> datetime | None:
    if not value or not value.strip():
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        raise Refused(
            400,
            "Bad request",
            f"{what} must be a date and time like 2026-01-31T14:05, got {value!r}",
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _uuid(value: str | None, what: str) -> UUID:
    try:
        return UUID(str(value))
    except ValueError:
        raise Refused(400, "Bad request", f"{what} must be a UUID, got {value!r}") from None


def _number(value: str, what: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise Refused(
            400, "Bad request", f"{what} must be a number of seconds, got {value!r}"
        ) from None


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _job_name(query: Mapping[str, str]) -> str | None:
    # ``kind`` is the parameter's old name: links and bookmarks made with it still work.
    return query.get("name") or query.get("kind") or None


def _bulk_args(action: str | None, name: str | None) -> tuple[str, str]:
    if action not in ("retry", "cancel"):
        raise Refused(400, "Bad request", f"action must be retry or cancel, got {action!r}")
    if not name:
        raise Refused(400, "Bad request", "job name is missing")
    validate_name(name, "job name")
    return action, name


def _bulk_notice(request: web.Request) -> str | None:
    q = request.query
    action = q.get("bulk")
    name = _job_name(q)
    if action not in ("retry", "cancel") or not name:
        return None
    verb = "Retried" if action == "retry" else "Cancelled"
    text = f"{verb} {_int(q.get('n'))} dead {name} job(s)"
    if q.get("expected"):
        text += f" ({_int(q.get('expected'))} when confirmed)"
    if _int(q.get("skipped")):
        text += f"; {_int(q.get('skipped'))} skipped: another job holds their key"
    return text + "."
