"""``import`` (§F10): a store written by the reference ctrlrun (tests/fixtures/reference-store/state.db,
written by seven of its releases in turn: receipts v1-v7) read, verified and brought into ours on both
databases, as the application role on PostgreSQL; a tampered source refused with nothing written; and
our ctrlrun never opening the reference's own file as its store (it would run its keys again)."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, script_env, scratch_store

pytestmark = pytest.mark.slow

SOURCE = REPO / "tests" / "fixtures" / "reference-store" / "state.db"

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  refund.create:
    effect: "refund:{payment_id}"
    decision: allow
  email.send:
    effect: "email:{msg_id}"
    decision: allow
"""

#: Calls each key given on the command line once; prints one JSON object: key -> the value or the refusal.
AGENT = r'''
import json, pathlib, sys
import ctrlrun

@ctrlrun.protect("refund.create", effect="refund:{payment_id}")
def refund(payment_id, amount):
    pathlib.Path("ran-" + payment_id).write_text("ran")
    return "refunded"

@ctrlrun.protect("email.send", effect="email:{msg_id}")
def send(msg_id):
    pathlib.Path("ran-" + msg_id).write_text("ran")
    return "sent"

out = {}
with ctrlrun.context(agent="a1"):
    for key in sys.argv[1:]:
        kind, _, value = key.partition(":")
        try:
            out[key] = refund(payment_id=value, amount=10) if kind == "refund" else send(msg_id=value)
        except Exception as exc:
            out[key] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
'''


@pytest.fixture(params=["sqlite", "postgresql"])
def vendor(request):
    return request.param


