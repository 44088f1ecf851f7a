"""A budgeted call's ledger statements keep their cost when the ledger has no statistics (issue 21:
"constant-cost budgets"). The guard's lookup of a new row's predecessor runs on every charge; so do
the store's reads of a chain's last row and of a window. Each must reach its row through an index
seek, whatever the planner knows about the table.

PostgreSQL: a server without autovacuum (this project's) never analyses the ledger. With no statistics
the planner rated the chain index ``(grant, metric, consumed_at, cum)``, filtered on ``n``, as cheap as
the unique index of the places: the lookup walked the whole chain (657 buffers at 20,000 rows a chain).
The plans are taken on a temporary copy of the ledger (autovacuum never reaches a temporary table, so
it has no statistics, whatever the server's settings) with the same indexes built in the same order,
for the statement the installed guard runs (taken from its function's source), as a generic plan (what
PL/pgSQL caches) and as a custom one. Buffers are counted, not time.

SQLite: the installed trigger's lookup, ``EXPLAIN QUERY PLAN`` on the ledger (never analysed)."""
from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from django.db import connection, transaction

from ctrlrun.store import sql as hot

pytestmark = pytest.mark.django_db

LEDGER = "ctrlrun_budgetledger"
COPY = "ledger_copy"
ROWS = 20_000  # a chain's rows (two chains: count and amount, as a budgeted call writes)
NOW = dt.datetime(2026, 12, 4, tzinfo=dt.timezone.utc)
#: The new row's columns the guard's lookup reads, in parameter order, with their PostgreSQL types.
NEW_COLUMNS = (("grant_id", "varchar"), ("metric", "varchar"), ("n", "bigint"), ("cum", "bigint"),
               ("amount", "bigint"), ("consumed_at", "timestamptz"))


def _subquery(text: str, start: int) -> str:
    """The parenthesised expression opening at ``text[start]``."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    raise AssertionError(f"unbalanced parentheses in {text[start:]!r}")


def _lookup(source: str) -> str:
    """The guard's predecessor lookup: the first subquery of the source reading the ledger as "p"."""
    for start in (m.start() for m in re.finditer(r"\(SELECT ", source)):
        found = _subquery(source, start)
        if f'FROM "{LEDGER}" AS "p"' in found:
            return found
    raise AssertionError(f"no predecessor lookup in {source!r}")


def _pg_one_place_and_chain(cursor) -> tuple[str, str]:
    """Build the copy: the ledger's columns, its indexes in the order the migrations made them (an
    equal-cost tie goes to the index the planner met first), ``ROWS`` rows in each of two chains, and
    return the copy's names for ``ctrlrun_ledger_one_place`` and ``ctrlrun_ledger_chain_idx``."""
    cursor.execute(f'CREATE TEMPORARY TABLE "{COPY}" (LIKE "{LEDGER}" INCLUDING DEFAULTS INCLUDING IDENTITY)')
    cursor.execute("SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON "
                   "c.oid = i.indexrelid WHERE i.indrelid = %s::regclass ORDER BY i.indexrelid", [LEDGER])
    names = {}
    for name, definition in cursor.fetchall():
        copy = f"copy_{name}"
        names[name] = copy
        definition = definition.replace(f"INDEX {name} ON public.{LEDGER} ", f"INDEX {copy} ON {COPY} ")
        assert f"ON {COPY} " in definition, definition
        cursor.execute(definition)
    cursor.execute(
        f'INSERT INTO "{COPY}" ("grant_id", "metric", "amount", "effect_key", "attempt", "consumed_at", "n", "cum") '
        f"SELECT 'payer', m, 1, 'pay:e' || i, 1, %s + i * interval '1 ms', i, i FROM generate_series(1, {ROWS}) "
        "AS i, (VALUES ('count'), ('amount')) AS v(m) ORDER BY i, m", [NOW])
    cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [COPY])
    assert cursor.fetchone()[0] < 0, "the copy has statistics"
    return names["ctrlrun_ledger_one_place"], names["ctrlrun_ledger_chain_idx"]


def _scans(plan: dict) -> list[dict]:
    """The plan's nodes that read the copy."""
    out = [plan] if plan.get("Relation Name") == COPY else []
    for child in plan.get("Plans", []):
        out += _scans(child)
    return out


