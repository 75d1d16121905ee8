"""The HTTP jobs API: 202 Accepted + Location and a status record, backed by the durable queue.

Accepting a job means it is committed in Postgres: the answer comes after the
commit, so a 202 survives this process, the workers and the database restarting.
Every refusal (4xx, 503) happens before anything is written.

Every endpoint declares the access it needs with ``@requires(Access.…)``
(pgfleet/service/credentials.py); the middleware checks the request's credential
against it before the handler runs, and the application refuses to start with
an endpoint that declares nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from pgfleet._runtime import tracing
from pgfleet._runtime.tracing import otel_context
from pgfleet.errors import (
    DatabaseUnavailable,
    DuplicateJobKey,
    InvalidJobState,
    JobNotFound,
    PayloadTooLarge,
    PgfleetError,
    SchemaNotReady,
    ValidationError,
    missing_job,
)
from pgfleet.jobs import EnqueueRequest, Job, JobStatus, validate_name
from pgfleet.queue import Queue
from pgfleet.service.access import AccessConfig, AccessDenied, Gate, audit
from pgfleet.service.api_schema import (
    EnqueueBody,
    Limits,
    RequestError,
    check_content_type,
    decode_json,
    parse_batch,
    parse_enqueue,
    parse_limits,
    parse_list_query,
    parse_pause,
    parse_wait_query,
)
from pgfleet.service.credentials import ANONYMOUS, Access, Credential, access_of, requires
from pgfleet.service.guard import Peer
from pgfleet.service.http import database_ready
from pgfleet.service.openapi import openapi_document
from pgfleet.service.redaction import Redactor
from pgfleet.service.views import (
    batch_view,
    job_view,
    limit_view,
    paused_view,
    relative_view,
    timestamp,
)

log = logging.getLogger("pgfleet")
access_log = logging.getLogger("pgfleet.access")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Where the middleware leaves the client and the credential of a request.
PEER = web.RequestKey("pgfleet_peer", Peer)
CREDENTIAL = web.RequestKey("pgfleet_credential", Credential)
#: The console's routes: it signs in with sessions, not bearer tokens.
CONSOLE_PREFIX = "/ui"
#: Parents and children listed per job by /jobs/{id}/dependencies.
MAX_RELATIVES = 1000

#: Request latency: 1 ms .. 30 s (an enqueue waiting on a busy database included).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """Limits and policies of the jobs API (``pgfleet api`` flags)."""

    max_body_bytes: int = 2 * 1024 * 1024
    max_batch: int = 1000
    max_payload_bytes: int = 1024 * 1024
    #: Refuse with 503 when the runnable backlog would exceed this (0: no cap).
    backlog_cap: int = 0
    #: The same, per job name (0: no cap).
    backlog_cap_per_name: int = 0
    #: Seconds in the Retry-After header of a 503 that is worth retrying.
    retry_after: int = 1
    #: Credentials, roles, proxies, allowed hosts and console sessions.
    access: AccessConfig = field(default_factory=AccessConfig)
    #: Queued jobs due within this many seconds count in the backlog caps.
    backlog_horizon: float = 3600.0
    #: What job views show of errors (and the console of payloads).
    redactor: Redactor = field(default_factory=Redactor)
    #: Strict mode: the job names that have handlers.
    known_names: frozenset[str] | None = None
    #: Per job name, the decoder of its handler's payload type (from ``--app``):
    #: payloads that cannot decode are refused with 422, nothing written.
    payload_decoders: Mapping[str, Callable[[Any], Any]] | None = None
    #: The longest long poll of ``GET /jobs/{id}?wait=``, seconds (0: none).
    max_wait: int = 60

    @property
    def limits(self) -> Limits:
        return Limits(
            self.max_batch,
            self.max_payload_bytes,
            self.known_names,
            self.payload_decoders,
            self.max_wait,
        )


class ApiMetrics:
    """Request counts and latency by route template (never by job id)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "pgfleet_api_requests",
            "HTTP requests to the jobs API, by route template and status code.",
            ["route", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "pgfleet_api_request_duration_seconds",
            "Time to answer a jobs API request, by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )

    def observe(self, route: str, code: int, seconds: float) -> None:
        self.requests.labels(route, str(code)).inc()
        self.latency.labels(route).observe(seconds)


class JobsApi:
    """The aiohttp application of the jobs API over one :class:`Queue`.

    ``drain()`` starts refusing new /jobs requests with 503 "shutting down" and
    waits for the ones in flight.
    """

    def __init__(
        self,
        queue: Queue,
        config: ApiConfig,
        metrics: ApiMetrics | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.queue = queue
        self.config = config
        self.metrics = metrics
        self.gate = gate or Gate(config.access)
        self.draining = False
        self._limits = config.limits
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._retry_after = {"Retry-After": str(config.retry_after)}
        self._unready: str | None = None
        # The document of this API as configured: its limits, strict mode's names,
        # whether credentials are needed, and each operation's declared access.
        self._openapi = openapi_document(
            self._limits, bearer_auth=config.access.auth, access=self.declared_access()
        )

    def declared_access(self) -> dict[str, Access]:
        """What each route declares with ``@requires``, by its OpenAPI operationId
        (the handler's name in camelCase)."""
        return {
            _operation_id(route.handler.__name__): access_of(route.handler)
            for route in self.application().router.routes()
            if route.method != "HEAD"
        }

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def application(self) -> web.Application:
        """The routes. Each handler declares its access with ``@requires``: add a new
        endpoint here and decorate its handler (see :func:`check_declared`)."""
        app = web.Application(
            client_max_size=self.config.max_body_bytes, middlewares=[self._middleware]
        )
        app.router.add_post("/jobs", self.enqueue)
        app.router.add_get("/jobs", self.list_jobs)
        app.router.add_get("/jobs/{id}", self.get_job)
        app.router.add_post("/jobs/{id}/cancel", self.cancel_job)
        app.router.add_post("/jobs/{id}/retry", self.retry_job)
        app.router.add_get("/limits", self.list_limits)
        app.router.add_put("/limits/{name}", self.set_limits)
        app.router.add_delete("/limits/{name}", self.clear_limits)
        app.router.add_post("/pause", self.pause)
        app.router.add_post("/resume", self.resume)
        app.router.add_get("/jobs/{id}/dependencies", self.job_dependencies)
        app.router.add_post("/batches", self.enqueue_batch)
        app.router.add_get("/batches/{id}", self.get_batch)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/openapi.json", self.openapi)
        app.on_startup.append(_check_on_startup)
        return app

    async def drain(self, timeout: float) -> bool:
        """Refuse new work and wait up to ``timeout`` for requests in flight.
        True when none is left."""
        self.draining = True
        if self._in_flight:
            log.info("jobs API draining: %d request(s) in flight", self._in_flight)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            log.warning(
                "jobs API: %d request(s) still in flight after %.1fs; stopping anyway",
                self._in_flight,
                timeout,
            )
            return False
        return True

    # ------------------------------------------------------------ middleware

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        peer = self.gate.peer(request.remote, request.scheme, request.host, request.headers)
        if peer.address != request.remote or peer.scheme != request.scheme:
            # Behind a trusted proxy: the client's address and scheme (so request.secure
            # is true behind TLS, and the console's cookies are Secure).
            request = request.clone(remote=peer.address, scheme=peer.scheme)
        request[PEER] = peer
        request[CREDENTIAL] = ANONYMOUS
        path = request.path
        guarded = path == "/jobs" or path.startswith("/jobs/")
        if guarded:
            self._in_flight += 1
            self._idle.clear()
        try:
            response = await self._respond(request, handler, peer, guarded)
        finally:
            if guarded:
                self._in_flight -= 1
                if not self._in_flight:
                    self._idle.set()
        elapsed = time.perf_counter() - start
        route = _route_template(request)
        if self.metrics is not None:
            self.metrics.observe(route, response.status, elapsed)
        # Bodies are never logged: payloads may hold personal data or secrets.
        access_log.info(
            "%s %s %s %s %d %.1fms",
            peer.address,
            request[CREDENTIAL].name,
            request.method,
            path,
            response.status,
            elapsed * 1000,
        )
        return response

    async def _respond(
        self, request: web.Request, handler: Handler, peer: Peer, guarded: bool
    ) -> web.StreamResponse:
        try:
            access = _declared_access(request)
            if access is not Access.PUBLIC:
                self.gate.check_host(peer)
            if not _in_console(request.path):
                if guarded and self.draining:
                    # No Retry-After: this process is going away, not overloaded.
                    raise RequestError(503, "shutting down")
                if not self.gate.auth and request.method == "POST":
                    # No credentials: only a JSON POST, which a page of another site
                    # cannot send without a CORS preflight this API never grants.
                    check_content_type(request.content_type, request.charset)
                request[CREDENTIAL] = await self.gate.bearer(
                    request.headers.get("Authorization"), peer, access
                )
            return await handler(request)
        except AccessDenied as exc:
            return _error_response(RequestError(exc.status, exc.message, headers=exc.headers))
        except RequestError as exc:
            return _error_response(exc)
        except web.HTTPException as exc:  # routing: unknown path, wrong method
            return _http_exception_response(exc)
        except PgfleetError as exc:
            return _error_response(self._library_error(exc))
        except Exception:
            log.exception("jobs API: %s %s failed", request.method, request.path)
            return _error_response(RequestError(500, "internal error"))

    def _library_error(self, exc: PgfleetError) -> RequestError:
        if isinstance(exc, JobNotFound):
            return RequestError(404, str(exc), {"id": str(exc.job_id)})
        if isinstance(exc, InvalidJobState):
            return RequestError(
                409,
                str(exc),
                {"id": str(exc.job_id), "status": exc.status, "allowed": list(exc.allowed)},
            )
        if isinstance(exc, DuplicateJobKey):
            return RequestError(409, str(exc), {"job_key": exc.job_key})
        if isinstance(exc, PayloadTooLarge):
            return RequestError(413, str(exc))
        if isinstance(exc, ValidationError):
            return RequestError(422, str(exc))
        if isinstance(exc, DatabaseUnavailable):
            log.warning("jobs API: %s", exc)
            return RequestError(503, "database unavailable", headers=self._retry_after)
        if isinstance(exc, SchemaNotReady):
            log.error("jobs API: %s", exc)
            return RequestError(503, "database schema not ready: run `pgfleet migrate`")
        log.error("jobs API: %s", exc)
        return RequestError(500, "internal error")

    # ------------------------------------------------------------ handlers

    @requires(Access.ENQUEUE)
    async def enqueue(self, request: web.Request) -> web.Response:
        parent = tracing.incoming(request.headers)
        if parent is None:
            return await self._enqueue(request)
        # The caller's trace goes on: the enqueue span (and the job's handler) join it.
        token = otel_context.attach(parent)
        try:
            return await self._enqueue(request)
        finally:
            otel_context.detach(token)

    async def _enqueue(self, request: web.Request) -> web.Response:
        body = parse_enqueue(await self._read_json(request), self._limits)
        await self._admit(body)
        if not body.batch:
            req = body.requests[0]
            job_id = await self.queue.enqueue(req.name, req.payload, options=req.options)
            status = (await self._statuses(body.requests, [job_id]))[0]
            return web.json_response(
                {"id": str(job_id), "status": status},
                status=202,
                headers={"Location": f"/jobs/{job_id}"},
            )
        ids = await self.queue.enqueue_many(body.requests)
        statuses = await self._statuses(body.requests, ids)
        jobs = [{"id": str(i), "status": s} for i, s in zip(ids, statuses, strict=True)]
        return web.json_response({"jobs": jobs}, status=202)

    @requires(Access.READ_JOB)
    async def get_job(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        wait = parse_wait_query(request.query, self._limits.max_wait)
        job = await self.queue.get(job_id)
        if job is None:
            raise RequestError(404, missing_job(job_id), {"id": job_id})
        if wait and not job.status.finished and not self.draining:
            # Long poll: the queue's waiters share one LISTEN connection.
            with contextlib.suppress(TimeoutError):
                job = await self.queue.wait(job.id, timeout=wait)
        return web.json_response(self._view(job))

    @requires(Access.OPERATE)
    async def cancel_job(self, request: web.Request) -> web.Response:
        await self._empty_body(request)
        job = await self.queue.cancel(
            request.match_info["id"], by=f"api:{request[CREDENTIAL].name}"[:200]
        )
        audit(request[CREDENTIAL], request[PEER], "cancel job %s (%s)", job.id, job.name)
        return web.json_response(self._view(job))

    @requires(Access.OPERATE)
    async def retry_job(self, request: web.Request) -> web.Response:
        await self._empty_body(request)
        job = await self.queue.retry(request.match_info["id"])
        audit(request[CREDENTIAL], request[PEER], "retry job %s (%s)", job.id, job.name)
        return web.json_response(self._view(job))

    @requires(Access.READ_JOB)
    async def job_dependencies(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        job = await self.queue.get(job_id)
        if job is None:
            raise RequestError(404, missing_job(job_id), {"id": job_id})
        parents = await self.queue.parents(job.id, limit=MAX_RELATIVES)
        children = await self.queue.children(job.id, limit=MAX_RELATIVES)
        return web.json_response(
            {
                "parents": [relative_view(r) for r in parents],
                "children": [relative_view(r) for r in children],
            }
        )

    @requires(Access.ENQUEUE)
    async def enqueue_batch(self, request: web.Request) -> web.Response:
        members, callback = parse_batch(await self._read_json(request), self._limits)
        await self._admit(EnqueueBody(members, batch=True))
        batch_id, ids = await self.queue.enqueue_batch(members, callback=callback)
        statuses = await self._statuses(members, ids)
        jobs = [{"id": str(i), "status": s} for i, s in zip(ids, statuses, strict=True)]
        return web.json_response(
            {"id": str(batch_id), "jobs": jobs},
            status=202,
            headers={"Location": f"/batches/{batch_id}"},
        )

    @requires(Access.READ_JOB)
    async def get_batch(self, request: web.Request) -> web.Response:
        progress = await self.queue.batch_progress(request.match_info["id"])
        return web.json_response(batch_view(progress))

    @requires(Access.OBSERVE)
    async def list_jobs(self, request: web.Request) -> web.Response:
        query = parse_list_query(request.query)
        jobs = await self.queue.recent(query.limit, status=query.status, name=query.name)
        return web.json_response({"jobs": [self._view(j) for j in jobs]})

    @requires(Access.OBSERVE)
    async def list_limits(self, _request: web.Request) -> web.Response:
        waiting: dict[str, dict[str, int]] = {}
        for name, reason, n in await self.queue.waiting_on_limits():
            waiting.setdefault(name, {})[reason] = n
        limits = [limit_view(lim, waiting.get(lim.name, {})) for lim in await self.queue.limits()]
        queues = [paused_view(p) for p in await self.queue.paused() if p.kind == "queue"]
        return web.json_response({"limits": limits, "paused_queues": queues})

    @requires(Access.OPERATE)
    async def set_limits(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        spec = parse_limits(await self._read_json(request))
        limit = await self.queue.set_limits(
            name, concurrency=spec.concurrency, rate=spec.rate, per=spec.per, per_key=spec.per_key
        )
        audit(request[CREDENTIAL], request[PEER], "set limits of %s: %s", name, spec)
        return web.json_response(limit_view(limit))

    @requires(Access.OPERATE)
    async def clear_limits(self, request: web.Request) -> web.Response:
        name = _path_name(request)
        cleared = await self.queue.clear_limits(name)
        audit(request[CREDENTIAL], request[PEER], "clear limits of %s", name)
        return web.json_response({"name": name, "cleared": cleared})

    @requires(Access.OPERATE)
    async def pause(self, request: web.Request) -> web.Response:
        name, queue_name = parse_pause(await self._read_json(request))
        since = await self.queue.pause(name, queue_name=queue_name)
        target = name or f"queue {queue_name}"
        audit(request[CREDENTIAL], request[PEER], "pause %s", target)
        return web.json_response(
            {"name": name, "queue_name": queue_name, "paused_at": timestamp(since)}
        )

    @requires(Access.OPERATE)
    async def resume(self, request: web.Request) -> web.Response:
        name, queue_name = parse_pause(await self._read_json(request))
        resumed = await self.queue.resume(name, queue_name=queue_name)
        target = name or f"queue {queue_name}"
        audit(request[CREDENTIAL], request[PEER], "resume %s", target)
        return web.json_response({"name": name, "queue_name": queue_name, "resumed": resumed})

    @requires(Access.PUBLIC)
    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    @requires(Access.PUBLIC)
    async def openapi(self, _request: web.Request) -> web.Response:
        return web.json_response(self._openapi)

    @requires(Access.PUBLIC)
    async def readyz(self, _request: web.Request) -> web.Response:
        """Generic on the API's (public) port: why it is not ready goes to the log and
        to the private metrics port's /readyz, never to whoever asks here."""
        if self.draining:
            return web.json_response({"status": "shutting down"}, status=503)
        problem = await database_ready(self.queue.pool)
        if problem != self._unready:
            if problem is not None:
                log.warning("jobs API not ready: %s", problem)
            self._unready = problem
        if problem is None:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "not ready"}, status=503)

    # ------------------------------------------------------------ helpers

    def _view(self, job: Job) -> dict[str, Any]:
        view = job_view(job)
        redactor = self.config.redactor
        if "error" in view:
            view["error"] = redactor.error(job.name, view["error"])
        for entry in view.get("errors", ()):
            entry["error"] = redactor.error(job.name, entry["error"])
        if "result" in view:
            view["result"] = redactor.payload(job.name, view["result"])
        return view

    async def _empty_body(self, request: web.Request) -> None:
        """Cancel and retry take no body; a JSON one must be an empty object."""
        if not request.body_exists:
            return
        raw = await request.read()
        if not raw.strip():
            return
        check_content_type(request.content_type, request.charset)
        if decode_json(raw) != {}:
            raise RequestError(422, "this endpoint takes no body (or an empty JSON object)")

    async def _read_json(self, request: web.Request) -> Any:
        check_content_type(request.content_type, request.charset)
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise _body_too_large(length, limit)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _body_too_large(None, limit) from None
        return decode_json(raw)

    async def _admit(self, body: EnqueueBody) -> None:
        """Refuse (503 + Retry-After) work that would take the runnable backlog over
        its cap. The check precedes the insert, so concurrent requests can overshoot
        a cap by their own size: a soft cap, exact when requests come one at a time."""
        cap, per_name = self.config.backlog_cap, self.config.backlog_cap_per_name
        if not cap and not per_name:
            return
        incoming = collections.Counter(req.name for req in body.requests)
        size = len(body.requests)
        if cap:
            if size > cap:
                raise _over_cap_forever(f"{size} jobs", "the backlog cap", cap)
            backlog = await self.queue.runnable_backlog(
                at_most=cap, horizon=self.config.backlog_horizon
            )
            if backlog + size > cap:
                raise RequestError(
                    503,
                    f"backlog full: {backlog} runnable jobs, cap {cap}; retry later",
                    {"backlog": backlog, "cap": cap},
                    headers=self._retry_after,
                )
        if per_name:
            biggest, count = incoming.most_common(1)[0]
            if count > per_name:
                raise _over_cap_forever(f"{count} {biggest!r} jobs", "the per-name cap", per_name)
            backlogs = await self.queue.runnable_backlog_by_name(
                incoming, at_most=per_name, horizon=self.config.backlog_horizon
            )
            for name, n in sorted(incoming.items()):
                backlog = backlogs.get(name, 0)
                if backlog + n > per_name:
                    raise RequestError(
                        503,
                        f"backlog of {name!r} full: {backlog} runnable jobs, "
                        f"cap {per_name} per job name; retry later",
                        # "kind" is the old key of "name", kept for existing clients.
                        {"name": name, "kind": name, "backlog": backlog, "cap": per_name},
                        headers=self._retry_after,
                    )

    async def _statuses(self, requests: list[EnqueueRequest], ids: list[UUID]) -> list[str]:
        """ "queued" for new jobs; the actual status where a job_key resolved to an
        existing job (which may be running), and of jobs with parents (waiting,
        queued or cancelled, as their parents stand)."""
        keyed = [
            i
            for req, i in zip(requests, ids, strict=True)
            if req.options.job_key or req.options.after
        ]
        found = await self.queue.statuses(keyed) if keyed else {}
        return [found.get(i, JobStatus.QUEUED).value for i in ids]


def _path_name(request: web.Request) -> str:
    """A job name from the path; an invalid one is answered 422."""
    name = request.match_info["name"]
    try:
        return validate_name(name)
    except ValidationError as exc:
        raise RequestError(422, str(exc), {"field": "name"}) from None


def _operation_id(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _in_console(path: str) -> bool:
    return path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/")


def _declared_access(request: web.Request) -> Access:
    """What the matched route needs. Unmatched paths (404, 405) need nothing: they
    answer with an error and do nothing. A route whose handler declares nothing is
    refused: never open by omission."""
    if request.match_info.http_exception is not None:
        return Access.PUBLIC
    try:
        return access_of(request.match_info.handler)
    except LookupError:
        log.error("jobs API: %s %s has no declared access", request.method, request.path)
        raise RequestError(403, "this endpoint declares no access and is refused") from None


def check_declared(app: web.Application) -> None:
    """Raise LookupError naming any routed handler without ``@requires``."""
    for route in app.router.routes():
        access_of(route.handler)


async def _check_on_startup(app: web.Application) -> None:
    check_declared(app)


def _route_template(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return "unmatched" if resource is None else resource.canonical


def _body_too_large(length: int | None, limit: int) -> RequestError:
    size = "" if length is None else f" of {length} bytes"
    return RequestError(
        413,
        f"request body{size} is over the limit of {limit} bytes",
        {"max_body_bytes": limit},
    )


def _over_cap_forever(what: str, cap_name: str, cap: int) -> RequestError:
    # Not 503: retrying the same request could never succeed.
    return RequestError(
        413,
        f"{what} in one request is more than {cap_name} of {cap}; send smaller batches",
        {"cap": cap},
    )


def _error_response(exc: RequestError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status, headers=exc.headers)


def _http_exception_response(exc: web.HTTPException) -> web.Response:
    headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
    message = {404: "not found", 405: "method not allowed"}.get(exc.status, exc.reason.lower())
    return web.json_response({"error": message}, status=exc.status, headers=headers)
