"""A Locust user that enqueues straight into Postgres, as a pgfleet producer would.

Driver: psycopg 3 (C-accelerated ``psycopg[binary]``). From 3.1.14 on, psycopg
notices gevent's monkey-patched ``select`` when it is imported and then waits on
sockets through it instead of its C wait loop, so every greenlet's query yields to
the others. Locust patches at ``import locust``, before this module imports
psycopg; :func:`_check_cooperative` refuses to run if that order ever breaks
(tests/loadtest/test_gevent_driver.py proves the cooperation with a lock wait).

Each user is one producer: one connection, one transaction per request, through
pgfleet's psycopg producer (:mod:`pgfleet.contrib.psycopg`: the statements, checks
and payload encoding of ``Queue``), for the chosen notification mode:

- ``transaction``: the notification commits inside every enqueue transaction;
- ``coalesced``: the enqueue commits bare; one notifier greenlet per Locust process
  sends ``pg_notify`` after it, at most one in flight (pgfleet's ``_Waker``);
- ``off``: no notification.
"""

from __future__ import annotations

import time
from typing import Any

import gevent
import gevent.event
import psycopg
import psycopg.waiting
from locust import User, events, task

from loadtest.shield import GracefulStop, stop_spent
from loadtest.users import Budget, Pacer, Settings, request_name, user_period
from pgfleet import EnqueueRequest, NotifyMode, PgfleetError
from pgfleet.contrib.psycopg import Producer

CONNECT_TIMEOUT = 10


def _check_cooperative() -> None:
    if psycopg.waiting.wait is getattr(psycopg.waiting, "wait_c", None):
        raise RuntimeError(
            "psycopg was imported before gevent patched select: its C wait loop would "
            "block every greenlet. Import locust (or patch gevent) before psycopg."
        )


_check_cooperative()


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(
        dsn,
        autocommit=True,
        connect_timeout=CONNECT_TIMEOUT,
        application_name="pgfleet-loadtest",
    )


class CoalescedNotifier:
    """One ``pg_notify`` in flight per process, and one more after it when anything
    committed meanwhile: the wakeups of a burst of commits collapse into one."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._wanted = gevent.event.Event()
        self._greenlet: gevent.Greenlet | None = None
        self.sent = 0

    def request(self) -> None:
        self._wanted.set()
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._run)

    def _run(self) -> None:
        producer = Producer()
        with connect(self._dsn) as conn:
            while True:
                self._wanted.wait()
                self._wanted.clear()
                producer.notify(conn)
                self.sent += 1


class _Shared:
    """Per-process state of the database users."""

    def __init__(self, settings: Settings) -> None:
        self.budget = Budget(settings.total_jobs or None)
        self.notifier = CoalescedNotifier(settings.dsn)
        self.seq = 0


def _shared(environment: Any, settings: Settings) -> _Shared:
    state = getattr(environment, "pgfleet_db", None)
    if state is None:
        state = environment.pgfleet_db = _Shared(settings)
    return state


class DbEnqueuer(GracefulStop, User):
    """Enqueues ``--batch-size`` jobs per transaction on its own connection."""

    abstract = True

    def on_start(self) -> None:
        self.settings = Settings.from_options(self.environment.parsed_options)
        if not self.settings.dsn:
            raise RuntimeError("the database user needs --dsn or PGFLEET_DATABASE_URL")
        self.shared = _shared(self.environment, self.settings)
        self.shared.budget.active += 1
        users = self.environment.parsed_options.num_users or 1
        self.pacer = Pacer(user_period(self.settings.target_rate, self.settings.batch, users))
        self.request_type = f"db-{self.settings.notify}"
        # Coalesced: the enqueue commits bare, the process's notifier wakes after it.
        notify = NotifyMode.TRANSACTION if self.settings.notify == "transaction" else "off"
        self.producer = Producer(notify=notify)
        self.conn: psycopg.Connection[Any] | None = None

    def on_stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def wait_time(self) -> float:
        return self.pacer.wait()

    @task
    def enqueue(self) -> None:
        n = self.shared.budget.take(self.settings.batch)
        if n == 0:
            stop_spent(self, self.shared.budget)
        start = time.perf_counter()
        exception: BaseException | None = None
        try:
            if self.conn is None or self.conn.closed:
                self.conn = connect(self.settings.dsn)
            self._write(self.conn, n)
        except (psycopg.Error, PgfleetError) as exc:
            exception = exc
            if self.conn is not None and self.conn.broken:
                self.conn = None
        elapsed_ms = (time.perf_counter() - start) * 1000
        self.environment.events.request.fire(
            request_type=self.request_type,
            name=request_name("enqueue", n),
            response_time=elapsed_ms,
            response_length=n,
            exception=exception,
            context={},
        )
        if exception is None and self.settings.notify == "coalesced":
            self.shared.notifier.request()

    def _write(self, conn: psycopg.Connection[Any], n: int) -> None:
        name = self.settings.job_name
        seq = self.shared.seq
        self.shared.seq += n
        if n == 1:
            self.producer.enqueue(conn, name, {"n": seq})
            return
        requests = [EnqueueRequest(name, {"n": seq + i}) for i in range(n)]
        self.producer.enqueue_many(conn, requests)


@events.test_stop.add_listener  # type: ignore[untyped-decorator]  # locust: unannotated
def _report_notifications(environment: Any, **_kw: Any) -> None:
    state = getattr(environment, "pgfleet_db", None)
    if state is not None and state.notifier.sent:
        print(f"pgfleet-loadtest: coalesced notifications sent: {state.notifier.sent}")
