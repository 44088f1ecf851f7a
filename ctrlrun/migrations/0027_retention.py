# Retention (§F1-F3, docs/retention.md): prune checkpoints, legal holds, and the lock row behind the
# guard's only scoped lift. Guard version 12 lets a receipt be deleted only inside the retention
# module's transaction (the lock opened with the next preimage of its chain), at or below a checkpoint,
# outside every live hold; the three tables are guarded too. The lock row is written here, before the
# guard is in place (once it is, nothing inserts it).

from django.db import migrations, models


def _lift(apps, schema_editor):
    from ctrlrun import guards

    guards.remove(schema_editor.connection)


def _install(apps, schema_editor):
    from ctrlrun import guards
    from ctrlrun.lift import seed_lock

    seed_lock(schema_editor.connection)
    guards.install(schema_editor.connection, 12)  # guard version 12, frozen (ctrlrun/guards/v12.py)


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 11)


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0026_ledger_chains'),
    ]

    operations = [
        migrations.RunPython(_lift, _guard_before),
        migrations.CreateModel(
            name='Hold',
            fields=[
                ('hold_id', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('from_seq', models.BigIntegerField()),
                ('to_seq', models.BigIntegerField(blank=True, help_text='Empty: to the end of the chain.', null=True)),
                ('reason', models.TextField()),
                ('placed_by', models.CharField(max_length=200)),
                ('placed_at', models.DateTimeField()),
                ('released_at', models.DateTimeField(blank=True, null=True)),
                ('released_by', models.CharField(blank=True, max_length=200, null=True)),
                ('mac', models.CharField(blank=True, help_text="ctrlrun's signature of the hold and its release.", max_length=76, null=True)),
            ],
            options={
                'db_table': 'ctrlrun_hold',
                'ordering': ['placed_at', 'hold_id'],
                'permissions': [('view_retention', 'Can see anchors, holds and prunes')],
            },
        ),
        migrations.CreateModel(
            name='PruneCheckpoint',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('seq', models.BigIntegerField(help_text='The last receipt seq the prune removed.', unique=True)),
                ('hash', models.CharField(help_text="That receipt's hash: the next one's prev_hash.", max_length=71)),
                ('schema', models.CharField(help_text='The receipt schema it was written under.', max_length=40)),
                ('at', models.DateTimeField(help_text="When (the store's clock).")),
                ('by', models.CharField(max_length=200)),
                ('reason', models.TextField()),
                ('mac', models.CharField(blank=True, help_text="ctrlrun's signature of the position, who and why.", max_length=76, null=True)),
            ],
            options={
                'db_table': 'ctrlrun_prunecheckpoint',
                'ordering': ['-seq'],
            },
        ),
        migrations.CreateModel(
            name='RetentionLock',
            fields=[
                ('id', models.PositiveSmallIntegerField(primary_key=True, serialize=False)),
                ('digest', models.CharField(max_length=64)),
                ('remaining', models.BigIntegerField()),
                ('open', models.BooleanField(default=False)),
                ('key_id', models.CharField(max_length=64)),
            ],
            options={
                'db_table': 'ctrlrun_retentionlock',
            },
        ),
        migrations.AlterField(
            model_name='event',
            name='type',
            field=models.CharField(choices=[('ACTION_PROPOSED', 'ACTION_PROPOSED'), ('POLICY_EVALUATED', 'POLICY_EVALUATED'), ('ACTION_DENIED', 'ACTION_DENIED'), ('APPROVAL_REQUESTED', 'APPROVAL_REQUESTED'), ('APPROVAL_GRANTED', 'APPROVAL_GRANTED'), ('APPROVAL_DENIED', 'APPROVAL_DENIED'), ('APPROVAL_EXPIRED', 'APPROVAL_EXPIRED'), ('APPROVAL_INVALIDATED', 'APPROVAL_INVALIDATED'), ('APPROVAL_CONSUMED', 'APPROVAL_CONSUMED'), ('APPROVAL_RETURNED', 'APPROVAL_RETURNED'), ('EFFECT_RESERVED', 'EFFECT_RESERVED'), ('EFFECT_RESERVATION_REFUSED', 'EFFECT_RESERVATION_REFUSED'), ('EXECUTION_STARTED', 'EXECUTION_STARTED'), ('EXECUTION_COMMITTED', 'EXECUTION_COMMITTED'), ('EXECUTION_FAILED', 'EXECUTION_FAILED'), ('EXECUTION_AMBIGUOUS', 'EXECUTION_AMBIGUOUS'), ('EFFECT_RESOLVED', 'EFFECT_RESOLVED'), ('RECONCILIATION_STARTED', 'RECONCILIATION_STARTED'), ('RECONCILIATION_RESOLVED', 'RECONCILIATION_RESOLVED'), ('AUTHORITY_RESOLVED', 'AUTHORITY_RESOLVED'), ('AUTHORITY_DENIED', 'AUTHORITY_DENIED'), ('DELEGATION_CREATED', 'DELEGATION_CREATED'), ('DELEGATION_REVOKED', 'DELEGATION_REVOKED'), ('DELEGATION_REJECTED', 'DELEGATION_REJECTED'), ('EXECUTION_SUSPENDED', 'EXECUTION_SUSPENDED'), ('EXECUTION_RESUMED', 'EXECUTION_RESUMED'), ('CLOCK_SKEW_DETECTED', 'CLOCK_SKEW_DETECTED'), ('RETENTION_APPLIED', 'RETENTION_APPLIED')], max_length=40),
        ),
        migrations.RunPython(_install, _lift),
    ]
