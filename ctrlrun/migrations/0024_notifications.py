# Approvers hear about a request (ctrlrun.notify): each mail is a Delivery (who, to which address, why,
# how sending went), and the one link a mail carries works once: its use is a LinkUse row.
#
# Both tables are guarded (guard version 9, ctrlrun/guards/v9.py): a delivery keeps who and why, starts
# pending with no attempt, changes only while pending and is never deleted; a link's use is never
# changed, replaced or deleted. Backwards: the tables go and guard version 8 is back.

from django.db import migrations, models


def _lift(apps, schema_editor):
    from ctrlrun import guards

    guards.remove(schema_editor.connection)


def _install(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 9)  # guard version 9, frozen (ctrlrun/guards/v9.py)


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 8)  # back to the schema before: the version it had


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0022_approval_preconditions'),
    ]

    operations = [
        migrations.RunPython(_lift, _guard_before),
        migrations.CreateModel(
            name='Delivery',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('approval_id', models.CharField(help_text='The approval request the mail is about.', max_length=36)),
                ('recipient', models.CharField(help_text='The console user told (their username).', max_length=150)),
                ('address', models.CharField(help_text="Where the mail goes: the user's email address then.",
                                             max_length=254)),
                ('basis', models.CharField(help_text='Why this person: role:NAME (each role the request pins), '
                                                     'setting, or permission.', max_length=400)),
                ('status', models.CharField(choices=[('pending', 'pending'), ('sent', 'sent'), ('failed', 'failed'),
                                                     ('dropped', 'dropped')], default='pending', max_length=10)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('last_error', models.TextField(blank=True, help_text='Why the last attempt failed, or why it was '
                                                                      'dropped.', null=True)),
                ('next_try', models.DateTimeField(blank=True, help_text='When a pending mail is tried next.',
                                                  null=True)),
                ('created_at', models.DateTimeField()),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
                ('link_nonce', models.CharField(help_text="The identity of the mail's one link.", max_length=40,
                                                unique=True)),
                ('mac', models.CharField(blank=True, help_text="ctrlrun's signature of every column.", max_length=76,
                                         null=True)),
            ],
            options={
                'ordering': ['approval_id', 'recipient'],
                'indexes': [models.Index(fields=['status', 'next_try'], name='ctrlrun_delivery_due_idx')],
                'constraints': [models.UniqueConstraint(fields=('approval_id', 'recipient'),
                                                        name='ctrlrun_delivery_once')],
            },
        ),
        migrations.CreateModel(
            name='LinkUse',
            fields=[
                ('nonce', models.CharField(help_text="The link's identity (Delivery.link_nonce).", max_length=40,
                                           primary_key=True, serialize=False)),
                ('approval_id', models.CharField(max_length=36)),
                ('used_by', models.CharField(help_text='The console user who opened it (its addressee).',
                                             max_length=150)),
                ('used_at', models.DateTimeField()),
                ('mac', models.CharField(blank=True, max_length=76, null=True)),
            ],
            options={
                'ordering': ['used_at'],
            },
        ),
        migrations.RunPython(_install, _lift),
    ]
