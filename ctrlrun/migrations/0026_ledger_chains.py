# Issue 21, item 2: a budget check at a constant cost. Each (grant_id, metric)'s ledger rows become a
# chain: ``n`` (1, 2, ...), ``cum`` (the running total of the chain's amounts, released ones included)
# and, for rows written from now on, a ``consumed_at`` never earlier than the predecessor's. What a
# window holds is then two index seeks and the window's released rows (docs/budgets.md).
#
# - The rows already written get their places in (consumed_at, id) order, so along each chain
#   consumed_at never goes back, as for the rows to come; their amounts and times are untouched.
# - Signatures: ``ctrlrun.ledger/v2`` covers n and cum. A row is re-signed only where its v1
#   signature holds; anything else stays unsigned, named by ``receipts --verify-chain`` as before.
# - Indexes: the partial index of un-released rows the SUM read is replaced by the chain's index
#   (grant_id, metric, consumed_at, cum) and a partial index of the released rows; a place is unique.
# - Guard version 11 (ctrlrun/guards/v11.py): n and cum are fixed like the other columns, and a new
#   row must continue its chain (the database refuses a gap, a fork, a total that does not add up
#   and a time that goes back).
#
# Backwards: the rows are signed v1 again (where their v2 signature holds), the columns dropped, the
# old index made again and guard version 10 put back.

from django.db import migrations, models

BATCH = 2000


def _lift(apps, schema_editor):
    from ctrlrun import guards

    guards.remove(schema_editor.connection)


def _guard_before(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 10)  # back to the schema before: the version it had


def _install(apps, schema_editor):
    from ctrlrun import guards

    guards.install(schema_editor.connection, 11)  # guard version 11, frozen (ctrlrun/guards/v11.py)


def _rows(apps, schema_editor):
    return apps.get_model("ctrlrun", "BudgetLedger").objects.using(schema_editor.connection.alias)


def _chain(apps, schema_editor):
    from ctrlrun.store import signatures as sig

    rows = _rows(apps, schema_editor)
    pair, n, cum, batch = None, 0, 0, []
    for row in rows.order_by("grant_id", "metric", "consumed_at", "id").iterator(chunk_size=BATCH):
        if (row.grant_id, row.metric) != pair:
            pair, n, cum = (row.grant_id, row.metric), 0, 0
        n, cum = n + 1, cum + row.amount
        fields = (row.grant_id, row.metric, row.amount, row.effect_key, row.attempt, row.consumed_at, row.released_at)
        signed = sig.ledger_ok(fields, row.mac, v1=True)
        row.n, row.cum = n, cum
        if signed:
            row.mac = sig.ledger_mac(*fields, n, cum)
        batch.append(row)
        if len(batch) >= BATCH:
            rows.bulk_update(batch, ["n", "cum", "mac"])
            batch = []
    if batch:
        rows.bulk_update(batch, ["n", "cum", "mac"])


def _unchain(apps, schema_editor):
    from ctrlrun.store import signatures as sig

    rows = _rows(apps, schema_editor)
    batch = []
    for row in rows.order_by("id").iterator(chunk_size=BATCH):
        fields = (row.grant_id, row.metric, row.amount, row.effect_key, row.attempt, row.consumed_at, row.released_at)
        if sig.ledger_ok((*fields, row.n, row.cum), row.mac):
            row.mac = sig.ledger_mac_v1(*fields)
            batch.append(row)
        if len(batch) >= BATCH:
            rows.bulk_update(batch, ["mac"])
            batch = []
    if batch:
        rows.bulk_update(batch, ["mac"])


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0025_verified_approvers'),
    ]

    operations = [
        migrations.RunPython(_lift, _guard_before),
        migrations.RemoveIndex(model_name='budgetledger', name='ctrlrun_ledger_budget_idx'),
        migrations.AddField(
            model_name='budgetledger', name='n',
            field=models.BigIntegerField(default=0, help_text="This row's place in its (grant_id, metric)'s chain: "
                                                              "1, 2, ..."),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name='budgetledger', name='cum',
            field=models.BigIntegerField(default=0, help_text="The running total of the chain's amounts up to this "
                                                              "row, released ones included."),
            preserve_default=False,
        ),
        migrations.RunPython(_chain, _unchain),
        migrations.AddConstraint(
            model_name='budgetledger',
            constraint=models.UniqueConstraint(fields=['grant_id', 'metric', 'n'], name='ctrlrun_ledger_one_place'),
        ),
        migrations.AddIndex(
            model_name='budgetledger',
            index=models.Index(fields=['grant_id', 'metric', 'consumed_at', 'cum'], name='ctrlrun_ledger_chain_idx'),
        ),
        migrations.AddIndex(
            model_name='budgetledger',
            index=models.Index(condition=models.Q(released_at__isnull=False), fields=['grant_id', 'metric',
                                                                                      'consumed_at'],
                               name='ctrlrun_ledger_released_idx'),
        ),
        migrations.RunPython(_install, _lift),
    ]
