# Issue 22 items 3-4 (spec §D4, §D5): verified approvers, approver_role and M-of-N approvals.
#
# - Approval: ``required_roles`` (JSON [{control, role}]) and ``approvals_required`` (N), what the
#   request pinned when it was asked, and ``approvers`` (JSON [{agent, user, issuer, entitled,
#   granted_at}]), the verified people who granted it. All three are under the row's signature, now
#   ``ctrlrun.approval/v4``.
# - Guard version 10: the pinned roles and count are kept for life; a pending request may gain an
#   approver and stay pending (short of its count).
#
# Rows written before this migration are re-signed (v4, pinning nothing, no approvers) only where
# their v3 signature holds; anything else stays unsigned, refused where it is used, as before.
# Backwards, a v4 row that pins nothing and has no approvers is signed v3 again; any other is left
# unsigned (refused, never used without what it pinned).

from django.db import migrations, models


def _sign_v4(apps, schema_editor):
    from ctrlrun import signing
    from ctrlrun.store import signatures as sig

    for row in apps.get_model("ctrlrun", "Approval").objects.using(schema_editor.connection.alias).iterator():
        if signing.is_valid(sig.APPROVAL_DOMAIN_V3, sig.approval_document_v3(row), row.mac):
            row.mac = signing.sign(sig.APPROVAL_DOMAIN, sig.approval_document(row))
            row.save(update_fields=["mac"])


def _sign_v3(apps, schema_editor):
    from ctrlrun import signing
    from ctrlrun.store import signatures as sig

    for row in apps.get_model("ctrlrun", "Approval").objects.using(schema_editor.connection.alias).iterator():
        valid = signing.is_valid(sig.APPROVAL_DOMAIN, sig.approval_document(row), row.mac)
        plain = row.required_roles == "[]" and row.approvals_required == 1 and row.approvers == "[]"
        row.mac = signing.sign(sig.APPROVAL_DOMAIN_V3, sig.approval_document_v3(row)) if valid and plain else None
        row.save(update_fields=["mac"])


def _lift(apps, schema_editor):
    from ctrlrun import guards

    guards.remove(schema_editor.connection)


def _install(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 10)  # guard version 10, frozen (ctrlrun/guards/v10.py)


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 9)  # back to the schema before: the version it had


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0024_notifications'),
    ]

    operations = [
        migrations.RunPython(_lift, _guard_before),
        migrations.AddField(
            model_name='approval',
            name='required_roles',
            field=models.TextField(default='[]', help_text='The roles the request pins, JSON [{control, role}] '
                                                           '(policy v6 approver_role; signed).'),
        ),
        migrations.AddField(
            model_name='approval',
            name='approvals_required',
            field=models.PositiveIntegerField(default=1, help_text='How many distinct verified people must grant it '
                                                                   '(policy v6; signed).'),
        ),
        migrations.AddField(
            model_name='approval',
            name='approvers',
            field=models.TextField(default='[]', help_text='The verified approvers so far, JSON [{agent, user, '
                                                           'issuer, entitled, granted_at}] (signed).'),
        ),
        migrations.RunPython(_sign_v4, _sign_v3),
        migrations.RunPython(_install, _lift),
    ]
