"""The operator console: server-rendered pages under /ui of ``pgfleet api``.

Signing in takes a credential of the viewer or operator role (a login form that
sets an HttpOnly, SameSite=Strict session cookie, Secure behind TLS); a session is
a row every replica reads, so logging out or revoking the credential ends it at
once (auth.py). Each page and action declares the access it needs
(``@requires``): viewers see, operators act. Every change is a POST that must
carry the session's CSRF token and, when the browser says where it comes from,
an Origin of this host; every change is audited with the credential's name.
Pages are sent with a strict Content-Security-Policy (scripts and styles
from /ui/static only, no inline script) and are never cached. The console has its
own small pool, which plans every statement with its actual parameters (no
statement cache).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any, cast
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
from pgfleet.jobs import Job, JobStatus, validate_name
from pgfleet.queue import Queue, create_pool
from pgfleet.service.access import AccessDenied, Gate, audit
from pgfleet.service.api import CREDENTIAL
from pgfleet.service.console import pages
from pgfleet.service.console.auth import (
    COOKIE_PATH,
    CSRF_FIELD,
    LOGIN_COOKIE,
    LOGIN_CSRF_FIELD,
    LOGIN_LIFETIME,
    SESSION_COOKIE,
    Session,
    Sessions,
    login_csrf_ok,
    login_nonce,
)
from pgfleet.service.console.data import ConsoleData, JobFilter
from pgfleet.service.console.html import Markup
from pgfleet.service.console.pages import BASE, Frame
from pgfleet.service.credentials import ANONYMOUS, Access, access_of, requires
from pgfleet.service.guard import Peer
from pgfleet.service.redaction import Redactor

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

Handler = Callable[[web.Request, "Visit"], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """``pgfleet api`` console flags."""

    #: Show payloads (behind a click) to the operator role. False: never rendered.
    payloads: bool = True
    #: Seconds between automatic refreshes of the overview (0: none).
    refresh: int = 5
    #: Connections of the console's own pool.
    pool_size: int = 4
    #: What payloads and errors show.
    redactor: Redactor = dataclasses.field(default_factory=Redactor)


@dataclass(frozen=True, slots=True)
class Visit:
    """A console request: who made it, and their session (None before login)."""

    peer: Peer
    session: Session | None = None

    @property
    def csrf(self) -> str:
        return self.session.csrf if self.session else ""

    def can(self, access: Access) -> bool:
        return self.session is not None and self.session.credential.role.allows(access)


class Refused(Exception):
    """A request the console answers with an error page."""

    def __init__(self, status: int, title: str, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.title = title
        self.text = text


class Console:
    """Adds the console's routes to an aiohttp application."""

    def __init__(
        self, config: ConsoleConfig, gate: Gate, *, metrics_holder: UUID | None = None
    ) -> None:
        self.config = config
        self.gate = gate
        self.metrics_holder = metrics_holder
        self.sessions: Sessions | None = None
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
            access = self.gate.config
            self.sessions = Sessions(
                db,
                self.gate.credentials,
                lifetime=access.session_lifetime,
                idle=access.session_idle,
            )

        async def close_pool(_app: web.Application) -> None:
            if self.data is not None:
                await self.data.queue.flush_notifications()
                await close_bounded_pool(self.data.pool)
                self.data = None

        app.on_startup.append(open_pool)
        app.on_cleanup.append(close_pool)
        self.routes(app)

    def routes(self, app: web.Application) -> None:
        """Each handler declares its access with ``@requires``; ``_page`` and
        ``_action`` carry it to the route (pages are GETs, actions POSTs with CSRF)."""
        r = app.router
        r.add_get(BASE, self._redirect_home)
        r.add_get(f"{BASE}/static/{{name}}", self.static)
        r.add_get(f"{BASE}/login", self._page(self.login_form))
        r.add_post(f"{BASE}/login", self._page(self.login))
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

    def _page(self, handler: Handler) -> Any:
        access = access_of(handler)

        @requires(access)
        async def wrapped(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, handler, access, action=False)

        return wrapped

    def _action(self, handler: Handler) -> Any:
        access = access_of(handler)

        @requires(access)
        async def wrapped(request: web.Request) -> web.StreamResponse:
            return await self._serve(request, handler, access, action=True)

        return wrapped

    async def _serve(  # noqa: C901 - one except per error kind, each its page
        self, request: web.Request, handler: Handler, access: Access, *, action: bool
    ) -> web.StreamResponse:
        started = time.perf_counter()
        visit = Visit(self._peer(request))
        response: web.StreamResponse
        try:
            if not self.gate.auth:
                raise Refused(
                    403,
                    "Console unavailable",
                    "The console signs in with a viewer or operator credential, and this API "
                    "has none: start pgfleet api with PGFLEET_API_CREDENTIALS (or "
                    "PGFLEET_API_TOKEN).",
                )
            if request.method == "POST":
                self._check_origin(request, visit.peer)
            if access is not Access.PUBLIC:
                visit = await self._signed_in(request, visit, access, action=action)
            if action:
                form = await request.post()
                assert visit.session is not None
                if not visit.session.csrf_ok(_field(form, CSRF_FIELD)):
                    raise Refused(
                        403,
                        "Refused",
                        "Missing or invalid CSRF token: reload the page and try again.",
                    )
            response = await handler(request, visit)
        except _Redirect as exc:
            response = exc.response
        except AccessDenied as exc:
            response = self._html(
                pages.message_page("Refused", exc.message, _csrf(visit)), exc.status
            )
            response.headers.update(exc.headers)
        except Refused as exc:
            response = self._html(pages.message_page(exc.title, exc.text, _csrf(visit)), exc.status)
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

    async def _signed_in(
        self, request: web.Request, visit: Visit, access: Access, *, action: bool
    ) -> Visit:
        """The visit with its session, or a redirect to the login form (a page) or
        a refusal (an action, or a role that does not allow ``access``)."""
        cookie = request.cookies.get(SESSION_COOKIE)
        session = await self._sessions.find(cookie)
        if session is None:
            if cookie:
                # Ended (logged out, expired, idle, revoked): 401 and the login form.
                response = self._login_response(
                    request, "Your session has ended: sign in again.", 401, request.path_qs
                )
                response.del_cookie(SESSION_COOKIE, path=COOKIE_PATH)
                raise _Redirect(response)
            if action:
                raise Refused(
                    403, "Not signed in", "Sign in first: this request had no valid session."
                )
            raise _Redirect(_redirect(pages.url(f"{BASE}/login", next=request.path_qs)))
        visit = Visit(visit.peer, session)
        # The API's access log names who made the request.
        request[CREDENTIAL] = session.credential
        self.gate.authorize(session.credential, access, visit.peer, request.path)
        return visit

    @property
    def _sessions(self) -> Sessions:
        if self.sessions is None:
            raise DatabaseUnavailable("the console's pool is not open")
        return self.sessions

    def _peer(self, request: web.Request) -> Peer:
        return self.gate.peer(request.remote, request.scheme, request.host, request.headers)

    def _finish(self, response: web.StreamResponse, started: float) -> web.StreamResponse:
        elapsed = (time.perf_counter() - started) * 1000
        response.headers.update(SECURITY_HEADERS)
        response.headers["Cache-Control"] = "no-store"
        response.headers["Server-Timing"] = f"render;dur={elapsed:.1f}"
        return response

    def _check_origin(self, request: web.Request, peer: Peer) -> None:
        origin = request.headers.get("Origin")
        if origin is None:
            return
        if origin == "null" or urlsplit(origin).netloc != (peer.host or request.host):
            raise Refused(403, "Refused", "This request came from another site.")

    def _html(self, body: Markup, status: int = 200) -> web.Response:
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    def _frame(self, visit: Visit, title: str, section: str, **kw: Any) -> Frame:
        session = visit.session
        who = None
        if session is not None:
            who = f"{session.credential.name} ({session.credential.role.value})"
            kw.setdefault("notice", session.notice)
        return Frame(
            visit.csrf or None, title, section, who=who, can_act=visit.can(Access.OPERATE), **kw
        )

    def _cookie(
        self, response: web.Response, request: web.Request, name: str, value: str, max_age: int
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=COOKIE_PATH,
            httponly=True,
            samesite="Strict",
            secure=request.secure or self.gate.config.secure_cookies,
        )

    @property
    def _data(self) -> ConsoleData:
        if self.data is None:
            raise DatabaseUnavailable("the console's pool is not open")
        return self.data

    @requires(Access.PUBLIC)
    async def _redirect_home(self, _request: web.Request) -> web.StreamResponse:
        return _redirect(f"{BASE}/")

    @requires(Access.PUBLIC)
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

    @requires(Access.PUBLIC)
    async def login_form(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        return self._login_response(request, None, 200)

    def _login_response(
        self, request: web.Request, error: str | None, status: int, next_path: str | None = None
    ) -> web.Response:
        nonce = login_nonce()
        next_path = _safe_next(next_path or request.query.get("next"))
        response = self._html(pages.login_page(nonce, next_path, error), status)
        self._cookie(response, request, LOGIN_COOKIE, nonce, LOGIN_LIFETIME)
        return response

    @requires(Access.PUBLIC)
    async def login(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        self.gate.throttle(visit.peer)
        form = await request.post()
        if not login_csrf_ok(request.cookies.get(LOGIN_COOKIE), _field(form, LOGIN_CSRF_FIELD)):
            raise Refused(
                403, "Refused", "The login form expired or came from elsewhere: reload it."
            )
        credential = await self.gate.identify(
            (_field(form, "token") or "").strip(), visit.peer, "console login"
        )
        if credential is None:
            return self._login_response(request, "Wrong token.", 401)
        if not credential.role.allows(Access.OBSERVE):
            self.gate.authorize(credential, Access.OBSERVE, visit.peer, "console login")
        cookie = await self._sessions.open(credential)
        audit(credential, visit.peer, "console login")
        response = _redirect(_safe_next(_field(form, "next")))
        self._cookie(
            response, request, SESSION_COOKIE, cookie, int(self.gate.config.session_lifetime)
        )
        response.del_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
        return response

    @requires(Access.OBSERVE)
    async def logout(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        assert visit.session is not None
        await self._sessions.close(visit.session)
        audit(visit.session.credential, visit.peer, "console logout")
        response = _redirect(f"{BASE}/login")
        response.del_cookie(SESSION_COOKIE, path=COOKIE_PATH)
        return response

    # ------------------------------------------------------------ pages

    @requires(Access.OBSERVE)
    async def overview(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        data = await self._data.overview()
        frame = self._frame(visit, "Overview", "overview", refresh=self.config.refresh)
        return self._html(pages.overview_page(frame, data, self.metrics_holder))

    @requires(Access.OBSERVE)
    async def jobs(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        q = request.query
        f = JobFilter(
            status=_status(q.get("status")),
            name=_job_name(q),
            queue=q.get("queue") or None,
            key=q.get("key") or None,
            since=_moment(q.get("from"), "from"),
            until=_moment(q.get("to"), "to"),
        )
        before = _uuid(q.get("before"), "before") if q.get("before") else None
        page = await self._data.jobs(f, before, PAGE_SIZE)
        page = dataclasses.replace(page, rows=cast(Any, [self._redacted_row(r) for r in page.rows]))
        now = await self._data.now()
        return self._html(pages.jobs_page(self._frame(visit, "Jobs", "jobs"), f, page, before, now))

    @requires(Access.OBSERVE)
    async def job(
        self, request: web.Request, visit: Visit, *, show: bool = False
    ) -> web.StreamResponse:
        job_id = request.match_info["id"]
        job = await self._data.queue.get(job_id)
        if job is None:
            raise JobNotFound(job_id)
        may_see = self.config.payloads and visit.can(Access.PAYLOADS)
        if show and not self.config.payloads:
            raise Refused(403, "Payload hidden", "Payload display is turned off on this console.")
        if show and not may_see:
            raise Refused(403, "Payload hidden", "Payloads are shown to the operator role only.")
        now = await self._data.now()
        parents = await self._data.queue.parents(job.id, limit=100)
        children = await self._data.queue.children(job.id, limit=100)
        batch = None
        if parents and all(p.batch for p in parents):
            batch = await self._data.queue.batch_progress(job.id)
        done = pages.DONE_MESSAGES.get(request.query.get("done", ""))
        live = job.status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.WAITING)
        frame = self._frame(visit, f"Job {job.name}", "jobs", refresh=3 if live else 0)
        if done:
            frame = dataclasses.replace(frame, notice=done)
        page = pages.job_page(
            frame,
            self._redacted(job, with_payload=show),
            now,
            payloads=may_see,
            show_payload=show,
            hidden_note=(
                "Payload display is turned off on this console."
                if not self.config.payloads
                else "Payloads are shown to the operator role only."
            ),
            parents=parents,
            children=children,
            batch=batch,
        )
        return self._html(page)

    @requires(Access.PAYLOADS)
    async def job_payload(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        return await self.job(request, visit, show=True)

    @requires(Access.OPERATE)
    async def job_action(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        job_id = request.match_info["id"]
        action = request.path.rsplit("/", 1)[1]
        queue = self._data.queue
        form = await request.post()
        if action == "retry":
            job = await queue.retry(job_id)
            done = "retried"
        elif action == "cancel":
            who = visit.session.credential.name if visit.session is not None else "anonymous"
            job = await queue.cancel(job_id, by=f"console:{who}"[:200])
            done = "cancelled" if job.status is JobStatus.CANCELLED else "cancel_requested"
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
        self._audit(visit, "%s job %s (%s)", action, job.id, job.name)
        return _redirect(pages.url(f"{BASE}/jobs/{job.id}", done=done))

    @requires(Access.OPERATE)
    async def bulk_confirm(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        action, name = _bulk_args(request.query.get("action"), _job_name(request.query))
        count = await self._data.dead_count(name)
        verb = "Retry" if action == "retry" else "Cancel"
        frame = self._frame(visit, f"{verb} dead {name} jobs", "jobs")
        return self._html(pages.bulk_page(frame, action, name, count))

    @requires(Access.OPERATE)
    async def bulk(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        form = await request.post()
        action, name = _bulk_args(
            _field(form, "action"), _field(form, "name") or _field(form, "kind")
        )
        if action == "retry":
            done, skipped = await self._data.retry_dead(name)
        else:
            done, skipped = await self._data.cancel_dead(name), 0
        self._audit(
            visit, "bulk %s of dead %s jobs: %d done, %d skipped", action, name, done, skipped
        )
        verb = "Retried" if action == "retry" else "Cancelled"
        text = f"{verb} {done} dead {name} job(s)"
        expected = _int(_field(form, "expected"))
        if expected:
            text += f" ({expected} when confirmed)"
        if skipped:
            text += f"; {skipped} skipped: another job holds their key"
        # The outcome travels in the session, never in the URL: a link cannot make
        # this page say something the server did not do.
        await self._notice(visit, text + ".")
        return _redirect(f"{BASE}/")

    @requires(Access.OBSERVE)
    async def workers(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        workers = await self._data.queue.workers()
        now = await self._data.now()
        frame = self._frame(visit, "Workers", "workers", refresh=self.config.refresh)
        return self._html(pages.workers_page(frame, workers, now))

    @requires(Access.OPERATE)
    async def unlock_confirm(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        worker_id = _uuid(request.match_info["id"], "worker id")
        worker = next((w for w in await self._data.queue.workers() if w.id == worker_id), None)
        if worker is None:
            raise Refused(404, "Not found", f"No registered worker {worker_id}.")
        jobs = [self._redacted_row(r) for r in await self._data.worker_jobs(worker_id)]
        now = await self._data.now()
        frame = self._frame(visit, f"Force-unlock {worker.hostname}:{worker.pid}", "workers")
        return self._html(pages.unlock_page(frame, worker, jobs, now))

    @requires(Access.OPERATE)
    async def unlock(self, request: web.Request, visit: Visit) -> web.StreamResponse:
        worker_id = _uuid(request.match_info["id"], "worker id")
        result = await self._data.queue.force_unlock_worker(worker_id)
        self._audit(visit, "force-unlocked worker %s: %s", worker_id, result)
        await self._notice(
            visit,
            f"Worker force-unlocked: {int(result.get('requeued', 0))} job(s) requeued, "
            f"{int(result.get('failed', 0))} failed.",
        )
        return _redirect(f"{BASE}/workers")

    @requires(Access.OBSERVE)
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

    # ------------------------------------------------------------ helpers

    def _audit(self, visit: Visit, action: str, *args: object) -> None:
        who = visit.session.credential if visit.session else ANONYMOUS
        audit(who, visit.peer, "console: " + action, *args)

    async def _notice(self, visit: Visit, text: str) -> None:
        if visit.session is not None:
            await self._sessions.notice(visit.session, text)

    def _redacted(self, job: Job, *, with_payload: bool) -> Job:
        redactor = self.config.redactor
        return dataclasses.replace(
            job,
            payload=redactor.payload(job.name, job.payload) if with_payload else None,
            last_error=redactor.error(job.name, job.last_error),
            errors=tuple(
                dataclasses.replace(e, error=redactor.error(job.name, e.error) or "")
                for e in job.errors
            ),
            result=redactor.payload(job.name, job.result),
        )

    def _redacted_row(self, row: Any) -> dict[str, Any]:
        out = dict(row)
        if "last_error" in out:
            out["last_error"] = self.config.redactor.error(str(out.get("name")), out["last_error"])
        return out


class _Redirect(Exception):
    """Answer with this instead: the login form, or a redirect to it."""

    def __init__(self, response: web.Response) -> None:
        super().__init__(response.headers.get("Location", ""))
        self.response = response


# ---------------------------------------------------------------- helpers


def _csrf(visit: Visit | None) -> str | None:
    return visit.csrf if visit is not None and visit.csrf else None


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


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
