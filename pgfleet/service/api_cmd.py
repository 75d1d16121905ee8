"""``pgfleet api``: serve the HTTP jobs API.

Every option can also come from a ``PGFLEET_*`` environment variable (the flag
wins). SIGTERM or SIGINT drains: new /jobs requests get 503 "shutting down",
requests in flight finish, then the process exits 0. A second signal, a second
or more later, stops at once.

This module needs only the standard library at import (the parser is built for
every ``pgfleet`` command); aiohttp is imported when the API runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgfleet.db.connect import Pool
from pgfleet.db.deadlines import DEFAULT_DATABASE_TIMEOUT, AppPool, BoundedPool
from pgfleet.errors import PgfleetError, ValidationError
from pgfleet.queue import NotifyMode, Queue, create_pool
from pgfleet.service import credentials
from pgfleet.service.access import AccessConfig, Gate
from pgfleet.service.apps import AppError, load_object, load_registry
from pgfleet.service.console import flags as console_flags
from pgfleet.service.credentials import LEGACY_NAME
from pgfleet.service.flags import add_common
from pgfleet.service.guard import AllowedHosts, FailureBackoff, TrustedProxies, parse_networks
from pgfleet.service.process import (
    NO_DATABASE,
    Stopper,
    UsageError,
    catch_early_signals,
    configure_logging,
    env_default,
    env_flag,
    install_uvloop,
)
from pgfleet.service.redaction import Redactor, parse_fields
from pgfleet.service.revocations import Revocations

if TYPE_CHECKING:
    from pgfleet.service.api import ApiConfig

log = logging.getLogger("pgfleet")

MIB = 1024 * 1024
#: Seconds to wait for a connection to the database on a request.
CONNECT_TIMEOUT = 5.0
#: Seconds the listening sockets stay open after the drain, for stragglers.
STOP_GRACE = 2.0

# (flag, env suffix, default, low, high, help)
_INTEGERS: tuple[tuple[str, str, int, int, int, str], ...] = (
    ("--port", "API_PORT", 8000, 1, 65535, "port of the jobs API"),
    (
        "--metrics-port",
        "API_METRICS_PORT",
        9465,
        0,
        65535,
        "port of /metrics, /healthz, /readyz, separate from the API (0: off)",
    ),
    ("--max-body-bytes", "API_MAX_BODY_BYTES", 2 * MIB, 64, 1024 * MIB, "largest request body"),
    (
        "--max-payload-bytes",
        "API_MAX_PAYLOAD_BYTES",
        MIB,
        2,
        1024 * MIB,
        "largest encoded payload of one job",
    ),
    ("--max-batch", "API_MAX_BATCH", 1000, 1, 100_000, "most jobs in one batch request"),
    (
        "--max-wait",
        "API_MAX_WAIT",
        60,
        0,
        3600,
        "longest long poll of GET /jobs/{id}?wait=, seconds (0: answer at once)",
    ),
    (
        "--backlog-cap",
        "API_BACKLOG_CAP",
        0,
        0,
        2**62,
        "refuse with 503 when the runnable backlog would exceed this (0: no cap)",
    ),
    (
        "--backlog-cap-per-name",
        "API_BACKLOG_CAP_PER_NAME",
        0,
        0,
        2**62,
        "the same, per job name (0: no cap)",
    ),
    ("--retry-after", "API_RETRY_AFTER", 1, 1, 86400, "Retry-After seconds of a retryable 503"),
    ("--pool-size", "API_POOL_SIZE", 10, 1, 1000, "database connections"),
    (
        "--auth-free-failures",
        "API_AUTH_FREE_FAILURES",
        5,
        1,
        1000,
        "failed authentications a client may make before each further one pauses it "
        "(1 s, doubling, at most 5 min; 429 with Retry-After meanwhile)",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common(parser)
    parser.add_argument(
        "--host",
        default=env_default("API_HOST", "127.0.0.1"),
        help="address of the jobs API [PGFLEET_API_HOST] (default 127.0.0.1)",
    )
    parser.add_argument(
        "--metrics-host",
        default=env_default("API_METRICS_HOST", "127.0.0.1"),
        help="address of the metrics port [PGFLEET_API_METRICS_HOST] (default 127.0.0.1)",
    )
    for flag, env, default, _low, _high, text in _INTEGERS:
        parser.add_argument(
            flag,
            default=env_default(env, default),
            help=f"{text} [PGFLEET_{env}] (default {default})",
        )
    parser.add_argument(
        "--backlog-cap-per-kind",
        dest="backlog_cap_per_name",
        default=argparse.SUPPRESS,
        help="deprecated spelling of --backlog-cap-per-name [PGFLEET_API_BACKLOG_CAP_PER_KIND]",
    )
    if env_default("API_BACKLOG_CAP_PER_NAME") is None:
        old = env_default("API_BACKLOG_CAP_PER_KIND")
        if old is not None:
            parser.set_defaults(backlog_cap_per_name=old)
    parser.add_argument(
        "--shutdown-timeout",
        default=env_default("API_SHUTDOWN_TIMEOUT", 30.0),
        help="seconds requests in flight get to finish at shutdown "
        "[PGFLEET_API_SHUTDOWN_TIMEOUT] (default 30)",
    )
    parser.add_argument(
        "--credentials",
        default=env_default("API_CREDENTIALS"),
        help="named credentials as name:role:secret, comma-separated; roles: producer "
        "(enqueue, read a job by id), viewer (console and lists, read-only), operator "
        "(everything) [PGFLEET_API_CREDENTIALS] (prefer the variable or "
        "--credentials-file: command lines are visible to other users)",
    )
    parser.add_argument(
        "--credentials-file",
        default=env_default("API_CREDENTIALS_FILE"),
        help="a file of name:role:secret lines (secrets may be sha256:<hex> digests) "
        "[PGFLEET_API_CREDENTIALS_FILE]",
    )
    parser.add_argument(
        "--auth-token",
        default=env_default("API_TOKEN"),
        help="the one-token setup: a single operator credential named api-token, for "
        "producers and the console alike [PGFLEET_API_TOKEN] (default: no "
        "authentication); split it into --credentials to give producers less",
    )
    parser.add_argument(
        "--trusted-proxies",
        default=env_default("API_TRUSTED_PROXIES"),
        help="addresses or networks of the reverse proxies whose X-Forwarded-For, "
        "-Proto and -Host are believed (client address, https for Secure cookies) "
        "[PGFLEET_API_TRUSTED_PROXIES] (default: none)",
    )
    parser.add_argument(
        "--allowed-hosts",
        default=env_default("API_ALLOWED_HOSTS"),
        help="Host names requests may carry, comma-separated, * for any "
        "[PGFLEET_API_ALLOWED_HOSTS] (default without credentials: localhost, 127.0.0.1, "
        "::1 and --host; with credentials: any)",
    )
    parser.add_argument(
        "--backlog-horizon",
        default=env_default("API_BACKLOG_HORIZON", 3600.0),
        help="queued jobs due within this many seconds count in the backlog caps "
        "[PGFLEET_API_BACKLOG_HORIZON] (default 3600; 0: only jobs due now)",
    )
    parser.add_argument(
        "--redact-fields",
        default=env_default("REDACT_FIELDS"),
        help="payload keys shown as [redacted] in the console, and masked as key=value "
        "in errors the API and console show, comma-separated; none for none "
        "[PGFLEET_REDACT_FIELDS] (default: password, secret, token, api_key, "
        "authorization, card_number, cvv, ssn and similar)",
    )
    parser.add_argument(
        "--redact-hook",
        default=env_default("REDACT_HOOK"),
        help="module:attribute of a redaction rule of your own: an object with "
        "payload(name, payload) and/or error(name, text), or a function "
        "(name, payload) -> payload [PGFLEET_REDACT_HOOK]",
    )
    parser.add_argument(
        "--app",
        default=env_default("APP"),
        help="the application's Registry, as module:attribute [PGFLEET_APP]: payloads that "
        "do not decode into their handler's declared type are refused with 422 "
        "(--no-payload-check turns that off), --strict refuses job names it has no "
        "handler for, and the queue gauges list its job names",
    )
    parser.add_argument(
        "--notify",
        default=env_default("API_NOTIFY", "coalesced"),
        help="how enqueues wake workers: coalesced (one NOTIFY per burst, after the "
        "commit), transaction (a NOTIFY inside every enqueue transaction) or off "
        "(workers poll) [PGFLEET_API_NOTIFY] (default coalesced)",
    )
    parser.add_argument(
        "--database-timeout",
        type=float,
        default=env_default("DATABASE_TIMEOUT", DEFAULT_DATABASE_TIMEOUT),
        help="longest wait for a database call before its connection is dropped and the "
        "request answered 503, seconds [PGFLEET_DATABASE_TIMEOUT] (default 15)",
    )
    parser.add_argument(
        "--no-payload-check",
        action="store_true",
        default=env_flag("API_NO_PAYLOAD_CHECK"),
        help="with --app, accept payloads that do not decode into their handler's "
        "declared type (by default they are refused with 422) [PGFLEET_API_NO_PAYLOAD_CHECK]",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        default=env_flag("API_STRICT"),
        help="refuse job names the --app registry has no handler for [PGFLEET_API_STRICT]",
    )
    console_flags.add_arguments(parser)


#: The options given in seconds: attribute, whether a value is allowed, the
#: allowed range as the error message says it.
_SECONDS: tuple[tuple[str, Callable[[float], bool], str], ...] = (
    ("shutdown_timeout", lambda s: 0 <= s <= 3600, "from 0 to 3600 seconds"),
    ("database_timeout", lambda s: 0 < s <= 3600, "over 0 and at most 3600 seconds"),
    ("backlog_horizon", lambda s: 0 <= s <= 10 * 365 * 86400, "from 0 to ten years in seconds"),
)


def _check(args: argparse.Namespace) -> None:
    """Validate and convert every option, or exit with a message naming it."""

    def fail(message: str) -> UsageError:
        return UsageError(f"pgfleet api: {message}")

    if not args.dsn:
        raise fail(NO_DATABASE)
    for flag, _env, _default, low, high, _text in _INTEGERS:
        name = flag[2:].replace("-", "_")
        value = getattr(args, name)
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise fail(f"{flag} must be an integer, got {value!r}") from None
        if not low <= number <= high:
            raise fail(f"{flag} must be from {low} to {high}, got {number}")
        setattr(args, name, number)
    for name, within, limits in _SECONDS:
        flag = "--" + name.replace("_", "-")
        value = getattr(args, name)
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise fail(f"{flag} must be a number, got {value!r}") from None
        if not within(seconds):
            raise fail(f"{flag} must be {limits}, got {seconds}")
        setattr(args, name, seconds)
    console_flags.check(args, fail)
    if args.metrics_port and args.metrics_port == args.port and args.metrics_host == args.host:
        raise fail("--metrics-port must differ from --port: metrics are not served on the API")
    modes = [mode.value for mode in NotifyMode]
    if args.notify not in modes:
        raise fail(f"--notify must be one of {', '.join(modes)}, got {args.notify!r}")
    if args.strict and not args.app:
        raise fail("--strict needs --app module:registry (the job names to accept)")


def build_access(args: argparse.Namespace) -> AccessConfig:
    """Credentials, proxies, allowed hosts and sessions; UsageError naming a problem."""
    try:
        creds = credentials.load(
            entries=args.credentials, file=args.credentials_file, legacy_token=args.auth_token
        )
        proxies = TrustedProxies(parse_networks(args.trusted_proxies, "--trusted-proxies"))
    except ValueError as exc:  # CredentialError included
        raise UsageError(f"pgfleet api: {exc}") from None
    hosts = None
    if args.allowed_hosts or not creds:
        hosts = AllowedHosts.parse(args.allowed_hosts, args.host)
    return AccessConfig(
        credentials=creds,
        proxies=proxies,
        allowed_hosts=hosts,
        secure_cookies=args.ui_secure_cookies,
        session_lifetime=args.ui_session_lifetime,
        session_idle=args.ui_session_idle,
    )


def build_redactor(args: argparse.Namespace) -> Redactor:
    hook = load_object(args.redact_hook, "--redact-hook") if args.redact_hook else None
    try:
        return Redactor(parse_fields(args.redact_fields), hook)
    except TypeError as exc:
        raise AppError(str(exc)) from None


def build_config(args: argparse.Namespace) -> ApiConfig:
    from pgfleet.service.api import ApiConfig  # lazy: optional extra (aiohttp)

    known = None
    decoders = None
    if args.app:
        app = load_registry(args.app)
        if args.strict:
            known = frozenset(app.names())
        if not args.no_payload_check:
            decoders = {h.name: h.decode for h in app if h.takes_payload}
    return ApiConfig(
        max_body_bytes=args.max_body_bytes,
        max_batch=args.max_batch,
        max_wait=args.max_wait,
        max_payload_bytes=args.max_payload_bytes,
        backlog_cap=args.backlog_cap,
        backlog_cap_per_name=args.backlog_cap_per_name,
        retry_after=args.retry_after,
        access=build_access(args),
        backlog_horizon=args.backlog_horizon,
        redactor=build_redactor(args),
        known_names=known,
        payload_decoders=decoders,
    )


def _announce_access(access: AccessConfig) -> None:
    creds = access.credentials
    if not creds:
        hosts = access.allowed_hosts
        log.warning(
            "jobs API without credentials: anyone who reaches it may enqueue, read and "
            "cancel jobs (answering Host %s only, JSON POSTs only); set "
            "PGFLEET_API_CREDENTIALS",
            "any" if hosts is None or hosts.any else ", ".join(sorted(hosts.names)),
        )
        return
    roles = ", ".join(f"{n} {role.value}" for role, n in creds.roles().items() if n)
    log.info("jobs API credentials: %s (%s)", ", ".join(c.name for c in creds.all), roles)
    if creds.named(LEGACY_NAME) is not None:
        log.warning(
            "PGFLEET_API_TOKEN is one credential for producers and the console alike, with "
            "operator rights: give producers their own (PGFLEET_API_CREDENTIALS="
            "name:producer:<secret>,name:operator:<secret>, see docs/operations/security.md)"
        )


def make_queue(pool: AppPool, args: argparse.Namespace, config: ApiConfig) -> Queue:
    """The API's Queue: its limits and the ``--notify`` mode."""
    return Queue(
        BoundedPool(pool, args.database_timeout),
        notify=NotifyMode(args.notify),
        max_payload_bytes=config.max_payload_bytes,
        known_names=config.known_names,
    )


