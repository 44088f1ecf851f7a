"""Event data becomes JSON text, kept in the order it was written (see models.JSONTextField).

On SQLite, altering a column rebuilds the table, which drops its triggers: the append-only
guard of 0006 is put back afterwards.
"""
import importlib

from django.db import migrations

import ctrlrun.models


def reinstall_guard(apps, schema_editor):
    importlib.import_module("ctrlrun.migrations.0006_evidence_append_only").install(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("ctrlrun", "0006_evidence_append_only")]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="data",
            field=ctrlrun.models.JSONTextField(default=dict),
        ),
        migrations.RunPython(reinstall_guard, migrations.RunPython.noop),
    ]
