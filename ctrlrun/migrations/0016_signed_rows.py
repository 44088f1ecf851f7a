# Every row a decision or a page reads is signed or checked against the chain (issue 19): the
# application's database role could insert a delegation, release committed spend, copy an intact
# chain check over a broken one, or store a forged text under a policy's hash.
#
# - Delegation: ``agent`` (the delegated grant's subject, indexed: a call reads only its own agent's
#   delegations) and ``mac``.
# - BudgetLedger: ``mac``, and its identity (effect_key, attempt, grant_id, metric) unique.
# - ChainCheck: ``nonce`` (unique, under the signature, now ``ctrlrun.check/v2``).
# - PolicyDocument: ``mac``.
# - PausedRun: ``mac`` (what a resume is made of: the request, framework, state and resumer).
#
# Rows written before this migration are signed here only where they can be vouched for: a
# delegation whose DELEGATION_CREATED (and, if revoked, DELEGATION_REVOKED) event the chain holds; a
# budget charge whose release agrees with its effect record; a chain check whose v1 signature holds
# (the first of identical copies only); a policy text that hashes to its hash; a paused run whose
# request's APPROVAL_REQUESTED event the chain holds. Anything else stays
# unsigned, and is refused where it is used and named by ``receipts --verify-chain``.

import json
import uuid

from django.db import migrations, models

from ctrlrun.models import ID_LENGTH, MAC_LENGTH


def _sign_legacy(apps, schema_editor):
    from ctrlrun.store import signatures as sig

    alias = schema_editor.connection.alias

    def rows(name):
        return apps.get_model("ctrlrun", name).objects.using(alias)

    events = {}
    for data_text, type_ in rows("Event").filter(
            type__in=["DELEGATION_CREATED", "DELEGATION_REVOKED"], seq__isnull=False).values_list("data", "type"):
        try:
            data = json.loads(data_text) if isinstance(data_text, str) else data_text
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("delegation_id"), str):
            events.setdefault(data["delegation_id"], {})[type_] = data
    for row in rows("Delegation").all():
        try:
            agent = json.loads(row.grant_json)["subject"]["agent"]
        except (ValueError, KeyError, TypeError):
            agent = None
        row.agent = agent if isinstance(agent, str) else None
        told = events.get(row.delegation_id, {})
        created = told.get("DELEGATION_CREATED")
        vouched = created is not None and (created.get("parent_id"), created.get("depth"), created.get("created_via"),
                                           created.get("created_by_agent")) == (
            row.parent_id, row.depth, row.created_via, row.created_by_agent)
        if row.revoked_at is not None and "DELEGATION_REVOKED" not in told:
            vouched = False
        row.mac = sig.delegation_mac(
            row.delegation_id, row.parent_id, row.depth, row.grant_json, row.agent, row.created_by_agent,
            row.created_by_user, row.created_via, row.created_at, row.revoked_at, row.revoked_by) if vouched else None
        row.save(update_fields=["agent", "mac"])

    records = {key: (state, attempt) for key, state, attempt in
               rows("EffectRecord").values_list("effect_key", "state", "attempt")}
    for row in rows("BudgetLedger").all():
        state, attempt = records.get(row.effect_key, (None, None))
        released_ok = attempt is not None and (attempt > row.attempt or (attempt == row.attempt and state == "failed"))
        if row.released_at is None or released_ok:
            row.mac = sig.ledger_mac_v1(row.grant_id, row.metric, row.amount, row.effect_key, row.attempt,
                                     row.consumed_at, row.released_at)
            row.save(update_fields=["mac"])

    seen = set()
    for row in rows("ChainCheck").order_by("id"):
        document = sig._check_document_v1(row)
        if not sig.signing.is_valid(sig.CHECK_DOMAIN_V1, document, row.mac) or document in seen:
            continue
        seen.add(document)
        row.nonce = "chk_" + uuid.uuid4().hex
        row.mac = sig.signing.sign(sig.CHECK_DOMAIN, (row.nonce, *document))
        row.save(update_fields=["nonce", "mac"])

    requested = set(rows("Event").filter(type="APPROVAL_REQUESTED", seq__isnull=False)
                    .values_list("approval_id", flat=True))
    for row in rows("PausedRun").all():
        if row.approval_id in requested:
            row.mac = sig.paused_mac(row)
            row.save(update_fields=["mac"])

    from ctrlrun.errors import CTRLRunError
    from ctrlrun.policy import parse_authority, parse_policy

    documents = {row.hash: row for row in rows("PolicyDocument").all()}
    for row in documents.values():
        try:
            if row.source.startswith("authority file "):
                rehashed = parse_authority(row.text, row.source).hash
            elif row.source.endswith(")") and ", with the grants of " in row.source:
                grants = documents.get(row.source.rsplit("(", 1)[-1][:-1])
                authority = parse_authority(grants.text, grants.source) if grants is not None else None
                rehashed = parse_policy(row.text, row.source, environment=row.environment, authority=authority).hash \
                    if authority is not None else None
            else:
                rehashed = parse_policy(row.text, row.source, environment=row.environment).hash
        except (CTRLRunError, ValueError, TypeError):
            rehashed = None
        if rehashed == row.hash:
            sig.sign_policy_document(row)
            row.save(update_fields=["mac"])


def _lift(apps, schema_editor):
    from ctrlrun import guards

    guards.remove(schema_editor.connection)


def _install(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 6)  # guard version 6, frozen (ctrlrun/guards/v6.py)


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 5)  # back to the schema before: the version it had


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0015_ledger_release_only'),
    ]

    operations = [
        migrations.RunPython(_lift, _guard_before),
        migrations.AddField(
            model_name='delegation',
            name='agent',
            field=models.CharField(blank=True, help_text='The agent the grant is delegated to.', max_length=200,
                                   null=True),
        ),
        migrations.AddField(
            model_name='delegation',
            name='mac',
            field=models.CharField(blank=True, help_text="ctrlrun's signature of the delegation and its revocation.",
                                   max_length=MAC_LENGTH, null=True),
        ),
        migrations.AddIndex(
            model_name='delegation',
            index=models.Index(fields=['agent'], name='ctrlrun_delegation_agent_idx'),
        ),
        migrations.AddField(
            model_name='budgetledger',
            name='mac',
            field=models.CharField(blank=True, help_text="ctrlrun's signature of the charge and its release.",
                                   max_length=MAC_LENGTH, null=True),
        ),
        migrations.AddConstraint(
            model_name='budgetledger',
            constraint=models.UniqueConstraint(fields=('effect_key', 'attempt', 'grant_id', 'metric'),
                                               name='ctrlrun_ledger_one_charge'),
        ),
        migrations.AddField(
            model_name='chaincheck',
            name='nonce',
            field=models.CharField(help_text="The check's own identity, under its signature.", max_length=ID_LENGTH,
                                   null=True, unique=True),
        ),
        migrations.AddField(
            model_name='policydocument',
            name='mac',
            field=models.CharField(blank=True, help_text="ctrlrun's signature of the hash, the text and where it came "
                                                         "from.", max_length=MAC_LENGTH, null=True),
        ),
        migrations.AddField(
            model_name='pausedrun',
            name='mac',
            field=models.CharField(blank=True, help_text="ctrlrun's signature of the request, framework, state and "
                                                         "resumer.", max_length=MAC_LENGTH, null=True),
        ),
        migrations.RunPython(_sign_legacy, migrations.RunPython.noop),
        migrations.RunPython(_install, _lift),
    ]
