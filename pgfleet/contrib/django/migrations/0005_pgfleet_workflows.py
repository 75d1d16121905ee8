"""pgfleet's migration 0007 (workflows: jobs waiting on parent jobs, batches with a
callback) in the backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 7


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    dependencies = [("pgfleet", "0004_pgfleet_flow_control")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