def _agent(folder: Path, env: dict[str, str], *keys: str, full: bool = False) -> dict:
    """Each key's value, or its refusal's name (``full``: with its message)."""
    (folder / "import_agent.py").write_text(AGENT)
    done = subprocess.run([sys.executable, "import_agent.py", *keys], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    return out if full else {key: value.split(":", 1)[0] for key, value in out.items()}


def test_our_ctrlrun_never_runs_on_the_reference_s_own_store_file(tmp_path):
    """A folder where the reference ran (its ctrlrun.yaml and .ctrlrun/state.db): our ctrlrun installed in
    its place must not create its tables in that file and run again what the reference already ran."""
    folder = tmp_path / "agent"
    (folder / ".ctrlrun").mkdir(parents=True)
    shutil.copy(SOURCE, folder / ".ctrlrun" / "state.db")
    (folder / "ctrlrun.yaml").write_text(POLICY)
    refused = _agent(folder, script_env(), "refund:p-0.12.2", full=True)["refund:p-0.12.2"]
    assert refused.startswith("StoreUnavailable: ") and "written by the reference ctrlrun" in refused, refused
    assert "ctrlrun import" in refused, refused
    assert not (folder / "ran-p-0.12.2").exists()
    tables = {n for (n,) in sqlite3.connect(folder / ".ctrlrun" / "state.db").execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not any(t.startswith("ctrlrun_") for t in tables), tables
    moved = folder / ".ctrlrun" / "state.db"
    moved.rename(folder / "reference.db")
    done = subprocess.run([sys.executable, "-m", "ctrlrun", "import", "reference.db"], cwd=folder, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _agent(folder, script_env(), "refund:p-0.12.2") == {"refund:p-0.12.2": "DuplicateEffect"}
    assert not (folder / "ran-p-0.12.2").exists()


def _copy(tmp_path: Path, name: str = "reference.db") -> Path:
    copied = tmp_path / name
    shutil.copy(SOURCE, copied)
    return copied


def _events(store, type_: str) -> list:
    return store.sql(f'SELECT "effect_key", "data" FROM "ctrlrun_event" WHERE "type" = \'{type_}\' ORDER BY "seq"')


def test_an_import_keeps_every_key_the_reference_ran_and_its_receipts(vendor, tmp_path):
    source = _copy(tmp_path)
    with scratch_store(vendor, tmp_path, POLICY, tag="import") as store:
        before = json.loads(store.command("verify", "--json", "--only", "G31").stdout)["guarantees"][30]
        assert before["id"] == "G31" and before["status"] == "not_applicable", before
        dry = store.command("import", str(source), "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        report = json.loads(dry.stdout)
        assert report["schemas"] == {f"ctrlrun.receipt/v{n}": 4 for n in range(1, 8)}, report
        assert (report["verified"], report["chained"], report["unchained"], report["head_seq"]) == (20, 20, 8, 20)
        assert report["effects"] == {"ambiguous": 6, "committed": 7, "failed": 1} and report["imported"] is False
        assert store.sql('SELECT COUNT(*) FROM "ctrlrun_effectrecord"') == [(0,)]  # a dry run writes nothing

        done = store.command("import", str(source), "--by", "ops")
        assert done.returncode == 0, done.stderr
        assert "20 of 20 chained verified" in done.stdout and "imported: 28 receipt(s)" in done.stdout, done.stdout
        keys = ["refund:p-0.12.2", "refund:p-0.1.0", "email:m-0.12.2", "email:m-0.9.0", "refund:new"]
        assert _agent(store.folder, store.environment(), *keys) == {
            "refund:p-0.12.2": "DuplicateEffect", "refund:p-0.1.0": "DuplicateEffect",  # committed there: not again
            "email:m-0.12.2": "AmbiguousEffect",  # unknown there: still unknown here, until resolved
            "email:m-0.9.0": "sent",  # resolved failed there by its operator: a retry may run
            "refund:new": "refunded"}
        assert not (store.folder / "ran-p-0.12.2").exists()
        told = {key: json.loads(d) if isinstance(d, str) else d for key, d in _events(store, "EFFECT_IMPORTED")}
        assert told["email:m-0.9.0"]["resolved_by"] == "cli:local (reference)", told  # who resolved it there
        assert told["refund:p-0.1.0"]["action"] == "refund.create" and len(told) == 14
        imported = [json.loads(d) if isinstance(d, str) else d for _, d in _events(store, "RECEIPT_IMPORTED")]
        with sqlite3.connect(source) as original:
            texts = [t for (t,) in original.execute("SELECT json FROM receipts ORDER BY seq IS NULL DESC, seq, rowid")]
        assert [e["document"] for e in imported] == texts  # byte for byte: each still re-hashes to its own hash
        assert sorted({e["schema"] for e in imported}) == [f"ctrlrun.receipt/v{n}" for n in range(1, 8)]
        [(_, summary)] = _events(store, "STORE_IMPORTED")
        summary = json.loads(summary) if isinstance(summary, str) else summary
        assert summary["source"]["head_seq"] == 20 and summary["source"]["imported_by"] == "ops", summary
        assert store.verify()["ok"] is True
        graded = json.loads(store.command("verify", "--json", "--only", "G31").stdout)["guarantees"][30]
        assert graded["status"] == "pass" and "28 receipt(s)" in graded["reason"] and "7 schema(s)" in \
            graded["reason"], graded

        again = store.command("import", str(source))
        assert again.returncode == 1 and "already imported" in again.stderr, again
        assert len(_events(store, "STORE_IMPORTED")) == 1


def test_a_store_the_reference_pruned_verifies_from_its_checkpoint(tmp_path):
    """Its chain starts after its prune checkpoint (seq 10), not at the genesis: that is no break."""
    source = tmp_path / "pruned.db"
    shutil.copy(SOURCE.with_name("pruned.db"), source)
    with scratch_store("sqlite", tmp_path, POLICY, tag="import") as store:
        done = store.command("import", str(source), "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["checkpoint"]["seq"] == 10 and report["breaks"] == [] and report["imported"], report
        assert report["verified"] == report["chained"] == 12, report
        graded = json.loads(store.command("verify", "--json", "--only", "G31").stdout)["guarantees"][30]
        assert graded["status"] == "pass", graded
    with sqlite3.connect(source) as connection:  # its checkpoint moved: the first receipt no longer links
        connection.execute("UPDATE prune_checkpoint SET seq = 9")
    (tmp_path / "again").mkdir()
    with scratch_store("sqlite", tmp_path / "again", POLICY, tag="import") as store:
        done = store.command("import", str(source))
        assert done.returncode == 1 and "missing" in done.stdout, done.stdout


TAMPERINGS = {
    # an effect row the verified receipts contradict: the key would run again here
    "effect_contradicts_receipt": "UPDATE effects SET state = 'failed' WHERE effect_key = 'refund:p-0.12.2'",
    "effect_missing": "DELETE FROM effects WHERE effect_key = 'refund:p-0.7.0'",
    # a receipt stored as bytes, not text: no document to hash
    "unreadable_blob": "UPDATE receipts SET json = CAST(json AS BLOB) WHERE seq = 17",
    # a chained schema's receipt with its seq taken away
    "unchained_after_chain": "UPDATE receipts SET seq = NULL WHERE seq = 20",
    "effect_unreadable": "UPDATE effects SET attempt = 'x' WHERE effect_key = 'refund:p-0.9.0'",
    "content_altered": "UPDATE receipts SET json = replace(json, '\"attempt\":1', '\"attempt\":2') WHERE seq = 5",
    "missing": "DELETE FROM receipts WHERE seq = 7",
    "head_mismatch": "UPDATE receipt_chain SET seq = 19",
    "unreadable": "UPDATE receipts SET json = '{not json' WHERE seq = 3",
    "unknown_schema": "UPDATE receipts SET json = replace(json, 'ctrlrun.receipt/v7', 'ctrlrun.receipt/v9') "
                      "WHERE seq = 18",
}


@pytest.mark.parametrize("break_name", sorted(TAMPERINGS))
def test_a_tampered_reference_store_is_refused_and_nothing_is_written(tmp_path, break_name):
    source = _copy(tmp_path)
    with sqlite3.connect(source) as connection:
        connection.execute(TAMPERINGS[break_name])
    with scratch_store("sqlite", tmp_path, POLICY, tag="import") as store:
        done = store.command("import", str(source))
        assert done.returncode == 1 and "nothing was imported" in done.stderr, done
        assert break_name.replace("unreadable_blob", "unreadable") in done.stdout, done.stdout
        assert "Traceback" not in done.stderr, done.stderr
        assert store.sql('SELECT COUNT(*) FROM "ctrlrun_effectrecord"') == [(0,)]
        assert _events(store, "RECEIPT_IMPORTED") == []


def test_a_key_already_run_here_or_a_live_reference_worker_refuses_the_import(tmp_path):
    source = _copy(tmp_path)
    with scratch_store("sqlite", tmp_path, POLICY, tag="import") as store:
        assert _agent(store.folder, store.environment(), "refund:p-0.7.0") == {"refund:p-0.7.0": "refunded"}
        clash = store.command("import", str(source))
        assert clash.returncode == 1 and "'refund:p-0.7.0'" in clash.stderr and "nothing was imported" in clash.stderr
        assert store.sql('SELECT COUNT(*) FROM "ctrlrun_effectrecord"') == [(1,)]
    live = _copy(tmp_path, "live.db")
    with sqlite3.connect(live) as connection:
        connection.execute("UPDATE effects SET state = 'executing', lease_expires_at = '2999-01-01T00:00:00+00:00' "
                           "WHERE effect_key = 'email:m-0.12.2'")
    (tmp_path / "second").mkdir()
    with scratch_store("sqlite", tmp_path / "second", POLICY, tag="import") as store:
        refused = store.command("import", str(live))
        assert refused.returncode == 1 and "live lease" in refused.stderr and "email:m-0.12.2" in refused.stderr
        with sqlite3.connect(live) as connection:
            connection.execute("UPDATE effects SET lease_expires_at = '2001-01-01T00:00:00+00:00'")
        assert store.command("import", str(live)).returncode == 0
        assert store.sql('SELECT "state", "error" FROM "ctrlrun_effectrecord" WHERE "effect_key" = '
                         '\'email:m-0.12.2\'')[0][0] == "ambiguous"  # it was running: nobody knows


@pytest.mark.parametrize("what", ["missing", "text", "ours", "empty_sqlite"])
def test_a_file_that_is_not_a_reference_store_is_a_clear_error(tmp_path, what):
    with scratch_store("sqlite", tmp_path, POLICY, tag="import") as store:
        path = tmp_path / "given.db"
        if what == "text":
            path.write_text("hello\n" * 100)
        elif what == "ours":
            path = store.folder / "store.db"
        elif what == "empty_sqlite":
            sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.commit()
        done = store.command("import", str(path))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done
        expected = {"missing": "no such file", "text": "not a SQLite database", "ours": "a store of ours",
                    "empty_sqlite": "not a store written by the reference"}[what]
        assert expected in done.stderr, done.stderr


def test_a_project_database_holding_the_reference_s_store_fails_the_check(db):
    """Inside a Django project: ctrlrun.E008 when its database also holds the reference's tables."""
    from django.db import connection

    from ctrlrun.checks import check_reference_store

    assert check_reference_store() == []
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE effects (effect_key TEXT PRIMARY KEY, state TEXT)")
        cursor.execute("CREATE TABLE receipts (receipt_id TEXT PRIMARY KEY, json TEXT)")
        cursor.execute("CREATE TABLE receipt_chain (id INTEGER PRIMARY KEY, seq INTEGER, hash TEXT)")
    [found] = check_reference_store()
    assert found.id == "ctrlrun.E008" and "would run again" in found.msg and "importing.md" in found.hint


@pytest.mark.parametrize("vendor", ["sqlite", "postgresql"])
def test_an_effect_keeps_its_attempt_so_its_token_means_the_same_attempt(tmp_path, vendor):
    """A record at the reference's attempt 3 is at attempt 3 here (its idempotency token is per attempt)."""
    source = _copy(tmp_path)
    with sqlite3.connect(source) as connection:
        connection.execute("UPDATE effects SET attempt = 3 WHERE effect_key = 'email:m-0.12.2'")
    with scratch_store(vendor, tmp_path, POLICY, tag="import") as store:
        done = store.command("import", str(source))
        assert done.returncode == 0, done.stderr
        assert store.sql('SELECT "state", "attempt" FROM "ctrlrun_effectrecord" WHERE "effect_key" = '
                         '\'email:m-0.12.2\'') == [("ambiguous", 3)]
        assert store.verify()["ok"] is True
