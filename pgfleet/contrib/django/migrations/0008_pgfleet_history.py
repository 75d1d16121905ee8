"""pgfleet's migration 0010 (finished jobs in day partitions of pgfleet.jobs_history,
dropped whole by retention) in the backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 10


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    # The Django migration before this one (its number follows pgfleet's order).
    dependencies = [("pgfleet", "0007_pgfleet_queue_flow")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
