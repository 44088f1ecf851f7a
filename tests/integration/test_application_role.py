"""Attacks that need a real PostgreSQL server: the application's own database role, and a host whose
clock is ten minutes off.

The application role is what a Django project normally connects as: it may SELECT, INSERT, UPDATE
and DELETE, and owns nothing, so it cannot disable or drop triggers. Someone holding its
credentials (a leaked DATABASE_URL, a SQL console, SQL injection elsewhere in the project) has the
same rights and no signing key. Both the agent and the attacker run as that role here, in real OS
processes; the tables belong to the database owner, as after ``manage.py migrate``.

These tests always run against a scratch PostgreSQL database of their own (on both passes of the
suite), cloned from a template store migrated once per module.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.support import REFUND_POLICY
from tests.support import REPO, require_faketime, require_postgresql

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

AGENT = """
import json, pathlib, sys, time
import ctrlrun

folder = pathlib.Path(sys.argv[1])
operation, args = sys.argv[2], sys.argv[3:]

@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id: str, amount: int) -> str:
    with open(folder / "remote.log", "a") as log:
        log.write(f"{payment_id} {amount}\\n")
    if (folder / f"hold-{payment_id}").exists():        # a slow remote: wait until told to answer
        (folder / f"inside-{payment_id}").touch()
        while not (folder / f"go-{payment_id}").exists():
            time.sleep(0.02)
    if (folder / f"lose-{payment_id}").exists():
        raise TimeoutError("read timed out")
    return "refunded"

out = {}
with ctrlrun.context(agent="support-agent"):
    try:
        if operation == "refund":
            payment_id, amount = args[0], int(args[1])
            if len(args) > 2:
                with ctrlrun.with_approval(args[2]):
                    out["value"] = refund(payment_id=payment_id, amount=amount)
            else:
                out["value"] = refund(payment_id=payment_id, amount=amount)
        elif operation == "sweep":
            ctrlrun.setup()
            from ctrlrun import reconcile
            out["swept"] = [e.effect_key for e in reconcile.run_once().swept]
    except ctrlrun.CTRLRunError as exc:
        out.update(error=type(exc).__name__, message=str(exc), reason=getattr(exc, "reason", None),
                   request_id=getattr(exc, "request_id", None), state=getattr(exc, "state", None))
    except TimeoutError:
        out["error"] = "TimeoutError"
print(json.dumps(out))
"""


def _clean_env(url: str, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STATE", "CTRLRUN_CONFIG")}
    env.update(PYTHONPATH=str(REPO), CTRLRUN_STORE_URL=url, CTRLRUN_CONFIG=str(folder / "ctrlrun.yaml"))
    return env


def _admin(statement: str) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(statement)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A store migrated by its owner, and an application role with DML rights only on its tables."""
    require_postgresql()
    suffix = uuid.uuid4().hex[:8]
    name, role = f"ctrlrun_role_tmpl_{suffix}", f"ctrlrun_app_{suffix}"
    folder = tmp_path_factory.mktemp("template")
    (folder / "ctrlrun.yaml").write_text(REFUND_POLICY)
    _admin(f'CREATE DATABASE "{name}"')
    _admin(f'CREATE ROLE "{role}" LOGIN')
    owner_url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    try:
        made = subprocess.run([sys.executable, "-c", "import ctrlrun; ctrlrun.setup()"], cwd=folder,
                              env=_clean_env(owner_url, folder), capture_output=True, text=True, timeout=300)
        assert made.returncode == 0, made.stderr
        with psycopg.connect(owner_url, autocommit=True) as owner:
            owner.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{role}"')
            owner.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
        yield name, role
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        _admin(f'DROP ROLE IF EXISTS "{role}"')


