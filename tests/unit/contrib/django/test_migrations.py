"""Every pgfleet schema migration has a Django migration that applies it, so an
upgraded Django project's `manage.py migrate` brings pgfleet's schema up."""

from __future__ import annotations

import importlib
from pathlib import Path

import pgfleet

FOLDER = Path(pgfleet.__file__).parent / "contrib" / "django" / "migrations"


def test_the_latest_django_migration_covers_the_latest_pgfleet_migration() -> None:
    modules = sorted(p.stem for p in FOLDER.glob("0*.py"))
    versions = [
        importlib.import_module(f"pgfleet.contrib.django.migrations.{m}").PGFLEET_VERSION
        for m in modules
    ]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert versions[-1] == len(pgfleet.migrations()), (
        "a pgfleet migration was added: add a Django migration running it "
        "(pgfleet/contrib/django/migrations/, PGFLEET_VERSION)"
    )
