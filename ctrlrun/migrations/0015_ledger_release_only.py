# The budget ledger's guard (issue 12 review): besides DELETE, the database now refuses any UPDATE of a
# ledger row but setting its released_at once, and (SQLite) an INSERT OR REPLACE over an existing row.

from django.db import migrations


def guard(apps, schema_editor):
    from ctrlrun import guard

    guard.install(schema_editor.connection)  # the whole guard, the ledger's rows now release-only


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0014_delegations'),
    ]

    operations = [migrations.RunPython(guard, migrations.RunPython.noop)]
