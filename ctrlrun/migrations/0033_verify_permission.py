# The console's deployment check (verify, §F7): its permission, ctrlrun.run_verify. No table, no guard change.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0032_ledger_predecessor'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='receipt',
            options={'ordering': ['seq'], 'permissions': [('run_verify', 'Can grade the deployment (verify) in the console')]},
        ),
    ]
