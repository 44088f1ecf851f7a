# Delegations (issue 12, C3): grants handed down at runtime, revoked once, never deleted.
# Numbered 0014 and based on 0012: 0013 is the budget ledger (another branch); the merge adds a merge migration.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0013_budget_ledger'),
    ]

    operations = [
        migrations.CreateModel(
            name='Delegation',
            fields=[
                ('delegation_id', models.CharField(help_text='dlg_ and 32 hex digits.', max_length=36, primary_key=True, serialize=False)),
                ('parent_id', models.CharField(db_index=True, help_text='The grant (policy id) or delegation (dlg_...) it was delegated from.', max_length=200)),
                ('depth', models.PositiveIntegerField(help_text="Steps below its root grant: 1 for a grant's direct delegation.")),
                ('grant_json', models.TextField(help_text='The delegated grant: its sorted canonical JSON, without id.')),
                ('created_by_agent', models.CharField(blank=True, max_length=200, null=True)),
                ('created_by_user', models.CharField(blank=True, max_length=200, null=True)),
                ('created_via', models.CharField(help_text='api, cli, break-glass or hop.', max_length=20)),
                ('created_at', models.DateTimeField()),
                ('revoked_at', models.DateTimeField(blank=True, null=True)),
                ('revoked_by', models.CharField(blank=True, max_length=200, null=True)),
            ],
            options={
                'ordering': ['created_at', 'delegation_id'],
                'permissions': [('revoke_delegation', 'Can revoke delegations')],
                'indexes': [models.Index(fields=['revoked_at', 'created_at'], name='ctrlrun_delegation_live_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('revoked_at__isnull', True), ('revoked_by__isnull', True)), models.Q(('revoked_at__isnull', False), ('revoked_by__isnull', False)), _connector='OR'), name='ctrlrun_delegation_revoked_by_someone')],
            },
        ),
    ]


def guard(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 4)  # guard version 4 (ctrlrun/guards/v4.py): delegations revoked once, never deleted


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 3)  # what the migration before this one installed


Migration.operations.append(migrations.RunPython(guard, _guard_before))
