"""pgfleet's migration 0004 (the enqueue's trace context) in the backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 4


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    dependencies = [("pgfleet", "0001_pgfleet_schema")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
