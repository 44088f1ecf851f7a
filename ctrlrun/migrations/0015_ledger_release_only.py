# The budget ledger's guard (issue 12 review): besides DELETE, the database now refuses any UPDATE of a
# ledger row but setting its released_at once, and (SQLite) an INSERT OR REPLACE over an existing row.

from django.db import migrations


def guard(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 5)  # guard version 5 (ctrlrun/guards/v5.py): the ledger's rows release-only


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 4)  # what the migration before this one installed


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0014_delegations'),
    ]

    operations = [migrations.RunPython(guard, _guard_before)]
