"""The Django application: pgfleet's migrations and its worker command."""

from __future__ import annotations

from django.apps import AppConfig


class PgfleetConfig(AppConfig):  # type: ignore[misc]  # Django ships no annotations
    name = "pgfleet.contrib.django"
    label = "pgfleet"
    verbose_name = "pgfleet"
