"""Each verification of the evidence is recorded (``ChainCheck``), append-only like the evidence:
the console's front page shows the last one instead of re-hashing the store on every load, and an
incremental check starts from the last intact one. Events get a partial index on ``approval_id``
(the incremental check reads an approval's whole story through it); the policy document's help
text stops reading as an HTML tag in the admin.
"""
from django.db import migrations, models


def guard_checks(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 2)  # guard version 2 (ctrlrun/guards/v2.py): now with the table of checks


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 1)  # what the migration before this one installed


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0008_event_chain_and_signatures'),
    ]

    operations = [
        migrations.CreateModel(
            name='ChainCheck',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('checked_at', models.DateTimeField(help_text="When the check started (the store's clock).")),
                ('mode', models.CharField(choices=[('full', 'full'), ('incremental', 'incremental')], max_length=12)),
                ('from_receipt_seq', models.BigIntegerField(default=0, help_text='The receipt seq it started after (0: all).')),
                ('receipt_seq', models.BigIntegerField(help_text="The receipt seq it verified up to (the head's).")),
                ('receipt_hash', models.CharField(max_length=71)),
                ('from_event_seq', models.BigIntegerField(default=0)),
                ('event_seq', models.BigIntegerField()),
                ('event_hash', models.CharField(max_length=71)),
                ('ok', models.BooleanField()),
                ('breaks', models.PositiveIntegerField(default=0)),
                ('receipts_checked', models.BigIntegerField(default=0)),
                ('events_checked', models.BigIntegerField(default=0)),
                ('signatures_checked', models.BigIntegerField(default=0)),
                ('summary', models.TextField(help_text='The verdict, and the first breaks found.')),
                ('duration_seconds', models.FloatField()),
                ('ran_by', models.CharField(help_text='Who or what ran it.', max_length=200)),
                ('mac', models.CharField(blank=True, help_text="ctrlrun's signature of the result and the positions.", max_length=76, null=True)),
            ],
            options={
                'ordering': ['-id'],
            },
        ),
        migrations.AlterField(
            model_name='policydocument',
            name='source',
            field=models.TextField(help_text="Where the text was read from: a file's path, or &lt;string&gt; for text given directly."),
        ),
        migrations.AddIndex(
            model_name='event',
            index=models.Index(condition=models.Q(('approval_id__isnull', False)), fields=['approval_id'], name='ctrlrun_event_approval_idx'),
        ),
        migrations.AddIndex(
            model_name='chaincheck',
            index=models.Index(fields=['ok', 'id'], name='ctrlrun_chaincheck_ok_idx'),
        ),
        migrations.RunPython(guard_checks, _guard_before),
    ]
