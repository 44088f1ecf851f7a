# Issue 25: an approval spent by an attempt that provably did nothing (NotExecuted, or a reconcile
# hook's not_executed) is given back: consumed -> granted, recorded as APPROVAL_RETURNED.
#
# - Approval: ``returned`` (how many times it was given back), under its signature, now
#   ``ctrlrun.approval/v2``. The guard allows consumed -> granted only with ``returned`` up by exactly
#   one, and keeps it on every other change (a request starts at 0): a signed granted copy of the row
#   from before its last use has a lower count and is refused, and a row made up by hand is unsigned.
# - Event: the new type in the column's choices.
#
# Rows written before this migration are re-signed (v2, returned 0) only where their v1 signature
# holds; anything else stays unsigned, refused where it is used and named by
# ``receipts --verify-chain``, as before.

from django.db import migrations, models


def _sign_v2(apps, schema_editor):
    from ctrlrun import signing
    from ctrlrun.store import signatures as sig

    for row in apps.get_model("ctrlrun", "Approval").objects.using(schema_editor.connection.alias).iterator():
        if signing.is_valid(sig.APPROVAL_DOMAIN_V1, sig.approval_document_v1(row), row.mac):
            row.returned = 0
            row.mac = signing.sign(sig.APPROVAL_DOMAIN_V2, sig.approval_document_v2(row))
            row.save(update_fields=["returned", "mac"])


def _lift(apps, schema_editor):
    from ctrlrun import guards

    guards.remove(schema_editor.connection)


def _install(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 7)  # guard version 7, frozen (ctrlrun/guards/v7.py)


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 6)  # back to the schema before: the version it had


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0016_signed_rows'),
    ]

    operations = [
        migrations.RunPython(_lift, _guard_before),
        migrations.AddField(
            model_name='approval',
            name='returned',
            field=models.PositiveIntegerField(default=0, help_text='How many times an attempt that provably did '
                                                                   'nothing gave it back (signed; only grows).'),
        ),
        migrations.AlterField(
            model_name='event',
            name='type',
            field=models.CharField(
                choices=[('ACTION_PROPOSED', 'ACTION_PROPOSED'), ('POLICY_EVALUATED', 'POLICY_EVALUATED'),
                         ('ACTION_DENIED', 'ACTION_DENIED'), ('APPROVAL_REQUESTED', 'APPROVAL_REQUESTED'),
                         ('APPROVAL_GRANTED', 'APPROVAL_GRANTED'), ('APPROVAL_DENIED', 'APPROVAL_DENIED'),
                         ('APPROVAL_EXPIRED', 'APPROVAL_EXPIRED'), ('APPROVAL_INVALIDATED', 'APPROVAL_INVALIDATED'),
                         ('APPROVAL_CONSUMED', 'APPROVAL_CONSUMED'), ('APPROVAL_RETURNED', 'APPROVAL_RETURNED'),
                         ('EFFECT_RESERVED', 'EFFECT_RESERVED'),
                         ('EFFECT_RESERVATION_REFUSED', 'EFFECT_RESERVATION_REFUSED'),
                         ('EXECUTION_STARTED', 'EXECUTION_STARTED'), ('EXECUTION_COMMITTED', 'EXECUTION_COMMITTED'),
                         ('EXECUTION_FAILED', 'EXECUTION_FAILED'), ('EXECUTION_AMBIGUOUS', 'EXECUTION_AMBIGUOUS'),
                         ('EFFECT_RESOLVED', 'EFFECT_RESOLVED'),
                         ('RECONCILIATION_STARTED', 'RECONCILIATION_STARTED'),
                         ('RECONCILIATION_RESOLVED', 'RECONCILIATION_RESOLVED'),
                         ('AUTHORITY_RESOLVED', 'AUTHORITY_RESOLVED'), ('AUTHORITY_DENIED', 'AUTHORITY_DENIED'),
                         ('DELEGATION_CREATED', 'DELEGATION_CREATED'), ('DELEGATION_REVOKED', 'DELEGATION_REVOKED'),
                         ('DELEGATION_REJECTED', 'DELEGATION_REJECTED'),
                         ('EXECUTION_SUSPENDED', 'EXECUTION_SUSPENDED'), ('EXECUTION_RESUMED', 'EXECUTION_RESUMED'),
                         ('CLOCK_SKEW_DETECTED', 'CLOCK_SKEW_DETECTED')],
                max_length=40,
            ),
        ),
        migrations.RunPython(_sign_v2, migrations.RunPython.noop),
        migrations.RunPython(_install, _lift),
    ]
