"""The receipt chain starts from one head row at seq 0 and the genesis hash."""
from django.db import migrations

GENESIS_HASH = "sha256:" + "0" * 64  # copied, not imported: a migration must not change later


def create_head(apps, schema_editor):
    ChainHead = apps.get_model("ctrlrun", "ChainHead")
    ChainHead.objects.using(schema_editor.connection.alias).get_or_create(
        id=1, defaults={"seq": 0, "hash": GENESIS_HASH}
    )


class Migration(migrations.Migration):
    dependencies = [("ctrlrun", "0001_initial")]
    operations = [migrations.RunPython(create_head, migrations.RunPython.noop)]
