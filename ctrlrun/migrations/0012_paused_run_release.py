# The release of a paused run's claim (resume_runs --release): who, when, why, and which claim.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0011_paused_run'),
    ]

    operations = [
        migrations.AddField(
            model_name='pausedrun',
            name='released_by',
            field=models.CharField(blank=True, help_text="Who released the run's last claim (resume_runs --release).", max_length=200, null=True),
        ),
        migrations.AddField(
            model_name='pausedrun',
            name='released_at',
            field=models.DateTimeField(blank=True, help_text='When its last claim was released.', null=True),
        ),
        migrations.AddField(
            model_name='pausedrun',
            name='release_reason',
            field=models.TextField(blank=True, help_text='Why its last claim was released.', null=True),
        ),
        migrations.AddField(
            model_name='pausedrun',
            name='released_claim',
            field=models.CharField(blank=True, help_text='The claim that was released: the process (host:pid) and when it claimed the run.', max_length=300, null=True),
        ),
    ]
