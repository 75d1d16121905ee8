"""pgfleet's migration 0018 (a limited name's due jobs without a turn read in
claim order) in the backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 18


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    # The Django migration before this one (its number follows pgfleet's order).
    dependencies = [("pgfleet", "0015_pgfleet_flow_turn_numbers")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