async def serve(args: argparse.Namespace, config: ApiConfig) -> int:
    """Run the API until signalled and drained. Returns the exit code."""
    # lazy: optional dependencies (prometheus_client and aiohttp, the service extra)
    from prometheus_client import CollectorRegistry

    from pgfleet.service.api import ApiMetrics, JobsApi  # lazy: optional extra (aiohttp)
    from pgfleet.service.http import Server, metrics_server  # lazy: optional extra (aiohttp)
    from pgfleet.service.metrics import (  # lazy: optional extra (prometheus_client)
        NameLabels,
        ProcessMetrics,
        QueueStats,
    )

    stopper = Stopper()
    stopper.install()
    # min_size=0: a database that is down at start gives 503s, not a dead process.
    pool = await create_pool(
        args.dsn,
        min_size=0,
        max_size=args.pool_size,
        timeout=CONNECT_TIMEOUT,
        pgbouncer=bool(args.pgbouncer),
    )
    registry = CollectorRegistry()
    queue = make_queue(pool, args, config)
    # The API competes for the fleet's metrics lease too: the backlog gauges keep
    # coming while every worker is down, which is when they matter most.
    names: Any = config.known_names
    if names is None and args.app:
        names = load_registry(args.app).names()
    labels = NameLabels(known=names or ())
    queue.on_enqueued = ProcessMetrics(registry, worker=False, names=labels).count_enqueued
    stats = QueueStats(BoundedPool(pool, args.database_timeout), names or ())
    registry.register(stats)
    # Behind a transaction-mode PgBouncer LISTEN cannot work: every check asks.
    revocations = Revocations(
        pool, timeout=min(args.database_timeout, 5.0), listen=not args.pgbouncer
    )
    gate = Gate(config.access, revocations, FailureBackoff(free=args.auth_free_failures))
    api = JobsApi(queue, config, ApiMetrics(registry), gate)
    servers: list[Server] = []
    app = api.application()
    console = console_flags.build(args, gate, config.redactor, stats.holder)
    if console is not None:
        await console.attach(app, args.dsn, args.database_timeout)
    if config.access.auth:
        revocations.start()
    try:
        public = Server(app, args.host, args.port, "jobs API", shutdown_timeout=STOP_GRACE)
        await public.start()
        servers.append(public)
        if args.metrics_port:
            metrics = metrics_server(args.metrics_host, args.metrics_port, registry, stats, pool)
            await metrics.start()
            servers.append(metrics)
        try:
            await stopper.event.wait()
            await api.drain(args.shutdown_timeout)
        except asyncio.CancelledError:
            if stopper.signals < 2:
                raise
            log.warning("jobs API stopping without waiting for %d request(s)", api.in_flight)
    finally:
        for server in servers:
            await server.stop()
        await revocations.stop()
        await queue.flush_notifications()
        await _close(pool)
    log.info("jobs API stopped")
    return 0


async def _close(pool: Pool) -> None:
    try:
        await asyncio.wait_for(pool.close(), STOP_GRACE)
    except Exception:  # TimeoutError included
        with contextlib.suppress(Exception):
            pool.terminate()


def main(args: argparse.Namespace) -> int:
    catch_early_signals()
    configure_logging(args.log_level)
    _check(args)
    # lazy: optional extra (http imports aiohttp); needed only to name its error
    from pgfleet.service.http import PortInUse

    try:
        config = build_config(args)
    except (PgfleetError, AppError) as exc:
        raise UsageError(f"pgfleet api: {exc}") from None
    _announce_access(config.access)
    loop_name = install_uvloop()
    log.info("pgfleet api starting on %s (notify: %s)", loop_name, args.notify)
    try:
        return asyncio.run(serve(args, config))
    except (ValidationError, AppError) as exc:  # found once the loop runs (e.g. job names)
        raise UsageError(f"pgfleet api: {exc}") from None
    except (PgfleetError, PortInUse) as exc:
        raise SystemExit(f"pgfleet api: {exc}") from None
