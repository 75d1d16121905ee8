"""``manage.py migrate`` applies pgfleet's migrations.

Each Django migration of this app runs :func:`apply_pgfleet_migrations`, which
applies whatever pgfleet migrations are pending (``pgfleet.migrate``'s rules:
checksums, an advisory lock, idempotent) on Django's own connection, inside the
Django migration's transaction. A pgfleet release that adds a schema migration
adds a Django migration here (``PGFLEET_VERSION``, checked by a test), so an
upgraded project's next ``migrate`` brings the schema up. Only databases that a
pgfleet ``TaskBackend`` uses are touched (``default`` when none is configured yet).
Reversing it does nothing: jobs are not dropped.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS

from pgfleet.contrib.django.backend import _psycopg_connection
from pgfleet.db.psycopg_driver import migrate_sync

__all__ = ["apply_pgfleet_migrations", "pgfleet_databases"]

BACKEND = "pgfleet.contrib.django.TaskBackend"


def pgfleet_databases() -> set[str]:
    """The Django database aliases that pgfleet backends write to."""
    found = set()
    for params in (getattr(settings, "TASKS", None) or {}).values():
        if params.get("BACKEND") == BACKEND:
            options = {str(k).upper(): v for k, v in (params.get("OPTIONS") or {}).items()}
            found.add(options.get("DATABASE", DEFAULT_DB_ALIAS))
    return found or {DEFAULT_DB_ALIAS}


def apply_pgfleet_migrations(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or connection.alias not in pgfleet_databases():
        return
    migrate_sync(_psycopg_connection(connection))
