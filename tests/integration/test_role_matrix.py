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

from tests.support import RoleStore, breaks, role_refused

pytestmark = pytest.mark.slow

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

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
    100), a delegation to the sub-agent, and a full chain check that found it intact."""
    done = store.agent({"op": "refund", "payment_id": "t1", "amount": 60},
                       {"op": "delegate", "parent": "support", "grant": SUB_GRANT},
                       {"op": "check"})
    assert done[0] == {"value": "refunded"} and done[1]["value"].startswith("dlg_"), done
    assert done[2]["ok"] is True, done


@pytest.fixture(scope="module")
def pg_template(tmp_path_factory):
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
