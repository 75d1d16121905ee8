"""pgfleet's schema, up to its migration 0003, in the backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 3


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    initial = True
    dependencies: list[tuple[str, str]] = []
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
