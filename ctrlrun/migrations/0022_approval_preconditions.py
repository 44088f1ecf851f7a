# Preconditions (§8.6): an approval request keeps the fingerprint of the state the person approving
# saw (``protect(preconditions=...)``), compared with the state again before the approval is used.
#
# - Approval: ``precondition_fingerprint`` (null: the call named no preconditions), under its
#   signature, now ``ctrlrun.approval/v3``; guard version 8 keeps it fixed for the row's life, with
#   the other columns the person deciding read.
#
# Rows written before this migration are re-signed (v3, no fingerprint) only where their v2 signature
# holds; anything else stays unsigned, refused where it is used and named by ``receipts
# --verify-chain``, as before. Backwards, a v3 row without a fingerprint is signed v2 again; one bound
# to a state cannot be said in v2 and is left unsigned (refused, never used unbound).

from django.db import migrations, models


def _sign_v3(apps, schema_editor):
    from ctrlrun import signing
    from ctrlrun.store import signatures as sig

    for row in apps.get_model("ctrlrun", "Approval").objects.using(schema_editor.connection.alias).iterator():
        if signing.is_valid(sig.APPROVAL_DOMAIN_V2, sig.approval_document_v2(row), row.mac):
            row.precondition_fingerprint = None
            row.mac = signing.sign(sig.APPROVAL_DOMAIN_V3, sig.approval_document_v3(row))
            row.save(update_fields=["precondition_fingerprint", "mac"])


def _sign_v2(apps, schema_editor):
    from ctrlrun import signing
    from ctrlrun.store import signatures as sig

    for row in apps.get_model("ctrlrun", "Approval").objects.using(schema_editor.connection.alias).iterator():
        valid = signing.is_valid(sig.APPROVAL_DOMAIN_V3, sig.approval_document_v3(row), row.mac)
        row.mac = (signing.sign(sig.APPROVAL_DOMAIN_V2, sig.approval_document_v2(row))
                   if valid and row.precondition_fingerprint is None else None)
        row.save(update_fields=["mac"])


def _lift(apps, schema_editor):
    from ctrlrun import guards

    guards.remove(schema_editor.connection)


def _install(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 8)  # guard version 8, frozen (ctrlrun/guards/v8.py)


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 7)  # back to the schema before: the version it had


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0019_drop_unread_indexes'),
    ]

    operations = [
        migrations.RunPython(_lift, _guard_before),
        migrations.AddField(
            model_name='approval',
            name='precondition_fingerprint',
            field=models.CharField(blank=True, max_length=71, null=True,
                                   help_text='The fingerprint of the state the person approving saw (preconditions; '
                                             'signed, fixed).'),
        ),
        migrations.RunPython(_sign_v3, _sign_v2),
        migrations.RunPython(_install, _lift),
    ]
