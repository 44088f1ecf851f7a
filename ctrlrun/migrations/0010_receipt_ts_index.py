"""An index on receipts' ``ts`` (their finished_at): ``stats --since`` and the front page's last
24 hours read a window of receipts by time, not the whole table."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0009_chain_checks'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='receipt',
            index=models.Index(fields=['ts'], name='ctrlrun_receipt_ts_idx'),
        ),
    ]
