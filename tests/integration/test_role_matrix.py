"""The application's database role against every table a decision or a page reads, on both databases.

The role is what a Django project connects as: SELECT, INSERT, UPDATE and DELETE, owning nothing
(a leaked DATABASE_URL, a SQL console, SQL injection elsewhere in the project). On PostgreSQL it is
a real role with exactly those grants on a store its owner migrated; on SQLite, where the file is
the only boundary, it is a plain connection making the same statements (no DDL, no signing key).
The agent runs in OS processes. Each attack is stopped by the database, refused where the row is
used, or named by ``receipts --verify-chain``: docs/guarantees.md has the matrix these tests pin.

These tests make scratch stores of their own (a PostgreSQL database cloned from a template, a
copied SQLite file) on both passes of the suite.
"""
from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import psycopg
import pytest

from ctrlrun import guards
from tests.support import POSTGRES_ADMIN_URL, RoleStore, breaks, require_postgresql, role_refused

pytestmark = pytest.mark.slow

ADMIN_URL = POSTGRES_ADMIN_URL

#: A grant the support agent hands down to a sub-agent: narrower in every dimension it names.
SUB_GRANT = """\
subject: {agent: sub-agent}
actions: [stripe.refund]
expires_at: "2098-01-01T00:00:00Z"
budgets:
  - {metric: amount, limit: 50, window: P1D}
"""


def _admin(statement: str) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(statement)


def _prepare(store: RoleStore) -> None:
    """What every scratch store holds: a committed refund of 60 (of the support grant's budget of
    100), a delegation to the sub-agent, a pending approval request (a refund of 5000) with a run
    paused on it, and a full chain check that found it all intact."""
    done = store.agent({"op": "refund", "payment_id": "t1", "amount": 60},
                       {"op": "delegate", "parent": "support", "grant": SUB_GRANT},
                       {"op": "refund", "payment_id": "t5", "amount": 5000})
    assert done[0] == {"value": "refunded"} and done[1]["value"].startswith("dlg_"), done
    assert done[2]["error"] == "ApprovalRequired", done
    [[request_id]] = store.sql('SELECT "approval_id" FROM "ctrlrun_approval"')
    done = store.agent({"op": "pause", "approval": request_id}, {"op": "mail", "approval": request_id},
                       {"op": "check"})
    assert done[1] == {"value": True} and done[2]["ok"] is True, done


@pytest.fixture(scope="module")
def pg_template(tmp_path_factory):
    require_postgresql()
    suffix = uuid.uuid4().hex[:8]
    name, role = f"ctrlrun_matrix_tmpl_{suffix}", f"ctrlrun_matrix_app_{suffix}"
    folder = tmp_path_factory.mktemp("pg-template")
    _admin(f'CREATE DATABASE "{name}"')
    _admin(f'CREATE ROLE "{role}" LOGIN')
    try:
        owner = RoleStore("postgresql", folder, url=f"postgresql://postgres@127.0.0.1:5432/{name}")
        owner.agent({"op": "verify"})  # migrated by its owner
        with psycopg.connect(owner.url, autocommit=True) as conn:
            conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
            conn.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
        _prepare(RoleStore("postgresql", folder, url=f"postgresql://{role}@127.0.0.1:5432/{name}"))
        yield name, role
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _admin(f'DROP ROLE IF EXISTS "{role}"')


