"""Locust load tests for pgfleet and the capacity-planning report built from them.

Two halves that never share a process:

- the Locust side (``locustfile.py``, ``users.py``, ``dbuser.py``, ``httpuser.py``,
  ``gate.py``) runs on gevent, inside ``python -m locust``;
- the harness side (``run.py``, ``harness.py``, ``sampling.py``, ``scenarios.py``,
  ``report.py``) runs on plain asyncio: it starts Postgres, workers and the API,
  runs Locust as a subprocess per measurement point, samples the database, and
  writes the report. It never imports gevent.

See loadtest/README.md.
"""