class Store:
    """One scratch store (a clone of the template), reached as the application role."""

    def __init__(self, url: str, folder: Path) -> None:
        self.url, self.folder = url, folder
        (folder / "ctrlrun.yaml").write_text(REFUND_POLICY)
        (folder / "agent.py").write_text(AGENT)

    def agent(self, *args: str, clock: str | None = None, wait: bool = True):
        """Run the agent script as the application role (under faketime's ``clock`` offset, if given)."""
        command = [sys.executable, str(self.folder / "agent.py"), str(self.folder), *args]
        if clock is not None:
            command = [require_faketime(), "-f", clock, *command]
        process = subprocess.Popen(command, cwd=self.folder, env=_clean_env(self.url, self.folder),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if not wait:
            return process
        out, err = process.communicate(timeout=180)
        assert process.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def verify(self) -> dict:
        done = subprocess.run([sys.executable, "-m", "ctrlrun", "receipts", "--verify-chain", "--json"],
                              cwd=self.folder, env=_clean_env(self.url, self.folder), capture_output=True, text=True,
                              timeout=180)
        return json.loads(done.stdout)

    def attacker(self):
        """A connection as the application role, with no signing key: plain SQL."""
        return psycopg.connect(self.url, autocommit=True)

    def remote(self) -> list[str]:
        path = self.folder / "remote.log"
        return path.read_text().splitlines() if path.exists() else []

    def rows(self, sql: str, *params):
        with self.attacker() as conn:
            return conn.execute(sql, params).fetchall()


@pytest.fixture
def store(template, tmp_path):
    name, role = template
    clone = f"ctrlrun_role_{uuid.uuid4().hex[:8]}"
    _admin(f'CREATE DATABASE "{clone}" TEMPLATE "{name}"')
    yield Store(f"postgresql://{role}@127.0.0.1:5432/{clone}", tmp_path)
    _admin(f'DROP DATABASE IF EXISTS "{clone}" WITH (FORCE)')


def _breaks(report: dict) -> list[tuple[str, str]]:
    return [(b["name"], b["kind"]) for b in report["breaks"]]


# --------------------------------------------------------------------------- what the role cannot do


@pytest.mark.parametrize("statement", [
    'ALTER TABLE "ctrlrun_receipt" DISABLE TRIGGER ALL',
    'DROP TRIGGER "ctrlrun_effectrecord_guard" ON "ctrlrun_effectrecord"',
    "SET session_replication_role = replica",
    'DELETE FROM "ctrlrun_receipt"',
    'DELETE FROM "ctrlrun_event"',
    'DELETE FROM "ctrlrun_effectrecord"',
    'DELETE FROM "ctrlrun_approval"',
    'UPDATE "ctrlrun_effectrecord" SET "state" = \'failed\' WHERE "state" = \'committed\'',
    'UPDATE "ctrlrun_chainhead" SET "seq" = 0',
    'TRUNCATE "ctrlrun_effectrecord"',
])
def test_the_application_role_cannot_lift_or_get_around_the_guard(store, statement):
    """Without ownership the role can neither disable the triggers nor do what they refuse."""
    assert store.agent("refund", "txn_1", "100") == {"value": "refunded"}
    assert store.agent("refund", "txn_2", "900000")["error"] == "ApprovalRequired"  # a request row, too
    before = store.rows('SELECT "effect_key", "state" FROM "ctrlrun_effectrecord" UNION ALL '
                        'SELECT "approval_id", "status" FROM "ctrlrun_approval"')
    with store.attacker() as conn, pytest.raises(psycopg.Error):
        conn.execute(statement)
    assert store.rows('SELECT "effect_key", "state" FROM "ctrlrun_effectrecord" UNION ALL '
                      'SELECT "approval_id", "status" FROM "ctrlrun_approval"') == before
    assert store.verify()["ok"] is True


def test_a_committed_effect_cannot_be_reopened(store):
    """The role sets a committed record back to failed: refused, and the retry is still a duplicate."""
    assert store.agent("refund", "txn_1", "100") == {"value": "refunded"}
    with store.attacker() as conn, pytest.raises(psycopg.Error, match="state table"):
        conn.execute('UPDATE "ctrlrun_effectrecord" SET "state" = \'failed\' WHERE "effect_key" = %s',
                     ["refund:txn_1"])
    assert store.agent("refund", "txn_1", "100")["state"] == "committed"
    assert store.remote() == ["txn_1 100"]


def test_a_forged_resolution_does_not_license_a_retry(store):
    """The role marks an ambiguous effect failed 'by alice' (an edge the table allows): the retry refuses."""
    (store.folder / "lose-txn_2").touch()
    assert store.agent("refund", "txn_2", "100")["error"] == "TimeoutError"
    with store.attacker() as conn:
        conn.execute('UPDATE "ctrlrun_effectrecord" SET "state" = \'failed\', "resolved_by" = \'alice\', '
                     '"error" = \'resolved failed by alice\' WHERE "effect_key" = %s', ["refund:txn_2"])
    retry = store.agent("refund", "txn_2", "100")
    assert retry["error"] == "AmbiguousEffect" and "signature" in retry["message"]
    assert store.remote() == ["txn_2 100"]
    assert ("signature_invalid", "effect") in _breaks(store.verify())


def test_an_approval_granted_by_sql_never_runs(store):
    """The role sets a 900,000 refund's request granted 'by cfo': presented, it is refused; nothing runs."""
    asked = store.agent("refund", "txn_3", "900000")
    assert asked["error"] == "ApprovalRequired"
    with store.attacker() as conn:
        conn.execute('UPDATE "ctrlrun_approval" SET "status" = \'granted\', "approver" = \'cfo\', '
                     '"answered_at" = now() WHERE "approval_id" = %s', [asked["request_id"]])
    used = store.agent("refund", "txn_3", "900000", asked["request_id"])
    assert (used["error"], used["reason"]) == ("ApprovalMismatch", "tampered")
    assert store.remote() == []
    assert store.rows('SELECT count(*) FROM "ctrlrun_event" WHERE "type" = \'APPROVAL_GRANTED\'') == [(0,)]
    assert ("signature_invalid", "approval") in _breaks(store.verify())


def test_a_forged_receipt_at_the_head_is_named_and_stops_the_store(store):
    """The role appends a well-formed receipt and moves the head over it: verify names the head, and no
    further call acts on top of it."""
    assert store.agent("refund", "txn_4", "100") == {"value": "refunded"}
    with store.attacker() as conn:
        seq, head = conn.execute('SELECT "seq", "hash" FROM "ctrlrun_chainhead"').fetchone()
        doc = json.loads(conn.execute('SELECT "document" FROM "ctrlrun_receipt" WHERE "seq" = %s', [seq]).fetchone()[0])
        doc.update(receipt_id="ctr_" + "f" * 32, seq=seq + 1, prev_hash=head, arguments={"amount": 999999,
                                                                                         "payment_id": "txn_x"})
        canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        digest = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
        conn.execute('INSERT INTO "ctrlrun_receipt" ("receipt_id","seq","action_id","action","agent","decision",'
                     '"result","effect_key","ts","document","prev_hash","hash") VALUES (%s,%s,%s,%s,%s,%s,%s,%s,now(),'
                     '%s,%s,%s)', [doc["receipt_id"], seq + 1, doc["action_id"], doc["action"], "support-agent",
                                   "allow", "committed", None, json.dumps(doc, separators=(",", ":")), head, digest])
        conn.execute('UPDATE "ctrlrun_chainhead" SET "seq" = %s, "hash" = %s', [seq + 1, digest])
    assert ("signature_invalid", "head") in _breaks(store.verify())
    refused = store.agent("refund", "txn_5", "100")
    assert refused["error"] == "EvidenceTampered" and "Nothing ran" in refused["message"]
    assert store.remote() == ["txn_4 100"]


# --------------------------------------------------------------------------- a host whose clock is off


def test_a_host_ten_minutes_off_cannot_lapse_a_live_lease(store):
    """A holder 10 minutes slow and a contender 10 minutes fast: the lease is the database's, so the contender
    and its sweep meet a live lease, and both hosts' rows carry the database's time."""
    require_faketime()
    (store.folder / "hold-txn_6").touch()
    holder = store.agent("refund", "txn_6", "100", clock="-10m", wait=False)
    try:
        deadline = time.monotonic() + 120
        while not (store.folder / "inside-txn_6").exists():
            assert holder.poll() is None, holder.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        contender = store.agent("refund", "txn_6", "100", clock="+10m")
        assert (contender.get("error"), contender.get("state")) == ("DuplicateEffect", "in_progress"), contender
        assert store.agent("sweep", clock="+10m") == {"swept": []}
        assert store.agent("refund", "txn_7", "100", clock="+10m") == {"value": "refunded"}
        (store.folder / "go-txn_6").touch()
        out, err = holder.communicate(timeout=120)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert json.loads(out.strip().splitlines()[-1]) == {"value": "refunded"}, err
    assert store.remote() == ["txn_6 100", "txn_7 100"]
    real_now = dt.datetime.now(dt.timezone.utc)
    times = store.rows('SELECT "created_at" FROM "ctrlrun_effectrecord" UNION ALL SELECT "updated_at" FROM '
                       '"ctrlrun_effectrecord" UNION ALL SELECT "ts" FROM "ctrlrun_event" UNION ALL SELECT "ts" FROM '
                       '"ctrlrun_receipt"')
    documents = [json.loads(d) for (d,) in store.rows('SELECT "document" FROM "ctrlrun_receipt"')]
    times += [(dt.datetime.fromisoformat(d[k].replace("Z", "+00:00")),) for d in documents
              for k in ("started_at", "finished_at")]
    assert times and all(abs((moment - real_now).total_seconds()) < 120 for (moment,) in times)
    assert store.verify()["ok"] is True