def _pg_plans(cursor, name: str, statement: str, types: list[str], values: list) -> list[dict]:
    """The plan of ``statement`` (``$1``... for ``values``) run generic and custom, with buffers."""
    cursor.execute(f'PREPARE {name}({", ".join(types)}) AS {statement}')
    try:
        plans = []
        for mode in ("force_generic_plan", "force_custom_plan"):
            cursor.execute(f"SET LOCAL plan_cache_mode = {mode}")
            placeholders = ", ".join(["%s"] * len(values))
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {name}({placeholders})", values)
            raw = cursor.fetchone()[0]
            plans.append((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
        return plans
    finally:
        cursor.execute(f"DEALLOCATE {name}")


def _installed_pg_lookup(cursor) -> str:
    cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'ctrlrun_guard_budgetledger'")
    [(source,)] = cursor.fetchall()
    lookup = _lookup(source)
    for i, (column, _) in enumerate(NEW_COLUMNS, start=1):
        lookup = lookup.replace(f'NEW."{column}"', f"${i}")
    assert "NEW." not in lookup, lookup
    return lookup.replace(f'"{LEDGER}"', f'"{COPY}"')


def _numbered(statement: str) -> str:
    """A store statement's ``%s`` placeholders as ``$1``, ``$2``..."""
    parts = statement.split("%s")
    return "".join(part + (f"${i}" if i < len(parts) else "") for i, part in enumerate(parts, start=1))


def _blocks(plan: dict) -> int:
    """The buffers a plan read (a temporary table's are local)."""
    return sum(plan.get(f"{kind} {what} Blocks", 0) for kind in ("Shared", "Local") for what in ("Hit", "Read"))


def _seeks(plan: dict, index: str) -> bool:
    """Whether the scans of the copy are index seeks through ``index`` with no row filtered away and a
    handful of buffers (a walk of a 20,000-row chain reads hundreds)."""
    scans = _scans(plan)
    return (bool(scans) and all(s["Node Type"] in ("Index Scan", "Index Only Scan") and s["Index Name"] == index
                                and not s.get("Rows Removed by Filter") and "Index Cond" in s for s in scans)
            and _blocks(plan) <= 12)


def _values(n: int, cum: int, at: dt.datetime, metric: str = "count") -> list:
    return ["payer", metric, n, cum, 1, at]


def _named(statement: str) -> str:
    """``$k`` as psycopg's ``%(pk)s``, for a run with a dict of values."""
    return re.sub(r"\$(\d+)", lambda m: f"%(p{m.group(1)})s", statement)


def _run(cursor, statement: str, values: list):
    cursor.execute(_named(statement), {f"p{i}": v for i, v in enumerate(values, start=1)})
    return cursor.fetchone()[0]


def test_the_guards_predecessor_lookup_seeks_the_unique_index_without_statistics():
    if connection.vendor == "sqlite":
        _sqlite_lookup_plan()
        return
    later = NOW + dt.timedelta(days=1)
    with transaction.atomic(), connection.cursor() as cursor:
        one_place, _ = _pg_one_place_and_chain(cursor)
        statement = f"SELECT COALESCE({_installed_pg_lookup(cursor)}, FALSE)"
        for plan in _pg_plans(cursor, "ctrlrun_lookup", statement, [t for _, t in NEW_COLUMNS],
                              _values(ROWS + 1, ROWS + 1, later)):
            assert _seeks(plan, one_place), json.dumps(plan, indent=1)
        # What it finds is the predecessor it checks, and only it: the row continuing the chain is
        # accepted; one a place too far, a wrong running total, a time before the predecessor's, or a
        # chain with no such place is not.
        for values, ok in ((_values(ROWS + 1, ROWS + 1, later), True), (_values(ROWS, ROWS, later), True),
                           (_values(ROWS + 2, ROWS + 2, later), False), (_values(ROWS + 1, ROWS + 2, later), False),
                           (_values(ROWS + 1, ROWS + 1, NOW), False), (_values(2, 2, later, "amount"), True),
                           (_values(2, 2, later, "counts"), False), (_values(2, 2, later, "amoun"), False)):
            assert _run(cursor, statement, values) is ok, values


def test_the_stores_ledger_reads_seek_their_index_without_statistics():
    """``LEDGER_LAST`` (the row a charge continues) through the unique index of the places, read
    backwards; ``LEDGER_SPENT``'s seeks through the chain index and the released rows' index."""
    if connection.vendor == "sqlite":
        _sqlite_store_plans()
        return
    with transaction.atomic(), connection.cursor() as cursor:
        one_place, chain = _pg_one_place_and_chain(cursor)
        last = _numbered(hot.LEDGER_LAST).replace(f'"{LEDGER}"', f'"{COPY}"')
        for plan in _pg_plans(cursor, "ctrlrun_last", last, ["varchar", "varchar"], ["payer", "count"]):
            assert _seeks(plan, one_place), json.dumps(plan, indent=1)
        spent = _numbered(hot.LEDGER_SPENT).replace(f'"{LEDGER}"', f'"{COPY}"')
        start = NOW + dt.timedelta(seconds=ROWS / 2000)  # half the chain before the window
        for plan in _pg_plans(cursor, "ctrlrun_spent", spent, ["varchar", "varchar"] * 2 + ["timestamptz"]
                              + ["varchar", "varchar", "timestamptz"], ["payer", "count"] * 2 + [start]
                              + ["payer", "count", start]):
            scans = _scans(plan)
            assert [s["Index Name"] for s in scans] == [chain, chain, "copy_ctrlrun_ledger_released_idx"], (
                json.dumps(plan, indent=1))
            assert all("Index Cond" in s and not s.get("Rows Removed by Filter") for s in scans), (
                json.dumps(plan, indent=1))
            assert _blocks(plan) <= 16, json.dumps(plan, indent=1)


# --------------------------------------------------------------------------- SQLite


def _sqlite_index(cursor, columns: tuple[str, ...]) -> str:
    """The name of the ledger's unique index on exactly ``columns``."""
    cursor.execute(f'PRAGMA index_list("{LEDGER}")')
    for row in cursor.fetchall():
        name, unique = row[1], row[2]
        cursor.execute(f'PRAGMA index_info("{name}")')
        if unique and tuple(r[2] for r in cursor.fetchall()) == columns:
            return name
    raise AssertionError(f"no unique index on {columns}")


def _sqlite_plan(cursor, statement: str, count: int) -> list[str]:
    cursor.execute("EXPLAIN QUERY PLAN " + statement, [None] * count)
    return [str(row[-1]) for row in cursor.fetchall()]


def _sqlite_lookup_plan() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = %s", [f"{LEDGER}_chained"])
        [(source,)] = cursor.fetchall()
        lookup = _lookup(source)
        count = len(re.findall(r'NEW\."\w+"', lookup))
        lookup = re.sub(r'NEW\."\w+"', "%s", lookup)
        one_place = _sqlite_index(cursor, ("grant_id", "metric", "n"))
        cursor.execute("SELECT name FROM sqlite_master WHERE name LIKE 'sqlite_stat%'")
        assert not cursor.fetchall(), "the test database has statistics"
        plan = _sqlite_plan(cursor, f"SELECT {lookup}", count)
    assert any(f"INDEX {one_place} (grant_id=? AND metric=? AND n=?)" in line for line in plan), plan


def _sqlite_store_plans() -> None:
    with connection.cursor() as cursor:
        one_place = _sqlite_index(cursor, ("grant_id", "metric", "n"))
        last = _sqlite_plan(cursor, hot.LEDGER_LAST, 2)
        spent = _sqlite_plan(cursor, hot.LEDGER_SPENT, 8)
    assert [line for line in last if "SEARCH" in line] == [
        f"SEARCH {LEDGER} USING INDEX {one_place} (grant_id=? AND metric=?)"], last
    assert [line.split(" (")[0] for line in spent if "SEARCH" in line] == [
        f"SEARCH {LEDGER} USING COVERING INDEX ctrlrun_ledger_chain_idx",
        f"SEARCH {LEDGER} USING COVERING INDEX ctrlrun_ledger_chain_idx",
        f"SEARCH {LEDGER} USING INDEX ctrlrun_ledger_released_idx"], spent
    assert not [line for line in last + spent if line.startswith(f"SCAN {LEDGER}") or "TEMP B-TREE" in line], last + spent
