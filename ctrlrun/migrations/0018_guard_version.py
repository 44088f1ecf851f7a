# The guard records its version (ctrlrun.guards): guard version 7, what 0017 installs, put in place
# again with its record (a PostgreSQL function ctrlrun_guard_version(), a SQLite view of that name),
# for a store that ran 0017 before migrations installed frozen, recorded versions. ``manage.py check``
# says when the database's version is missing or older than the code's (ctrlrun.W005).
#
# Backwards it installs guard version 7 too: what 0017 leaves in place.

from django.db import migrations


def _install(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 7)  # guard version 7, frozen (ctrlrun/guards/v7.py)


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0017_approval_returned'),
    ]

    operations = [migrations.RunPython(_install, _install)]
