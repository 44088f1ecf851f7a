"""Drop the secondary indexes no reader needs (issue 21, item 3). The readers and their plans are in
docs/performance.md ("Which indexes the readers use"); ``bench/index_plans.py`` prints them again.

- ``ctrlrun_ledger_attempt_idx`` (effect_key, attempt) on the budget ledger is the leading part of the
  unique index behind ``ctrlrun_ledger_one_charge`` (effect_key, attempt, grant_id, metric): its two
  readers (``LEDGER_HELD``, a failed attempt's release; ``charges_of``, the ``effects`` command) are
  served by that one on both databases, so a budgeted call no longer indexes the same columns twice.
- PostgreSQL only: the ``..._like`` indexes Django adds beside every indexed or primary-key text
  column (``varchar_pattern_ops``, for ``LIKE 'prefix%'`` outside the C locale) on the tables every
  allowed call writes: receipts' receipt_id, action_id and effect_key, events' action_id and
  effect_key, effect records' effect_key. No reader asks for a prefix (the console's searches are
  ``icontains``, which no btree index serves); the planner picked them for equality lookups only
  because they tie with the column's plain index (or primary key), which serves each of those
  lookups the same. Backwards they are made again, as Django makes them.

Every other secondary index on the written tables has a console page or a command whose plan needs it.
Dropping an index leaves the guard triggers as they are (``ctrlrun.guards``: nothing to reinstall).
"""

from django.db import migrations

#: (model, field) whose PostgreSQL ``_like`` index is dropped.
LIKE_INDEXED = (
    ("receipt", "receipt_id"), ("receipt", "action_id"), ("receipt", "effect_key"),
    ("event", "action_id"), ("event", "effect_key"), ("effectrecord", "effect_key"),
)


def _like_indexes(apps, schema_editor):
    for model_name, field_name in LIKE_INDEXED:
        model = apps.get_model("ctrlrun", model_name)
        yield model, model._meta.get_field(field_name)


def _drop_like(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for model, field in _like_indexes(apps, schema_editor):
        name = schema_editor._create_index_name(model._meta.db_table, [field.column], suffix="_like")
        schema_editor.execute(schema_editor._delete_index_sql(model, name))  # DROP INDEX IF EXISTS


def _make_like(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for model, field in _like_indexes(apps, schema_editor):
        statement = schema_editor._create_like_index_sql(model, field)
        if statement is not None:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ('ctrlrun', '0018_guard_version'),
    ]

    operations = [
        migrations.RemoveIndex(model_name='budgetledger', name='ctrlrun_ledger_attempt_idx'),
        migrations.RunPython(_drop_like, _make_like),
    ]
