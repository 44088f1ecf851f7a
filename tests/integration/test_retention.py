"""Retention (§F1-F3, docs/retention.md) on both databases, as real processes: prune behind a signed
checkpoint, holds, the guard's only scoped lift refused to the application role, and anchors that
name a store rewound and re-signed by its owner, or an anchor file edited."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid

import psycopg
import pytest

from tests.support import POSTGRES_ADMIN_URL, RoleStore, require_postgresql, role_refused

pytestmark = pytest.mark.slow

#: The owner of the store truncates the receipt chain's tail and re-signs the head with the key it holds.
REWIND = r'''
import sys
import ctrlrun
ctrlrun.setup()
from django.db import connection, transaction
from ctrlrun import guard, signing
from ctrlrun.store.signatures import HEAD_DOMAIN, head_document
with transaction.atomic():
    guard.remove(connection)
    with connection.cursor() as c:
        c.execute('SELECT MAX("seq") FROM "ctrlrun_receipt"')
        (top,) = c.fetchone()
        c.execute('DELETE FROM "ctrlrun_receipt" WHERE "seq" = %s', [top])
        c.execute('SELECT "hash" FROM "ctrlrun_receipt" WHERE "seq" = %s', [top - 1])
        (prev,) = c.fetchone()
        c.execute('SELECT "event_seq", "event_hash" FROM "ctrlrun_chainhead" WHERE "id" = 1')
        event_seq, event_hash = c.fetchone()
        key = signing.key_id()
        mac = signing.sign(HEAD_DOMAIN, head_document(top - 1, prev, event_seq, event_hash, key))
        c.execute('UPDATE "ctrlrun_chainhead" SET "seq" = %s, "hash" = %s, "mac" = %s, "key_id" = %s WHERE "id" = 1',
                  [top - 1, prev, mac, key])
    guard.install(connection)
print(top)
'''


#: A prune as its own OS process, in batches of ``batch`` seqs; with ``pause``, it waits after its first
#: batch (between two transactions) until the test says go: ``pruner.py FOLDER THROUGH BATCH pause|run``.
PRUNER = r'''
import json, pathlib, sys, time
import ctrlrun
ctrlrun.setup()
from ctrlrun import retention
folder, through, batch, mode = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def progress(text):
    if mode == "pause" and not (folder / "paused").exists():
        (folder / "paused").write_text(text)
        while not (folder / "go").exists():  # a handshake with the test, not a timing
            time.sleep(0.05)

done = retention.prune(through=through, older_than=retention.parse_duration("0s"), by="ops", reason="retention",
                       progress=progress, batch=batch)
print(json.dumps(done.as_dict()))
'''


def _pruner(store: RoleStore, through: int, batch: int, mode: str) -> subprocess.Popen:
    (store.folder / "pruner.py").write_text(PRUNER)
    return subprocess.Popen([sys.executable, str(store.folder / "pruner.py"), str(store.folder), str(through),
                             str(batch), mode], cwd=store.folder, env=store.environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _admin(statement: str) -> None:
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(statement)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    """A store with six committed refunds (receipts 1..6), reached as the application role."""
    if request.param == "sqlite":
        made = RoleStore("sqlite", tmp_path, path=tmp_path / "store.db")
        made.agent({"op": "verify"})
    else:
        require_postgresql()
        suffix = uuid.uuid4().hex[:8]
        name, role = f"h_retention_{suffix}", f"h_retention_app_{suffix}"
        _admin(f'CREATE DATABASE "{name}"')
        _admin(f'CREATE ROLE "{role}" LOGIN')
        request.addfinalizer(lambda: (_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'),
                                      _admin(f'DROP ROLE IF EXISTS "{role}"')))
        owner = RoleStore("postgresql", tmp_path, url=f"postgresql://postgres@127.0.0.1:5432/{name}")
        owner.agent({"op": "verify"})  # migrated by its owner
        with psycopg.connect(owner.url, autocommit=True) as conn:
            conn.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
            conn.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
        made = RoleStore("postgresql", tmp_path, url=f"postgresql://{role}@127.0.0.1:5432/{name}")
        made.owner_url = owner.url
    done = made.agent(*[{"op": "refund", "payment_id": f"p{i}", "amount": 10} for i in range(1, 7)])
    assert all(d == {"value": "refunded"} for d in done), done
    return made


def _prune(store: RoleStore, *args: str) -> subprocess.CompletedProcess:
    return store.command("prune", "--older-than", "0s", "--by", "ops", "--reason", "90-day retention",
                         "--quiet", *args)


def test_prune_leaves_a_checkpoint_the_chain_verifies_from_and_honours_holds(store):
    held = store.command("hold", "place", "--id", "litigation", "--from-seq", "5", "--reason", "case 42",
                         "--by", "legal")
    assert held.returncode == 0 and "held 5..end: case 42" in held.stdout, held
    refused = _prune(store, "--through", "5")
    assert refused.returncode == 1 and "litigation" in refused.stderr and "case 42" in refused.stderr, refused
    head = _prune(store, "--through", "6")
    assert head.returncode == 1 and "head" in head.stderr, head
    dry = _prune(store, "--through", "3", "--dry-run", "--json")
    assert json.loads(dry.stdout)["receipts_deleted"] == 3
    assert [r for (r,) in store.sql('SELECT COUNT(*) FROM "ctrlrun_receipt"')] == [6]
    done = _prune(store, "--through", "3", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["receipts_deleted"] == 3 and result["checkpoint"]["seq"] == 3, result
    assert sorted(s for (s,) in store.sql('SELECT "seq" FROM "ctrlrun_receipt"')) == [4, 5, 6]
    assert store.sql("SELECT COUNT(*) FROM \"ctrlrun_event\" WHERE \"type\" = 'RETENTION_APPLIED'") == [(1,)]
    report = store.verify()
    assert report["ok"] is True, report
    again = store.command("receipts", "--verify-chain", "--incremental", "--json")
    assert json.loads(again.stdout)["ok"] is True, again.stdout
    backwards = _prune(store, "--through", "2")
    assert backwards.returncode == 1 and "backwards" in backwards.stderr, backwards
    assert store.command("hold", "release", "--id", "litigation", "--by", "legal").stdout.strip() == \
        "released litigation"
    twice = store.command("hold", "release", "--id", "litigation", "--by", "legal")
    assert twice.returncode == 1 and "no live hold 'litigation'" in twice.stderr, twice
    assert _prune(store, "--through", "5").returncode == 0
    assert store.verify()["ok"] is True


def test_the_application_role_cannot_lift_the_guard_itself(store):
    """Every way the role could open the lift is refused: opening the lock without the next preimage
    (even with the digest it can read, or the spent preimage a prune revealed), setting
    ctrlrun.retention itself, writing a checkpoint, deleting a receipt."""
    refused = role_refused(store)
    assert _prune(store, "--through", "2").returncode == 0  # a prune revealed (and spent) a preimage
    [(digest, remaining)] = store.sql('SELECT "digest", "remaining" FROM "ctrlrun_retentionlock"')
    true = "true" if store.vendor == "postgresql" else "1"
    attempts = [
        f'UPDATE "ctrlrun_retentionlock" SET "open" = {true}',
        f'UPDATE "ctrlrun_retentionlock" SET "open" = {true}, "remaining" = "remaining" - 1',
        f'UPDATE "ctrlrun_retentionlock" SET "open" = {true}, "digest" = \'{digest}\', "remaining" = {remaining - 1}',
        'DELETE FROM "ctrlrun_retentionlock"',
        'INSERT INTO "ctrlrun_prunecheckpoint" ("seq", "hash", "schema", "at", "by", "reason") VALUES '
        "(4, 'x', 'ctrlrun.receipt/v7', '2026-01-01 00:00:00', 'me', 'me')",
        'DELETE FROM "ctrlrun_receipt" WHERE "seq" = 1',  # (already pruned: nothing)
        'DELETE FROM "ctrlrun_receipt" WHERE "seq" = 4',
        'DELETE FROM "ctrlrun_prunecheckpoint"',
    ]
    for statement in attempts[:5] + attempts[6:]:
        with pytest.raises(refused):
            if store.vendor == "postgresql":
                with store.connect() as conn, conn.transaction():
                    conn.execute("SELECT set_config('ctrlrun.retention', %s, true)", [digest])
                    conn.execute(statement)
            else:
                store.sql(statement)
    if store.vendor == "postgresql":  # the role sets the flag and opens the lock in one transaction
        with pytest.raises(refused), store.connect() as conn, conn.transaction():
            conn.execute("SET LOCAL ctrlrun.retention = 'anything'")
            conn.execute('UPDATE "ctrlrun_retentionlock" SET "open" = true, "digest" = \'anything\', '
                         '"remaining" = "remaining" - 1')
    assert sorted(s for (s,) in store.sql('SELECT "seq" FROM "ctrlrun_receipt"')) == [3, 4, 5, 6]
    assert store.verify()["ok"] is True


def test_an_anchor_names_a_store_rewound_and_re_signed_and_an_edited_anchor_file(store, tmp_path_factory):
    anchors = tmp_path_factory.mktemp("other-volume") / "anchors.jsonl"
    env_cmd = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "ctrlrun", *a], cwd=store.folder, capture_output=True, text=True, timeout=300,
        env={**store.environment(), "CTRLRUN_ANCHOR_FILE": str(anchors)})
    made = env_cmd("anchor")
    assert made.returncode == 0 and made.stdout.startswith("anchored seq 6 (interval) at "), made
    ok = env_cmd("anchor", "--verify")
    assert ok.returncode == 0 and "every anchor reproduces" in ok.stdout, ok
    pruned = env_cmd("prune", "--through", "2", "--older-than", "0s", "--by", "ops", "--reason", "retention", "--quiet")
    assert "the checkpoint was anchored before anything was deleted" in pruned.stdout, pruned
    after = json.loads(env_cmd("anchor", "--verify", "--json").stdout)
    assert after["ok"] is True and after["checked"] == 2 and after["superseded"] == 1, after
    owner = store if store.vendor == "sqlite" else RoleStore("postgresql", store.folder, url=store.owner_url)
    (store.folder / "rewind.py").write_text(REWIND)
    rewound = subprocess.run([sys.executable, str(store.folder / "rewind.py")], cwd=store.folder,
                             env=owner.environment(), capture_output=True, text=True, timeout=300)
    assert rewound.returncode == 0 and rewound.stdout.strip() == "6", rewound.stderr
    assert store.verify()["ok"] is True  # the chain alone cannot tell
    named = env_cmd("anchor", "--verify", "--json")
    assert named.returncode == 1, named
    report = json.loads(named.stdout)
    assert report["ok"] is False and [(b["name"], b["seq"]) for b in report["breaks"]] == [("anchor_broken", 6)]
    lines = anchors.read_text().splitlines()
    anchors.write_text(lines[0].replace('"seq": 6', '"seq": 5') + "\n")
    edited = env_cmd("anchor", "--verify", "--json")
    assert edited.returncode == 1 and json.loads(edited.stdout)["breaks"][0]["name"] == "anchor_repudiated", edited


def test_a_hold_placed_while_a_prune_runs_is_honoured(store):
    import time

    pruning = _pruner(store, 5, 1, "pause")
    while not (store.folder / "paused").exists():  # its first batch (seq 1) is done
        assert pruning.poll() is None, pruning.communicate()
        time.sleep(0.05)
    held = store.command("hold", "place", "--id", "litigation", "--from-seq", "3", "--to-seq", "4",
                         "--reason", "case 42", "--by", "legal")
    assert held.returncode == 0, held.stderr
    (store.folder / "go").write_text("")
    out, err = pruning.communicate(timeout=300)
    assert pruning.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["through"] == 2 and result["stopped_by"] == "litigation (case 42)", result
    assert sorted(s for (s,) in store.sql('SELECT "seq" FROM "ctrlrun_receipt"')) == [3, 4, 5, 6]
    assert store.verify()["ok"] is True


def test_a_prune_racing_live_calls_and_a_chain_check(store):
    """A prune in batches, calls appending receipts and chain checks, all at once in their own processes:
    every call lands, the checks racing the prune find nothing broken, the chain verifies after."""
    more = store.agent(*[{"op": "refund", "payment_id": f"q{i}", "amount": 1} for i in range(20)])
    assert all(d == {"value": "refunded"} for d in more), more
    pruning = _pruner(store, 20, 2, "run")
    calls = subprocess.Popen([sys.executable, str(store.folder / "role_agent.py"), str(store.folder), json.dumps(
        [{"op": "refund", "payment_id": f"r{i}", "amount": 1} for i in range(15)])], cwd=store.folder,
        env=store.environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checks = [subprocess.Popen([sys.executable, "-m", "ctrlrun", "receipts", "--verify-chain", "--json", "--quiet"]
                               + (["--incremental"] if i % 2 else []), cwd=store.folder, env=store.environment(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
    out, err = pruning.communicate(timeout=300)
    assert pruning.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["through"] == 20
    called, err = calls.communicate(timeout=300)
    assert calls.returncode == 0, err
    assert all(d == {"value": "refunded"} for d in json.loads(called.strip().splitlines()[-1]))
    for check in checks:
        report, err = check.communicate(timeout=300)
        assert json.loads(report)["ok"] is True, report
    assert store.verify()["ok"] is True
    assert min(s for (s,) in store.sql('SELECT "seq" FROM "ctrlrun_receipt"')) == 21


def test_a_hold_released_or_deleted_by_the_role_still_holds(store):
    placed = store.command("hold", "place", "--id", "audit", "--from-seq", "2", "--to-seq", "3", "--reason",
                           "audit 2026", "--by", "legal")
    assert placed.returncode == 0, placed.stderr
    with pytest.raises(role_refused(store)):
        store.sql('DELETE FROM "ctrlrun_hold"')
    with pytest.raises(role_refused(store)):
        store.sql('UPDATE "ctrlrun_hold" SET "from_seq" = 100')
    store.sql('UPDATE "ctrlrun_hold" SET "released_at" = "placed_at", "released_by" = %s', "intruder")
    listed = store.command("hold", "list")
    assert "NOT SIGNED BY CTRLRUN: treated as live" in listed.stdout, listed.stdout
    refused = _prune(store, "--through", "4")
    assert refused.returncode == 1 and "audit 2026" in refused.stderr, refused
    assert _prune(store, "--through", "1").returncode == 0


def test_bad_input_is_a_clear_error(store):
    weeks = _prune(store, "--through", "2", "--older-than", "1w")
    assert weeks.returncode == 2 and "<n>d" in weeks.stderr and "Traceback" not in weeks.stderr, weeks
    young = store.command("prune", "--through", "2", "--older-than", "3650d", "--by", "ops", "--reason", "r")
    assert young.returncode == 1 and "inside --older-than" in young.stderr, young
    empty = store.command("hold", "place", "--id", "x", "--from-seq", "0", "--reason", "r", "--by", "me")
    assert empty.returncode == 1 and "must start at 1" in empty.stderr and "Traceback" not in empty.stderr, empty
    none = store.command("anchor")
    assert none.returncode == 2 and "CTRLRUN_ANCHOR_FILE" in none.stderr, none
    both = store.command("prune", "--loop", "--through", "2", "--older-than", "1d", "--by", "o", "--reason", "r")
    assert both.returncode == 2 and "--loop" in both.stderr, both


def test_verify_grades_the_retention_guarantees_from_the_deployment(store, tmp_path_factory):
    """G28/G29/G30/G32 read the deployment's anchors, prune checkpoint and holds: not applicable
    until each exists, pass while they hold, fail naming what broke them (a rewound store, an edited
    anchor file, a hold changed by the role)."""
    anchors = tmp_path_factory.mktemp("verify-volume") / "anchors.jsonl"

    def run(*args: str, anchored: bool = True) -> subprocess.CompletedProcess:
        env = {**store.environment(), **({"CTRLRUN_ANCHOR_FILE": str(anchors)} if anchored else {})}
        return subprocess.run([sys.executable, "-m", "ctrlrun", *args], cwd=store.folder, capture_output=True,
                              text=True, timeout=300, env=env)

    def graded(anchored: bool = True) -> dict[str, dict]:
        done = run("verify", "--json", "--only", "G28,G29,G30,G32", anchored=anchored)
        assert "Traceback" not in done.stderr and done.stdout, done.stderr
        return {g["id"]: g for g in json.loads(done.stdout)["guarantees"] if g["status"] != "skipped"}

    first = graded(anchored=False)
    assert {g: r["status"] for g, r in first.items()} == dict.fromkeys(("G28", "G29", "G30", "G32"),
                                                                        "not_applicable"), first
    assert "CTRLRUN_ANCHOR_FILE" in first["G28"]["reason"] and "pruned" in first["G29"]["reason"]
    none_yet = graded()
    assert none_yet["G28"]["status"] == "fail" and "run 'anchor'" in none_yet["G28"]["reason"], none_yet
    assert run("anchor").returncode == 0
    assert run("hold", "place", "--id", "case-7", "--from-seq", "5", "--reason", "case 7", "--by", "legal").returncode == 0
    pruned = run("prune", "--through", "2", "--older-than", "0s", "--by", "ops", "--reason", "retention", "--quiet")
    assert pruned.returncode == 0, pruned.stderr
    honest = graded()
    assert {g: r["status"] for g, r in honest.items()} == dict.fromkeys(("G28", "G29", "G30", "G32"), "pass"), honest
    assert "seq 2" in honest["G29"]["reason"] and "case-7" in honest["G30"]["reason"], honest

    owner = store if store.vendor == "sqlite" else RoleStore("postgresql", store.folder, url=store.owner_url)
    (store.folder / "rewind.py").write_text(REWIND)
    rewound = subprocess.run([sys.executable, str(store.folder / "rewind.py")], cwd=store.folder,
                             env=owner.environment(), capture_output=True, text=True, timeout=300)
    assert rewound.returncode == 0, rewound.stderr
    behind = graded()
    assert behind["G28"]["status"] == "fail" and behind["G28"]["counterexample"][0]["name"] == "anchor_broken", behind
    assert behind["G29"]["status"] == "pass"  # the chain alone cannot tell: that is what the anchor is for

    # the role "releases" the hold by hand: a prune still reads it as live, the grade names the edit
    store.sql('UPDATE "ctrlrun_hold" SET "released_at" = "placed_at", "released_by" = %s', "intruder")
    edited = graded()
    assert edited["G30"]["status"] == "fail" and "case-7" in str(edited["G30"]["counterexample"]), edited