@pytest.fixture(scope="module")
def sqlite_template(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sqlite-template")
    store = RoleStore("sqlite", folder, path=folder / "store.db")
    _prepare(store)
    return store.path


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    """A scratch store as the template left it, reached as the application role."""
    if request.param == "sqlite":
        template = request.getfixturevalue("sqlite_template")
        path = tmp_path / "store.db"
        source, target = sqlite3.connect(template), sqlite3.connect(path)
        with target:
            source.backup(target)
        source.close()
        target.close()
        yield RoleStore("sqlite", tmp_path, path=path)
        return
    name, role = request.getfixturevalue("pg_template")
    clone = f"ctrlrun_matrix_{uuid.uuid4().hex[:8]}"
    _admin(f'CREATE DATABASE "{clone}" TEMPLATE "{name}"')
    try:
        yield RoleStore("postgresql", tmp_path, url=f"postgresql://{role}@127.0.0.1:5432/{clone}")
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{clone}" WITH (FORCE)')


def _now(store: RoleStore) -> str:
    return "CURRENT_TIMESTAMP" if store.vendor == "postgresql" else "strftime('%Y-%m-%d %H:%M:%f', 'now')"


# --------------------------------------------------------------------------- issue 19's four attacks


def test_a_delegation_inserted_by_the_role_grants_nothing_and_is_named(store):
    """An agent that holds no authority gets a delegation row by plain SQL: its refund is refused and
    the check names the row."""
    [[grant_json, created_at]] = store.sql('SELECT "grant_json", "created_at" FROM "ctrlrun_delegation"')
    forged = grant_json.replace("sub-agent", "intruder")
    columns = [c for (c,) in store.sql(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'ctrlrun_delegation'"
        if store.vendor == "postgresql" else 'SELECT name FROM pragma_table_info(\'ctrlrun_delegation\')')]
    values = {"delegation_id": "dlg_" + "ab" * 16, "parent_id": "support", "depth": 1, "grant_json": forged,
              "created_by_agent": "support-agent", "created_by_user": None, "created_via": "api",
              "created_at": created_at, "revoked_at": None, "revoked_by": None}
    values.update({c: ("intruder" if c == "agent" else None) for c in columns if c not in values})
    names = list(values)
    store.sql(f'INSERT INTO "ctrlrun_delegation" ({", ".join(chr(34) + n + chr(34) for n in names)}) '
              f'VALUES ({", ".join(["%s"] * len(names))})', *values.values())
    result = store.one({"op": "refund", "agent": "intruder", "payment_id": "t2", "amount": 10})
    assert result["error"] == "AuthorityDenied", result
    assert store.remote() == []  # (t1 ran in the template's folder)
    report = store.verify()
    assert report["ok"] is False and ("signature_invalid", "delegation") in breaks(report), report


def test_committed_spend_cannot_be_released_by_the_role(store):
    """Setting released_at on a committed charge is refused: the budget still holds it, the next
    refund over the limit is refused, the check stays intact."""
    with pytest.raises(role_refused(store)):
        store.sql(f'UPDATE "ctrlrun_budgetledger" SET "released_at" = {_now(store)} WHERE "released_at" IS NULL')
    result = store.one({"op": "refund", "payment_id": "t2", "amount": 60})
    assert (result["error"], result["reason"]) == ("ActionDenied", "budget_exhausted"), result
    assert store.remote() == []  # (t1 ran in the template's folder)
    assert store.verify()["ok"] is True


def test_a_copied_intact_check_does_not_hide_a_break(store):
    """After a full check records a break, a copy of the earlier intact check under a new id is
    refused or named: the last check is not taken for intact, and the next incremental check still
    reports the break as unresolved."""
    store.sql('INSERT INTO "ctrlrun_event" ("ts", "type", "data") VALUES (' + _now(store) + ", 'EXECUTION_COMMITTED', '{}')")
    assert store.one({"op": "check"})["ok"] is False
    columns = [c for (c,) in store.sql(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'ctrlrun_chaincheck'"
        if store.vendor == "postgresql" else 'SELECT name FROM pragma_table_info(\'ctrlrun_chaincheck\')')
               if c != "id"]
    quoted = ", ".join(f'"{c}"' for c in columns)
    try:
        store.sql(f'INSERT INTO "ctrlrun_chaincheck" ({quoted}) SELECT {quoted} FROM "ctrlrun_chaincheck" '
                  f'WHERE "ok" = %s ORDER BY "id" LIMIT 1', True)
    except role_refused(store):
        pass  # stopped: the copy cannot be made at all
    last = store.one({"op": "last_check"})
    assert not (last["ok"] and last["signature_ok"]), last
    again = store.one({"op": "check", "incremental": True})
    assert again["ok"] is False and ["unresolved", "check"] in again["breaks"] or \
        ["signature_invalid", "check"] in again["breaks"], again


def test_a_policy_text_forged_before_first_use_is_never_taken_for_the_policy(store):
    """The role stores a forged text under the hash of a policy before it is first used: the policy
    is refused to act on (the stored row is not ctrlrun's), and the check names the row."""
    from ctrlrun.policy import parse_policy

    changed = (store.folder / "ctrlrun.yaml").read_text().replace("amount_lte: 1000", "amount_lte: 2000")
    policy = parse_policy(changed, str(store.folder / "ctrlrun.yaml"), environment="production")
    forged = changed.replace("decision: approve", "decision: allow")
    store.sql('INSERT INTO "ctrlrun_policydocument" ("hash", "schema", "source", "text", "environment", '
              f'"first_seen") VALUES (%s, %s, %s, %s, %s, {_now(store)})', policy.hash, policy.schema,
              str(store.folder / "ctrlrun.yaml"), forged, "production")
    (store.folder / "ctrlrun.yaml").write_text(changed)
    result = store.one({"op": "refund", "payment_id": "t2", "amount": 10})
    assert result["error"] == "EvidenceTampered", result
    assert store.remote() == []  # (t1 ran in the template's folder)
    report = store.verify()
    assert report["ok"] is False and ("signature_invalid", "policy") in breaks(report), report


def test_the_template_store_is_intact(store):
    """The scratch store itself, before any attack, verifies."""
    assert store.verify()["ok"] is True
    assert isinstance(store.folder, Path)


# --------------------------------------------------------------------------- the matrix, cell by cell
#
# docs/guarantees.md's application-role matrix: for each table, what INSERT, UPDATE, DELETE and an
# insert that collides with a row (SQLite's REPLACE, PostgreSQL's ON CONFLICT DO UPDATE) do.

#: (table, its primary key, a column an upsert would overwrite, a value for it)
TABLES = {
    "ctrlrun_effectrecord": ("effect_key", "state", "failed"),
    "ctrlrun_event": ("id", "type", "EXECUTION_COMMITTED"),
    "ctrlrun_receipt": ("receipt_id", "agent", "someone-else"),
    "ctrlrun_chainhead": ("id", "seq", "0"),
    "ctrlrun_approval": ("approval_id", "status", "granted"),
    "ctrlrun_policydocument": ("hash", "text", "forged"),
    "ctrlrun_chaincheck": ("id", "ok", "true"),
    "ctrlrun_budgetledger": ("id", "amount", "0"),
    "ctrlrun_delegation": ("delegation_id", "grant_json", "{}"),
    "ctrlrun_pausedrun": ("id", "resume_with", "other"),
    "ctrlrun_delivery": ("id", "address", "mallory@evil.test"),
    "ctrlrun_linkuse": ("nonce", "used_by", "mallory"),
}

#: A ledger row the role adds after the last of a chain (only one row per chain in the template).
_LEDGER_NEXT = ('INSERT INTO "ctrlrun_budgetledger" ("grant_id", "metric", "amount", "effect_key", "attempt", '
                '"consumed_at", "released_at", "n", "cum", "mac") SELECT "grant_id", "metric", "amount", '
                '\'refund:forged\', 1, "consumed_at", NULL, {n}, {cum}, "mac" FROM "ctrlrun_budgetledger" '
                'WHERE "metric" = \'amount\' LIMIT 1')

#: Plain UPDATE and DELETE statements (and inserts) the database refuses, per table.
REFUSED = {
    "ctrlrun_effectrecord": ['UPDATE "ctrlrun_effectrecord" SET "state" = \'failed\' WHERE "state" = \'committed\'',
                             'UPDATE "ctrlrun_effectrecord" SET "effect_key" = \'refund:moved\'',
                             'DELETE FROM "ctrlrun_effectrecord"'],
    "ctrlrun_event": ['UPDATE "ctrlrun_event" SET "type" = \'EXECUTION_FAILED\'', 'DELETE FROM "ctrlrun_event"'],
    "ctrlrun_receipt": ['UPDATE "ctrlrun_receipt" SET "agent" = \'someone-else\'', 'DELETE FROM "ctrlrun_receipt"'],
    "ctrlrun_chainhead": ['UPDATE "ctrlrun_chainhead" SET "seq" = 0', 'DELETE FROM "ctrlrun_chainhead"',
                          'INSERT INTO "ctrlrun_chainhead" ("id", "seq", "hash", "event_seq", "event_hash") '
                          'SELECT 2, "seq", "hash", "event_seq", "event_hash" FROM "ctrlrun_chainhead"'],
    "ctrlrun_approval": ['UPDATE "ctrlrun_approval" SET "action_hash" = \'sha256:' + "0" * 64 + '\'',
                         'UPDATE "ctrlrun_approval" SET "status" = \'consumed\'',
                         'DELETE FROM "ctrlrun_approval"'],
    "ctrlrun_policydocument": ['UPDATE "ctrlrun_policydocument" SET "text" = \'forged\'',
                               'DELETE FROM "ctrlrun_policydocument"'],
    "ctrlrun_chaincheck": ['UPDATE "ctrlrun_chaincheck" SET "ok" = %s', 'DELETE FROM "ctrlrun_chaincheck"'],
    "ctrlrun_budgetledger": ['UPDATE "ctrlrun_budgetledger" SET "amount" = 0',
                             'UPDATE "ctrlrun_budgetledger" SET "released_at" = "consumed_at"',
                             'UPDATE "ctrlrun_budgetledger" SET "cum" = 0',
                             'DELETE FROM "ctrlrun_budgetledger"',
                             # a charge whose running total does not add up (room made), one past a gap
                             _LEDGER_NEXT.format(cum='0', n='"n" + 1'),
                             _LEDGER_NEXT.format(cum='"cum" + "amount"', n='"n" + 2')],
    "ctrlrun_delegation": ['UPDATE "ctrlrun_delegation" SET "grant_json" = \'{}\'',
                           'UPDATE "ctrlrun_delegation" SET "agent" = \'intruder\'',
                           'DELETE FROM "ctrlrun_delegation"'],
    "ctrlrun_pausedrun": ['UPDATE "ctrlrun_pausedrun" SET "state" = \'{"messages": ["forged"]}\'',
                          'UPDATE "ctrlrun_pausedrun" SET "resume_with" = \'other\'',
                          'DELETE FROM "ctrlrun_pausedrun"'],
    "ctrlrun_delivery": ['UPDATE "ctrlrun_delivery" SET "address" = \'mallory@evil.test\'',
                         'UPDATE "ctrlrun_delivery" SET "status" = \'pending\' WHERE "status" = \'sent\'',
                         'DELETE FROM "ctrlrun_delivery"'],
    "ctrlrun_linkuse": ['UPDATE "ctrlrun_linkuse" SET "used_by" = \'mallory\'', 'DELETE FROM "ctrlrun_linkuse"'],
}


def _snapshot(store: RoleStore) -> list:
    return [store.sql(f'SELECT * FROM "{table}" ORDER BY 1') for table in TABLES]


@pytest.mark.parametrize(("table", "statement"), [(t, s) for t, statements in REFUSED.items() for s in statements])
def test_update_and_delete_the_database_refuses(store, table, statement):
    """Each UPDATE or DELETE of this cell is refused by the database's own triggers: nothing changes."""
    before = _snapshot(store)
    params = (True,) if "%s" in statement else ()
    with pytest.raises(role_refused(store)):
        store.sql(statement, *params)
    assert _snapshot(store) == before


@pytest.mark.parametrize("table", list(TABLES))
def test_an_insert_colliding_with_a_row_never_replaces_it(store, table):
    """SQLite's INSERT OR REPLACE (a delete that fires no DELETE trigger) and PostgreSQL's ON CONFLICT
    DO UPDATE over an existing row: refused, or (a colliding effect record or chain head on SQLite)
    ignored; the row is as it was."""
    key, column, value = TABLES[table]
    before = _snapshot(store)
    if store.vendor == "sqlite":
        statement = f'INSERT OR REPLACE INTO "{table}" SELECT * FROM "{table}" LIMIT 1'
    else:
        cast = "::boolean" if column == "ok" else "::bigint" if column in ("seq", "amount") else ""
        statement = (f'INSERT INTO "{table}" SELECT * FROM "{table}" LIMIT 1 ON CONFLICT ("{key}") '
                     f"DO UPDATE SET \"{column}\" = '{value}'{cast}")
    if store.vendor == "sqlite" and table in ("ctrlrun_effectrecord", "ctrlrun_chainhead"):
        try:  # a colliding insert does nothing (RAISE(IGNORE)), or is refused for what it would insert
            store.sql(statement)
        except role_refused(store):
            pass
    else:
        with pytest.raises(role_refused(store)):
            store.sql(statement)
    assert _snapshot(store) == before


def _columns(store: RoleStore, table: str) -> list[str]:
    if store.vendor == "postgresql":
        return [c for (c,) in store.sql("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                                        "ORDER BY ordinal_position", table)]
    return [c for (c,) in store.sql(f"SELECT name FROM pragma_table_info('{table}')")]


def _copy_with(store: RoleStore, table: str, where: str, **changes: object) -> None:
    """INSERT a copy of one row of ``table`` with ``changes`` (and a new id where the id is a serial)."""
    columns = [c for c in _columns(store, table) if not (c == "id" and "id" not in changes)]
    picked = ", ".join("%s" if c in changes else f'"{c}"' for c in columns)
    params = [changes[c] for c in columns if c in changes]
    names = ", ".join(f'"{c}"' for c in columns)
    store.sql(f'INSERT INTO "{table}" ({names}) SELECT {picked} FROM "{table}" WHERE {where} LIMIT 1', *params)


def test_an_effect_record_inserted_by_the_role_is_never_acted_on(store):
    """A record the role INSERTs (it must start executing, attempt 1) holds its key as forged: the
    agent's call on that key is refused, never run, and the check names the record."""
    _copy_with(store, "ctrlrun_effectrecord", '"effect_key" = \'refund:t1\'', effect_key="refund:t9", state="executing",
               lease_expires_at="2099-01-01 00:00:00")
    result = store.one({"op": "refund", "payment_id": "t9", "amount": 10})
    assert "error" in result, result
    assert store.remote() == []
    assert ("signature_invalid", "effect") in breaks(store.verify())


@pytest.mark.parametrize("table", ["ctrlrun_event", "ctrlrun_receipt"])
def test_evidence_inserted_by_the_role_is_named(store, table):
    """A receipt or event the role INSERTs (outside the chain, or at its head) is named by the check, and
    no call acts or writes on top of one placed at the head."""
    key = "id" if table == "ctrlrun_event" else "receipt_id"
    changes = {"seq": None} if table == "ctrlrun_event" else {"receipt_id": "rct_" + "0" * 32, "seq": None}
    _copy_with(store, table, f'"{key}" IS NOT NULL', **changes)
    report = store.verify()
    assert report["ok"] is False and any(kind == table.split("_")[1] for _, kind in breaks(report)), report
    [[head]] = store.sql('SELECT "seq" FROM "ctrlrun_chainhead"') if table == "ctrlrun_receipt" else \
        store.sql('SELECT "event_seq" FROM "ctrlrun_chainhead"')
    at_head = {"seq": head + 1} if table == "ctrlrun_event" else {"receipt_id": "rct_" + "1" * 32, "seq": head + 1}
    _copy_with(store, table, f'"{key}" IS NOT NULL', **at_head)
    result = store.one({"op": "refund", "payment_id": "t2", "amount": 10})
    assert result["error"] == "EvidenceTampered", result
    assert store.remote() == []


def test_a_chain_head_moved_forward_by_the_role_stops_the_store(store):
    """The head may only move forward; moved forward by hand its signature fails: no call acts."""
    store.sql('UPDATE "ctrlrun_chainhead" SET "seq" = "seq" + 1')
    result = store.one({"op": "refund", "payment_id": "t2", "amount": 10})
    assert result["error"] == "EvidenceTampered", result
    assert store.remote() == []
    assert ("signature_invalid", "head") in breaks(store.verify())


def test_an_approval_granted_or_inserted_by_the_role_never_licenses_a_call(store):
    """The role grants the pending request by UPDATE (an allowed edge), and INSERTs a request of its
    own: neither is ctrlrun's, presenting the granted one is refused as tampered, the check names both."""
    [[request_id]] = store.sql('SELECT "approval_id" FROM "ctrlrun_approval"')
    store.sql(f'UPDATE "ctrlrun_approval" SET "status" = \'granted\', "approver" = \'mallory\', '
              f'"answered_at" = {_now(store)}')
    _copy_with(store, "ctrlrun_approval", '"approval_id" IS NOT NULL', approval_id="apr_" + "0" * 32,
               status="pending", approver=None, answered_at=None)
    result = store.one({"op": "refund", "payment_id": "t5", "amount": 5000, "approval": request_id})
    assert (result["error"], result["reason"]) == ("ApprovalMismatch", "tampered"), result
    assert store.remote() == []
    named = breaks(store.verify())
    assert named.count(("signature_invalid", "approval")) == 2, named


def test_a_budget_charge_inserted_by_the_role_is_named(store):
    """An extra charge the role INSERTs (continuing its chain, or the database refuses it) can only
    make a budget stricter; the check names it."""
    store.sql(_LEDGER_NEXT.format(cum='"cum" + "amount"', n='"n" + 1'))
    result = store.one({"op": "refund", "payment_id": "t2", "amount": 10})
    assert (result["error"], result["reason"]) == ("ActionDenied", "budget_exhausted"), result  # 60 + 60 + 10 > 100
    assert ("signature_invalid", "ledger") in breaks(store.verify())


def test_a_revoke_by_the_role_refuses_the_delegation_and_is_named(store):
    """A revoke is the one change a delegation row takes; made by plain SQL it is not ctrlrun's: the
    sub-agent's calls are refused (never widened), and the check names the row."""
    store.sql(f'UPDATE "ctrlrun_delegation" SET "revoked_at" = {_now(store)}, "revoked_by" = \'mallory\'')
    result = store.one({"op": "refund", "agent": "sub-agent", "payment_id": "t2", "amount": 10})
    assert (result["error"], result["reason"]) == ("AuthorityDenied", "authority_unreadable"), result
    assert ("signature_invalid", "delegation") in breaks(store.verify())


def test_a_paused_run_inserted_by_the_role_is_never_resumed(store):
    """A paused run the role INSERTs (beside another request) is not ctrlrun's: it is never resumed, and
    the check names it; the genuine one resumes once its request is answered."""
    [[request_id]] = store.sql('SELECT "approval_id" FROM "ctrlrun_approval"')
    forged = "apr_" + "f" * 32
    _copy_with(store, "ctrlrun_approval", '"approval_id" IS NOT NULL', approval_id=forged)
    _copy_with(store, "ctrlrun_pausedrun", '"id" IS NOT NULL', approval_id=forged)
    done = store.agent({"op": "answer", "approval": request_id}, {"op": "resume"})
    assert sorted(status for status, _ in done[1]) == ["resumed"], done  # the forged request cannot be answered
    assert (store.folder / "resumed.log").read_text().split() == [request_id, "granted"]
    assert ("signature_invalid", "paused") in breaks(store.verify())


def test_a_continuation_the_role_deletes_rekeys_or_forges_is_refused_or_never_resumed(store):
    """A suspended call's continuation row (spec A5): DELETE and a moved key are refused by the database;
    a token digest the role writes in (or a row it copies under another key) is not signed: never resumed."""
    from ctrlrun.store.continuations import digest

    assert store.agent({"op": "suspend", "payment_id": "s1", "amount": 1, "token": "tok-1"}) == [{"value": 1}]
    for statement in ('DELETE FROM "ctrlrun_continuation"',
                      'UPDATE "ctrlrun_continuation" SET "effect_key" = \'refund:moved\''):
        with pytest.raises(role_refused(store)):
            store.sql(statement)
    _copy_with(store, "ctrlrun_continuation", '"effect_key" = \'refund:s1\'', effect_key="refund:t1",
               continuation=digest("tok-copy"))
    store.sql(f'UPDATE "ctrlrun_continuation" SET "continuation" = \'{digest("tok-evil")}\' '
              f'WHERE "effect_key" = \'refund:s1\'')
    done = store.agent({"op": "resume_call", "token": "tok-evil"}, {"op": "resume_call", "token": "tok-copy"},
                       {"op": "resume_call", "token": "tok-1"})
    assert [d.get("error") for d in done] == ["InvalidArgument"] * 3, done
    assert "signature" in done[0]["message"] and "signature" in done[1]["message"], done
    assert store.sql('SELECT "state" FROM "ctrlrun_effectrecord" WHERE "effect_key" = \'refund:s1\'') == [("executing",)]


def test_a_delivery_inserted_or_marked_sent_by_the_role_is_unsigned_never_sent_and_named(store):
    """A mail delivery the role INSERTs (it must start pending, no attempt) to an address of its own is not
    ctrlrun's: never sent (notify skips it) and named; one inserted already sent is refused."""
    _copy_with(store, "ctrlrun_delivery", '"recipient" = \'ana\'', recipient="mallory", address="mallory@evil.test",
               link_nonce="n" * 32, status="pending", attempts=0)
    with pytest.raises(role_refused(store)):
        _copy_with(store, "ctrlrun_delivery", '"recipient" = \'ana\'', recipient="eve", link_nonce="e" * 32)
    assert ("signature_invalid", "delivery") in breaks(store.verify())


def test_a_link_use_inserted_by_the_role_only_burns_a_link_and_is_named(store):
    """A link use the role INSERTs under another mail's nonce is not signed: it can only refuse that link."""
    [[nonce]] = store.sql('SELECT "link_nonce" FROM "ctrlrun_delivery" WHERE "recipient" = \'bea\'')
    _copy_with(store, "ctrlrun_linkuse", '"used_by" = \'ana\'', nonce=nonce, used_by="mallory")
    assert ("signature_invalid", "link") in breaks(store.verify())


# --------------------------------------------------------------------------- the guard's version record

#: What the role tries against the record of the guard's version: on PostgreSQL a function its owner
#: made (replacing, dropping or renaming one needs its ownership); on SQLite a view (no DDL through the
#: role's connection, and a view takes no INSERT, UPDATE or DELETE).
RECORD_ATTACKS = {
    "postgresql": ["CREATE OR REPLACE FUNCTION ctrlrun_guard_version() RETURNS integer AS $$ SELECT 99 $$ "
                   "LANGUAGE sql",
                   "DROP FUNCTION ctrlrun_guard_version()",
                   "ALTER FUNCTION ctrlrun_guard_version() RENAME TO ctrlrun_guard_version_was"],
    "sqlite": ['UPDATE "ctrlrun_guard_version" SET "version" = 99',
               'INSERT INTO "ctrlrun_guard_version" ("version") VALUES (99)',
               'DELETE FROM "ctrlrun_guard_version"'],
}


def _recorded(store: RoleStore) -> list:
    return store.sql("SELECT ctrlrun_guard_version()" if store.vendor == "postgresql"
                     else 'SELECT "version" FROM "ctrlrun_guard_version"')


@pytest.mark.parametrize("attack", range(3))
def test_the_role_cannot_replace_or_drop_the_guard_version_record(store, attack):
    """The record ``manage.py check`` reads (ctrlrun.W005) says the version the owner's migration
    installed, whatever the role does to it."""
    from ctrlrun.guards import CURRENT

    assert [tuple(row) for row in _recorded(store)] == [(CURRENT,)]
    with pytest.raises(role_refused(store)):
        store.sql(RECORD_ATTACKS[store.vendor][attack])
    assert [tuple(row) for row in _recorded(store)] == [(CURRENT,)]


MIGRATE = r'''
from ctrlrun import standalone
standalone.configure_settings()
from django.core.management import call_command
call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
from django.db import connection
from ctrlrun import guards
print(guards.missing_triggers(connection, guards.CURRENT))
'''


def test_migrate_run_as_the_role_says_it_cannot_put_a_dropped_trigger_back(store):
    """A trigger the owner dropped: ``migrate ctrlrun`` by the role (PostgreSQL: it may not make
    triggers) says in one line that it could not put the guard back, and exits 0; on SQLite, where
    the file is the only boundary, it puts the guard back."""
    import subprocess
    import sys

    from ctrlrun import guards

    if store.vendor == "postgresql":
        owner = ADMIN_URL.rsplit("/", 1)[0] + "/" + str(store.url).rsplit("/", 1)[1]
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute('DROP TRIGGER "ctrlrun_chainhead_guard" ON "ctrlrun_chainhead"')
    else:
        store.sql('DROP TRIGGER "ctrlrun_chainhead_forward"')
    done = subprocess.run([sys.executable, "-c", MIGRATE], cwd=store.folder, env=store.environment(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    missing = done.stdout.strip().splitlines()[-1]
    if store.vendor == "postgresql":
        assert (f"ctrlrun: could not put guard version {guards.CURRENT} back on the database 'default'"
                in done.stderr), done.stderr
        assert "as the owner of ctrlrun's tables" in done.stderr
        assert missing == "['ctrlrun_chainhead_guard']", missing
    else:
        assert missing == "[]", missing
