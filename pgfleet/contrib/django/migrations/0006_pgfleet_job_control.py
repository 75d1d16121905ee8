"""pgfleet's migration 0008 (job control: error history, results, snoozes, cancel
of running jobs, waiters) in the backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 8


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    dependencies = [("pgfleet", "0005_pgfleet_workflows")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
