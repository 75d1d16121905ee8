"""pgfleet's migration 0017 (keys take turns by number) in the
backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 17


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    # The Django migration before this one (its number follows pgfleet's order).
    dependencies = [("pgfleet", "0014_pgfleet_jobs_statistics")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
