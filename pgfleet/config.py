"""How a worker runs: ``WorkerConfig``, and the table of its fields that the
``pgfleet worker`` command exposes as flags and environment variables.

Standard library only (besides pgfleet's own leaf modules): the library, the
service layer and the command line all read it, and it imports none of them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from pgfleet.db.deadlines import DEFAULT_DATABASE_TIMEOUT
from pgfleet.errors import InvalidOptions
from pgfleet.jobs import validate_name

__all__ = ["OPTIONS_BY_FIELD", "WORKER_OPTIONS", "ConfigOption", "WorkerConfig"]

_DAY = 86400.0


def _seconds(
    value: float | timedelta | None, what: str, *, allow_none: bool = False
) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise InvalidOptions(f"{what} is required")
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidOptions(f"{what} must be a number of seconds or a timedelta, got {value!r}")
    if value <= 0:
        raise InvalidOptions(f"{what} must be positive, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class WorkerConfig:
    """How a worker runs. Durations are seconds (int/float) or ``timedelta``."""

    #: Handlers running at once in this worker.
    concurrency: int = 16
    #: How often an idle claim loop polls, whatever notifications do.
    poll_interval: float | timedelta = 2.0
    #: Most jobs a worker claims ahead of its free slots, held in memory and
    #: started as slots free up: fewer, larger claim rounds, and the next jobs
    #: already at hand when a handler finishes. It holds only what its slots
    #: should start within ``prefetch_window`` at the handlers' recent pace, none
    #: before a handler has finished, and hands back (unstarted, attempt not
    #: counted) any held job still waiting after a second. 0 turns it off:
    #: strict priority order at the cost of a claim round per slot.
    prefetch: int = 1024
    #: How much work, in seconds of the handlers' recent mean duration per slot,
    #: the jobs held ahead may stand for.
    prefetch_window: float | timedelta = 0.05
    #: Job names this worker serves (default: every name in the registry).
    job_names: Collection[str] | None = None
    #: Named queues this worker serves (default: all jobs, named or not).
    queue_names: Collection[str] | None = None
    #: Time running handlers get to finish at shutdown before they are cancelled
    #: and their jobs requeued.
    shutdown_grace_period: float | timedelta = 30.0
    #: After someone cancels a running job (``Queue.cancel``), how long its async
    #: handler gets to stop on its own (``pgfleet.cancel_requested()`` is true)
    #: before it is cancelled. Sync handlers cannot be interrupted: they poll.
    cancel_grace_period: float | timedelta = 0.5
    #: How often a worker renews its lease (and so every lock it holds).
    heartbeat_interval: float | timedelta = 5.0
    #: A worker whose heartbeat is older than this is dead: its jobs are recovered.
    dead_worker_timeout: float | timedelta = 30.0
    #: Finished jobs older than this are pruned in the background; None keeps all.
    finished_job_retention: float | timedelta | None = timedelta(days=30)
    #: Delete a job that succeeds in the statement that records its outcome,
    #: instead of keeping it until ``finished_job_retention`` prunes it: less WAL
    #: and no history. Kept anyway: jobs someone waits for (``Queue.wait``), jobs
    #: in a workflow (with parents or children), jobs asked to cancel, and jobs
    #: whose handler returned a result. Failed and cancelled jobs are kept as
    #: usual. A removed job reads as not found (``Queue.get`` None, a 404).
    remove_succeeded_jobs: bool = False
    #: Finished jobs older than this move from the jobs table to its history, whose
    #: days retention drops whole; None keeps them in the jobs table.
    history_move_after: float | timedelta | None = 60.0
    #: How often the leader prunes finished jobs.
    prune_interval: float | timedelta = 60.0
    #: Rows deleted per pruning statement.
    prune_batch_size: int = 1000
    #: Retry delay after attempt n: min(cap, base * 2**(n-1)) plus up to jitter * delay.
    backoff_base: float | timedelta = 1.0
    #: The longest retry delay.
    backoff_cap: float | timedelta = 3600.0
    #: Up to this fraction of the delay is added at random, so retries spread out.
    backoff_jitter: float = 0.2
    #: Handler timeout unless the handler sets its own; None means no timeout.
    default_timeout: float | timedelta | None = 600.0
    #: LISTEN for wakeups (polling runs either way).
    listen: bool = True
    #: Take part in the election of the worker that runs fleet-wide maintenance.
    lead: bool = True
    #: While a worker runs, tune the process's cyclic garbage collector: freeze the
    #: objects alive at its start (imports, pool, registry) so collections skip
    #: them, and collect the youngest generation every 20,000 allocations instead
    #: of 700. Undone when the process's last worker stops. The collector took
    #: 8-13% of a worker's CPU per no-op job; turn it off if the application tunes
    #: ``gc`` itself.
    gc_tuning: bool = True
    #: Let the leader VACUUM (ANALYZE) the jobs table when dead tuples pile up:
    #: "auto" when autovacuum is off for it or has fallen behind (4 times the
    #: threshold), "always", or "never".
    vacuum: str = "auto"
    #: How often the leader checks whether the jobs table needs a VACUUM (one read
    #: of its statistics; the leader also checks between batches moved to history).
    vacuum_interval: float | timedelta = 2.0
    #: Dead tuples below this (or below a fifth of the live ones) are left alone.
    vacuum_min_dead_tuples: int = 10_000
    #: Cron schedules are checked at least this often (and just after each
    #: occurrence); interval schedules shorter than this are capped to it.
    cron_poll_interval: float | timedelta = 5.0
    #: At shutdown, how long to keep trying to write outcomes to an unreachable
    #: database (jobs whose outcome was not written are recovered by the fleet).
    completion_flush_timeout: float | timedelta = 10.0
    #: Longest any database call of the runtime may take (claim round, heartbeat,
    #: listener, rescue, prune, cron, metrics), waiting for a connection included.
    #: A connection that does not answer in time is dropped and replaced.
    database_timeout: float | timedelta = DEFAULT_DATABASE_TIMEOUT
    #: The pool reaches the database through a pooler in transaction mode
    #: (PgBouncer ``pool_mode = transaction``): no session state is kept between
    #: transactions, and LISTEN runs only on ``listen_dsn`` (polling without it).
    #: Pair it with ``create_pool(..., pgbouncer=True)``.
    pgbouncer: bool = False
    #: Connection string of a direct or session-mode connection for LISTEN. The
    #: listener then holds one connection of its own instead of one of the pool's.
    listen_dsn: str | None = None

    def __post_init__(self) -> None:  # noqa: C901 - a flat list of independent option checks
        c = self.concurrency
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 10_000:
            raise InvalidOptions(f"concurrency must be an integer from 1 to 10000, got {c!r}")
        for name in (
            "poll_interval",
            "shutdown_grace_period",
            "cancel_grace_period",
            "heartbeat_interval",
            "dead_worker_timeout",
            "prune_interval",
            "backoff_base",
            "backoff_cap",
            "cron_poll_interval",
            "completion_flush_timeout",
            "vacuum_interval",
            "database_timeout",
            "prefetch_window",
        ):
            object.__setattr__(self, name, _seconds(getattr(self, name), name))
        if self.listen_dsn is not None and (
            not isinstance(self.listen_dsn, str) or not self.listen_dsn.strip()
        ):
            raise InvalidOptions(
                f"listen_dsn must be a non-empty connection string, got {self.listen_dsn!r}"
            )
        for name in ("finished_job_retention", "default_timeout", "history_move_after"):
            object.__setattr__(self, name, _seconds(getattr(self, name), name, allow_none=True))
        if self.dead_worker_timeout < 2 * self.heartbeat_interval:  # type: ignore[operator]
            raise InvalidOptions(
                f"dead_worker_timeout ({self.dead_worker_timeout}s) must be at least twice "
                f"heartbeat_interval ({self.heartbeat_interval}s), or live workers look dead"
            )
        if self.backoff_cap < self.backoff_base:  # type: ignore[operator]
            raise InvalidOptions("backoff_cap must be at least backoff_base")
        j = self.backoff_jitter
        if isinstance(j, bool) or not isinstance(j, int | float) or not 0 <= j <= 1:
            raise InvalidOptions(f"backoff_jitter must be between 0 and 1, got {j!r}")
        for name in ("remove_succeeded_jobs", "gc_tuning"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidOptions(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.vacuum not in ("auto", "always", "never"):
            raise InvalidOptions(f"vacuum must be 'auto', 'always' or 'never', got {self.vacuum!r}")
        v = self.vacuum_min_dead_tuples
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidOptions(
                f"vacuum_min_dead_tuples must be a non-negative integer, got {v!r}"
            )
        p = self.prefetch
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 100_000:
            raise InvalidOptions(f"prefetch must be an integer from 0 to 100000, got {p!r}")
        b = self.prune_batch_size
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 100_000:
            raise InvalidOptions(f"prune_batch_size must be from 1 to 100000, got {b!r}")
        for name in ("job_names", "queue_names"):
            names = getattr(self, name)
            if names is None:
                continue
            if isinstance(names, str) or not isinstance(names, Collection):
                raise InvalidOptions(f"{name} must be a collection of names, not {names!r}")
            what = "job name" if name == "job_names" else "queue name"
            object.__setattr__(self, name, frozenset(validate_name(n, what) for n in names))

    def seconds(self, name: str) -> float:
        value = getattr(self, name)
        assert isinstance(value, float)
        return value

    def optional_seconds(self, name: str) -> float | None:
        value = getattr(self, name)
        assert value is None or isinstance(value, float)
        return value


# ---------------------------------------------------------------- the command-line table

#: How a flag's text becomes a field's value:
#: ``int``, ``seconds``: the number; ``seconds-or-off``: seconds, 0 means None;
#: ``days-or-off``: days, 0 means None; ``names``: a comma-separated list, empty
#: means None; ``choice``: one of ``choices``; ``text``: a string, empty means None;
#: ``switch``: a flag without a value (``invert``: the flag turns the field off).
OptionKind = Literal[
    "int", "seconds", "seconds-or-off", "days-or-off", "names", "choice", "text", "switch"
]


@dataclass(frozen=True)
class ConfigOption:
    """One ``WorkerConfig`` field as a command-line flag and a ``PGFLEET_*`` variable.

    The default is never written here: it is the dataclass field's own, shown in the
    flag's unit (``default``)."""

    field: str
    flag: str
    #: The environment variable, without its ``PGFLEET_`` prefix.
    env: str
    help: str
    kind: OptionKind = "seconds"
    choices: tuple[str, ...] = ()
    #: For a switch: setting the flag sets the field to False (``--no-listen``).
    invert: bool = False
    #: Never on a command line (``ps`` shows those): child processes get it in the
    #: environment.
    secret: bool = False
    #: An older spelling still accepted: (flag, variable without prefix).
    deprecated: tuple[str, str] | None = None

    @property
    def variable(self) -> str:
        return f"PGFLEET_{self.env}"

    @property
    def dest(self) -> str:
        """The argparse attribute the flag is stored in."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def field_default(self) -> Any:
        spec = _FIELDS[self.field]
        if spec.default is not dataclasses.MISSING:
            return spec.default
        raise AssertionError(f"WorkerConfig.{self.field} has no plain default")  # pragma: no cover

    @property
    def default(self) -> Any:
        """The field's default as the flag would be given (30 days: 30.0; None: 0)."""
        value = self.field_default
        if self.kind == "switch":
            return bool(value) != self.invert
        if self.kind in ("seconds", "seconds-or-off", "days-or-off"):
            if value is None:
                return 0.0
            seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
            return seconds / _DAY if self.kind == "days-or-off" else seconds
        if self.kind == "names" and value is not None:
            return ",".join(sorted(value))
        return value

    def value(self, given: Any) -> Any:
        """The field's value for what the flag (or its variable) gave."""
        if self.kind == "switch":
            return bool(given) != self.invert
        if self.kind == "int":
            try:
                return int(given)
            except (TypeError, ValueError):
                raise InvalidOptions(f"{self.flag} must be an integer, got {given!r}") from None
        if self.kind in ("seconds", "seconds-or-off", "days-or-off"):
            try:
                number = float(given)
            except (TypeError, ValueError):
                raise InvalidOptions(f"{self.flag} must be a number, got {given!r}") from None
            if self.kind == "seconds":
                return number
            if number <= 0:
                return None
            return number * _DAY if self.kind == "days-or-off" else number
        if self.kind == "names":
            if not given:
                return None
            return [n.strip() for n in str(given).split(",") if n.strip()]
        if self.kind == "text":
            return given or None
        return given


