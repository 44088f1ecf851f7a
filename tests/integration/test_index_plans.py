"""The secondary indexes on the tables every call writes are exactly those a reader needs (issue 21,
item 3; docs/performance.md, "Which indexes the readers use"), and those readers' plans read them: a
page listing the receipts of a call, or of an effect key, must never become a scan of the table.

On PostgreSQL an empty table's plan is a sequential scan whatever its indexes, so the plans are taken
with ``enable_seqscan`` off there: what is asked is whether an index can serve the reader at all."""
from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ctrlrun import store
from ctrlrun.store import sql as hot

pytestmark = pytest.mark.django_db

WRITTEN = ("ctrlrun_effectrecord", "ctrlrun_event", "ctrlrun_receipt", "ctrlrun_budgetledger", "ctrlrun_chainhead")

#: The secondary (not unique, not primary key) indexes of the written tables, by the model's names.
EXPECTED = {
    "ctrlrun_effectrecord": {"ctrlrun_effect_state_idx"},
    "ctrlrun_event": {"ctrlrun_event_approval_idx", "action_id", "effect_key"},
    "ctrlrun_receipt": {"ctrlrun_receipt_ts_idx", "action_id", "effect_key"},
    "ctrlrun_budgetledger": {"ctrlrun_ledger_chain_idx", "ctrlrun_ledger_released_idx"},
    "ctrlrun_chainhead": set(),
}


def _secondary(table: str) -> set[str]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    out = set()
    for name, info in found.items():
        if not info["index"] or info["primary_key"] or info["unique"]:
            continue
        # db_index=True names its index by column and a hash: named here by its one column.
        hashed = re.fullmatch(f"{table}_{info['columns'][0]}_[0-9a-f]{{8}}", name)
        out.add(info["columns"][0] if hashed else name)
    return out


def test_the_written_tables_carry_only_the_indexes_a_reader_needs():
    """The index list, pinned: PostgreSQL's ``_like`` twins and the ledger's (effect_key, attempt) index
    (which the unique charge index serves) are gone; a new index on these tables is a cost on every
    call, added with a reader whose plan needs it."""
    assert {table: _secondary(table) for table in WRITTEN} == EXPECTED
    with connection.cursor() as cursor:
        names = [name for table in WRITTEN for name in connection.introspection.get_constraints(cursor, table)]
    assert not [name for name in names if name.endswith("_like")]


def _plans(reader) -> list[tuple[str, str]]:
    """(statement, plan text) of each SELECT ``reader`` sends (on PostgreSQL through a client-side
    cursor, so that a reader that iterates in batches is seen too)."""
    saved = connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS", False)
    connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
    try:
        with CaptureQueriesContext(connection) as captured:
            reader()
    finally:
        connection.settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = saved
    out = []
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
        for query in captured.captured_queries:
            text = query["sql"]
            if not text.lstrip().upper().startswith("SELECT"):
                continue
            if connection.vendor == "sqlite":
                cursor.execute("EXPLAIN QUERY PLAN " + text)
                plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
            else:
                cursor.execute("EXPLAIN " + text)
                plan = "\n".join(row[0] for row in cursor.fetchall())
            out.append((text, plan))
    return out


def _scans(plan: str, table: str) -> bool:
    """Whether the plan reads the whole table: SQLite's SCAN (through an index too: a scan in that
    index's order is still every row); on PostgreSQL a sequential scan, or a plan with no index
    condition (a whole index walked for its order)."""
    if connection.vendor == "sqlite":
        return any(line.strip().startswith((f"SCAN {table}", f"SCAN TABLE {table}")) for line in plan.splitlines())
    return f"Seq Scan on {table}" in plan or ("Index Cond" not in plan and "Recheck Cond" not in plan)


def _raw(statement: str, params: list) -> list:
    with store.base.statements() as cursor:
        return cursor.execute(statement, params).fetchall()


NOW = dt.datetime(2026, 12, 2, tzinfo=dt.timezone.utc)

#: (what reads, the table it must not scan, the reader).
READERS = [
    ("call page / inspect: the call's events", "ctrlrun_event", lambda: store.events_for_action("act_x")),
    ("call page / inspect / approval page: the call's receipts", "ctrlrun_receipt",
     lambda: store.receipts_for_action("act_x")),
    ("effect page: the key's events", "ctrlrun_event", lambda: store.events_for_effect("refund:x")),
    ("effect page: the key's receipts", "ctrlrun_receipt", lambda: store.receipts_for_effect("refund:x")),
    ("a retry of a failed record", "ctrlrun_event", lambda: _raw(hot.LATER_HISTORY, ["refund:x"])),
    ("front page tiles", "ctrlrun_effectrecord", store.overview),
    ("reconcile", "ctrlrun_effectrecord", store.reconcile_candidates),
    ("front page, the last 24 hours", "ctrlrun_receipt",
     lambda: list(store.receipt_documents_since(NOW - dt.timedelta(hours=24), limit=100))),
    ("stats --since", "ctrlrun_receipt", lambda: list(store.receipt_documents_since(NOW))),
    ("a budgeted call's reservation", "ctrlrun_budgetledger",
     lambda: _raw(hot.ledger_spent(2), ["g", "count", "g", "count", NOW, "g", "count", NOW] * 2)),
    ("a budgeted call's charge", "ctrlrun_budgetledger",
     lambda: _raw(hot.ledger_last(2), ["g", "count", "g", "amount"])),
    ("a failed attempt's release", "ctrlrun_budgetledger", lambda: _raw(hot.LEDGER_HELD, ["refund:x", 1])),
    ("effects: an attempt's charges", "ctrlrun_budgetledger", lambda: store.charges_of("refund:x", 1)),
]


@pytest.fixture
def ledger_of_others():
    """Charges of other attempts, not released (one chain), and the ledger's statistics: on an empty
    ledger PostgreSQL rates walking a partial index as cheap as any other plan."""
    with connection.cursor() as cursor:
        cursor.executemany(
            'INSERT INTO "ctrlrun_budgetledger" ("grant_id", "metric", "amount", "effect_key", "attempt", '
            '"consumed_at", "n", "cum") VALUES (%s, %s, %s, %s, %s, %s, %s, %s)',
            [("other", "count", 1, f"other:{n}", 1, NOW, n, n) for n in range(1, 501)])
        if connection.vendor == "postgresql":
            cursor.execute('ANALYZE "ctrlrun_budgetledger"')


@pytest.mark.parametrize("what,table,reader", READERS, ids=[r[0] for r in READERS])
def test_each_reader_reads_its_table_through_an_index(what, table, reader, ledger_of_others):
    plans = [(text, plan) for text, plan in _plans(reader) if f'"{table}"' in text]
    assert plans, f"{what}: no statement on {table} was seen"
    for text, plan in plans:
        assert not _scans(plan, table), f"{what} scans {table}:\n{text}\n{plan}"
