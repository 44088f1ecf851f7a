"""The budget ledger (authority, §C5): one row per budget charge of an attempt, written in the
transaction that takes the key, released (never deleted) when the attempt ends failed. The guard
is installed again, now with the ledger's no-delete trigger.
"""
from django.db import migrations, models


def guard_ledger(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 3)  # guard version 3 (ctrlrun/guards/v3.py): now with the ledger


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 2)  # what the migration before this one installed


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0012_paused_run_release'),
    ]

    operations = [
        migrations.CreateModel(
            name='BudgetLedger',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('grant_id', models.CharField(help_text='The grant whose budget this charge spends.', max_length=200)),
                ('metric', models.CharField(help_text="'count', or the name of the argument whose value is summed.", max_length=200)),
                ('amount', models.BigIntegerField(help_text='What the call spent (>= 0).')),
                ('effect_key', models.CharField(help_text='The effect key the call took.', max_length=1024)),
                ('attempt', models.PositiveIntegerField(help_text='The attempt of that key that made the charge.')),
                ('consumed_at', models.DateTimeField(help_text="When the charge was made (the store's clock).")),
                ('released_at', models.DateTimeField(blank=True, help_text='When the attempt ended failed and the charge was given back.', null=True)),
            ],
            options={
                'ordering': ['id'],
                'indexes': [models.Index(condition=models.Q(('released_at__isnull', True)), fields=['grant_id', 'metric', 'consumed_at', 'amount', 'released_at'], name='ctrlrun_ledger_budget_idx'), models.Index(fields=['effect_key', 'attempt'], name='ctrlrun_ledger_attempt_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('amount__gte', 0)), name='ctrlrun_ledger_amount_nonneg')],
            },
        ),
        migrations.RunPython(guard_ledger, _guard_before),
    ]