_FIELDS = {spec.name: spec for spec in dataclasses.fields(WorkerConfig)}

#: The ``WorkerConfig`` fields ``pgfleet worker`` takes as flags, in ``--help`` order.
#: The flag wins over its variable, the variable over the field's default. Fields
#: missing here (lead, vacuum_interval, ...) are set from Python only.
WORKER_OPTIONS: tuple[ConfigOption, ...] = (
    ConfigOption(
        "concurrency",
        "--concurrency",
        "CONCURRENCY",
        "handlers running at once per process",
        kind="int",
    ),
    ConfigOption(
        "prefetch",
        "--prefetch",
        "PREFETCH",
        "most jobs claimed ahead of free slots (0: off)",
        kind="int",
    ),
    ConfigOption(
        "prefetch_window",
        "--prefetch-window",
        "PREFETCH_WINDOW",
        "seconds of handler work per slot the jobs claimed ahead may stand for",
    ),
    ConfigOption(
        "job_names",
        "--job-names",
        "JOB_NAMES",
        "comma-separated job names to serve (default: all)",
        kind="names",
        deprecated=("--kinds", "KINDS"),
    ),
    ConfigOption(
        "queue_names",
        "--queues",
        "QUEUES",
        "comma-separated named queues to serve (default: all)",
        kind="names",
    ),
    ConfigOption(
        "poll_interval", "--poll-interval", "POLL_INTERVAL", "idle poll interval, seconds"
    ),
    ConfigOption(
        "heartbeat_interval",
        "--heartbeat-interval",
        "HEARTBEAT_INTERVAL",
        "heartbeat interval, seconds",
    ),
    ConfigOption(
        "dead_worker_timeout",
        "--dead-worker-timeout",
        "DEAD_WORKER_TIMEOUT",
        "seconds without heartbeat before a worker is dead",
    ),
    ConfigOption(
        "shutdown_grace_period",
        "--shutdown-grace-period",
        "SHUTDOWN_GRACE_PERIOD",
        "seconds handlers get to finish at shutdown",
    ),
    ConfigOption(
        "cancel_grace_period",
        "--cancel-grace-period",
        "CANCEL_GRACE_PERIOD",
        "seconds a cancelled running async handler gets to stop on its own",
    ),
    ConfigOption(
        "default_timeout",
        "--default-timeout",
        "DEFAULT_TIMEOUT",
        "handler timeout, seconds (0: none)",
        kind="seconds-or-off",
    ),
    ConfigOption(
        "finished_job_retention",
        "--retention-days",
        "RETENTION_DAYS",
        "days finished jobs are kept (0: forever)",
        kind="days-or-off",
    ),
    ConfigOption(
        "remove_succeeded_jobs",
        "--remove-succeeded-jobs",
        "REMOVE_SUCCEEDED_JOBS",
        "delete succeeded jobs as their outcome is recorded, unless awaited, in a "
        "workflow or with a result (no history of them)",
        kind="switch",
    ),
    ConfigOption(
        "history_move_after",
        "--history-move-after",
        "HISTORY_MOVE_AFTER",
        "seconds after which a finished job moves to history, whose days retention "
        "drops whole (0: finished jobs stay in the jobs table)",
        kind="seconds-or-off",
    ),
    ConfigOption("backoff_base", "--backoff-base", "BACKOFF_BASE", "first retry delay, seconds"),
    ConfigOption("backoff_cap", "--backoff-cap", "BACKOFF_CAP", "longest retry delay, seconds"),
    ConfigOption(
        "cron_poll_interval",
        "--cron-poll-interval",
        "CRON_POLL_INTERVAL",
        "cron check interval, seconds",
    ),
    ConfigOption(
        "prune_interval",
        "--prune-interval",
        "PRUNE_INTERVAL",
        "how often the leader prunes, seconds",
    ),
    ConfigOption(
        "database_timeout",
        "--database-timeout",
        "DATABASE_TIMEOUT",
        "longest wait for any database call of the runtime before its connection is "
        "dropped and replaced, seconds",
    ),
    ConfigOption(
        "completion_flush_timeout",
        "--completion-flush-timeout",
        "COMPLETION_FLUSH_TIMEOUT",
        "at shutdown, how long to keep trying to write outcomes, seconds",
    ),
    ConfigOption(
        "vacuum",
        "--vacuum",
        "VACUUM",
        "leader vacuums the jobs table when dead tuples pile up: auto (when "
        "autovacuum is off or has fallen behind), always, never",
        kind="choice",
        choices=("auto", "always", "never"),
    ),
    ConfigOption(
        "listen",
        "--no-listen",
        "NO_LISTEN",
        "do not LISTEN for wakeups; poll only",
        kind="switch",
        invert=True,
    ),
    ConfigOption(
        "gc_tuning",
        "--no-gc-tuning",
        "NO_GC_TUNING",
        "leave the process's garbage collector as it is (by default a running worker "
        "freezes its start-up objects and collects young objects less often)",
        kind="switch",
        invert=True,
    ),
    ConfigOption(
        "pgbouncer",
        "--pgbouncer",
        "PGBOUNCER",
        "--dsn goes through a pooler in transaction mode (PgBouncer): no named "
        "prepared statements, no session state, LISTEN only on --listen-dsn",
        kind="switch",
    ),
    ConfigOption(
        "listen_dsn",
        "--listen-dsn",
        "LISTEN_DATABASE_URL",
        "a direct or session-mode connection string for LISTEN, held besides the "
        "pool (with --pgbouncer; without it workers only poll)",
        kind="text",
        secret=True,
    ),
)

#: The same options by field name.
OPTIONS_BY_FIELD = {option.field: option for option in WORKER_OPTIONS}
