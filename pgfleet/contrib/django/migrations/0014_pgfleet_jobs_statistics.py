"""pgfleet's migration 0016 (the claim table's ANALYZE samples less) in the
backend's database."""

from django.db import migrations

from pgfleet.contrib.django.schema import apply_pgfleet_migrations

PGFLEET_VERSION = 16


class Migration(migrations.Migration):  # type: ignore[misc]  # Django ships no annotations
    # The Django migration before this one (its number follows pgfleet's order).
    dependencies = [("pgfleet", "0013_pgfleet_claim_flow_cost")]
    operations = [
        migrations.RunPython(apply_pgfleet_migrations, migrations.RunPython.noop, elidable=False),
    ]
