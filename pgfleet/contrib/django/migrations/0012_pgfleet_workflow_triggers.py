"""pgfleet's migration 0014 (the workflow triggers off the completion's path: no
AFTER UPDATE row trigger on pgfleet.jobs) in the backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 14


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    # The Django migration before this one (its number follows pgfleet's order).
    dependencies = [("pgfleet", "0011_pgfleet_result_json")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
