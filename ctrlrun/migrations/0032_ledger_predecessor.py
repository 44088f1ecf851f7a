# Issue 21 (constant-cost budgets): guard version 14 finds a new ledger row's predecessor on
# PostgreSQL through the unique index of the places whatever the table's statistics (with none, the
# planner took the chain index and walked the whole chain on every charge). No schema change; SQLite's
# statements are version 13's.

from django.db import migrations


def _guard(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 14)  # guard version 14, frozen (ctrlrun/guards/v14.py)


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 13)  # back to the schema before: the version it had


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0031_suspended_continuations'),
    ]

    operations = [
        migrations.RunPython(_guard, _guard_before),
    ]
