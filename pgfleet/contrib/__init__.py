"""Integrations with other drivers and frameworks, each behind its own extra:
:mod:`pgfleet.contrib.psycopg` (``psycopg``), :mod:`pgfleet.contrib.sqlalchemy`
(``sqlalchemy``) and :mod:`pgfleet.contrib.django` (``django``)."""
