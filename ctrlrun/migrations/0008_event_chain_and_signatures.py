"""Events join a hash chain of their own; the head, effect records and approvals are signed; the
database refuses every write outside the state tables (guard version 1, ``ctrlrun/guards/v1.py``).

Events already in the store are chained in the order they were written (their ids), and the rows
already there are signed with this store's key, so an upgraded store verifies from the start.
"""
import hashlib
import json

from django.db import migrations, models

GENESIS_HASH = "sha256:" + "0" * 64  # copied, not imported: a migration must not change later


def _event_hash(seq, prev_hash, ts, type_, action_id, effect_key, approval_id, data):
    """ctrlrun.event/v1 as it was defined when this migration was written (``data``: the column's text)."""
    document = ["ctrlrun.event/v1", seq, prev_hash, ts, type_, action_id, effect_key, approval_id, data]
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def chain_and_sign(apps, schema_editor):
    import datetime as dt

    from ctrlrun import guards, signing
    from ctrlrun.store import signatures as sig

    connection = schema_editor.connection
    alias = connection.alias
    guards.remove(connection)
    Event = apps.get_model("ctrlrun", "Event")
    previous, seq = GENESIS_HASH, 0
    with connection.cursor() as cursor:  # the data column's exact text, not a re-encoding of it
        cursor.execute('SELECT "id", "type", "action_id", "effect_key", "approval_id", "data" FROM "ctrlrun_event" '
                       'ORDER BY "id"')
        rows = cursor.fetchall()
    times = dict(Event.objects.using(alias).values_list("id", "ts"))
    for id_, type_, action_id, effect_key, approval_id, data in rows:
        seq += 1
        ts = times[id_].astimezone(dt.timezone.utc).isoformat(timespec="microseconds")
        digest = _event_hash(seq, previous, ts, type_, action_id, effect_key, approval_id, data)
        Event.objects.using(alias).filter(pk=id_).update(seq=seq, prev_hash=previous, hash=digest)
        previous = digest
    for approval in apps.get_model("ctrlrun", "Approval").objects.using(alias).iterator():
        # v1: what an approval was signed over then (0017 moves the rows to v2).
        approval.mac = signing.sign(sig.APPROVAL_DOMAIN_V1, sig.approval_document_v1(approval))
        approval.save(update_fields=["mac"])
    for record in apps.get_model("ctrlrun", "EffectRecord").objects.using(alias).iterator():
        record.mac = sig.effect_mac(record.effect_key, record.action, record.state, record.action_id, record.attempt,
                                    record.lease_expires_at, record.resolved_by, record.pending)
        record.save(update_fields=["mac"])
    ChainHead = apps.get_model("ctrlrun", "ChainHead")
    head, _ = ChainHead.objects.using(alias).get_or_create(id=1, defaults={"seq": 0, "hash": GENESIS_HASH})
    head.event_seq, head.event_hash, head.key_id = seq, previous, signing.key_id()
    head.mac = signing.sign(sig.HEAD_DOMAIN, sig.head_document(head.seq, head.hash, seq, previous, head.key_id))
    head.save()
    guards.install(connection, 1)  # guard version 1, frozen (ctrlrun/guards/v1.py), never today's


def unguard(apps, schema_editor):
    import importlib

    from ctrlrun import guards

    guards.remove(schema_editor.connection)
    importlib.import_module("ctrlrun.migrations.0006_evidence_append_only").install(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0007_event_data_as_text'),
    ]

    operations = [
        migrations.AddField(
            model_name='approval',
            name='mac',
            field=models.CharField(blank=True, help_text="ctrlrun's signature of the request, its answer and its use.", max_length=76, null=True),
        ),
        migrations.AddField(
            model_name='chainhead',
            name='event_hash',
            field=models.CharField(default='sha256:0000000000000000000000000000000000000000000000000000000000000000', max_length=71),
        ),
        migrations.AddField(
            model_name='chainhead',
            name='event_seq',
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='chainhead',
            name='key_id',
            field=models.CharField(help_text='The id of the key that signs this store.', max_length=32, null=True),
        ),
        migrations.AddField(
            model_name='chainhead',
            name='mac',
            field=models.CharField(max_length=76, null=True),
        ),
        migrations.AddField(
            model_name='effectrecord',
            name='mac',
            field=models.CharField(blank=True, help_text="ctrlrun's signature of the state, holder, attempt, lease and resolver.", max_length=76, null=True),
        ),
        migrations.AddField(
            model_name='effectrecord',
            name='pending',
            field=models.TextField(blank=True, help_text="The running attempt's opening events, until they join the event chain when it ends.", null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='hash',
            field=models.CharField(max_length=71, null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='prev_hash',
            field=models.CharField(max_length=71, null=True),
        ),
        migrations.AddField(
            model_name='event',
            name='seq',
            field=models.BigIntegerField(help_text='Position in the event chain.', null=True, unique=True),
        ),
        migrations.RunPython(chain_and_sign, unguard),
    ]
