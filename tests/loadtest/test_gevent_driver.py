"""The database user's driver really cooperates with gevent.

A greenlet blocks inside Postgres (waiting for an advisory lock another session
holds); the test passes only if another greenlet of the same process keeps
running meanwhile and can release the lock. A blocking driver would deadlock the
process, which the subprocess timeout turns into a failure. No timing is asserted.
"""

from __future__ import annotations

from tests.loadtest.support import run

SCRIPT = r"""
import sys
import locust  # patches the standard library first, exactly as in a Locust run
import gevent, gevent.event, psycopg
from loadtest.dbuser import connect

dsn, key = sys.argv[1], 7_000_001
holder = connect(dsn)
holder.execute("SELECT pg_advisory_lock(%s)" % key)
got_lock = gevent.event.Event()

def waiter():
    with connect(dsn) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)" % key)  # blocks in Postgres
        got_lock.set()
        conn.execute("SELECT pg_advisory_unlock(%s)" % key)

greenlet = gevent.spawn(waiter)
with connect(dsn) as observer:
    waiting = 0
    while not waiting:  # the waiter's session, seen from Postgres, across the process boundary
        gevent.sleep(0.01)
        waiting = observer.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()[0]
assert not got_lock.is_set()
holder.execute("SELECT pg_advisory_unlock(%s)" % key)
greenlet.join()
assert got_lock.is_set()
print("cooperative with", psycopg.waiting.wait.__name__)
"""


def test_psycopg_yields_to_other_greenlets_while_a_query_waits(database: str) -> None:
    code, output = run(["-c", SCRIPT, database], timeout=60)
    assert code == 0, output
    assert "cooperative with wait_" in output
    assert "wait_c" not in output, output


def test_the_database_user_refuses_a_driver_imported_before_gevent() -> None:
    script = "import psycopg; import locust; import loadtest.dbuser"
    code, output = run(["-c", script], timeout=60)
    assert code != 0
    assert "psycopg was imported before gevent patched select" in output
