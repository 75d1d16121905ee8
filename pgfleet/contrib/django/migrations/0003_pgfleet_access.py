"""pgfleet's migration 0005 (revoked credentials and console sessions of the jobs API)
in the backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 5


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    dependencies = [("pgfleet", "0002_pgfleet_trace_context")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
