"""pgfleet's migration 0009 (a named queue's serial rule through flow control:
its jobs flagged, the unique index over running queue jobs replaced) in the
backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 9


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    dependencies = [("pgfleet", "0006_pgfleet_job_control")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
