"""Guarantees under faults: append-only evidence, killed workers, a database that goes away.

Killed workers are real OS processes killed with SIGKILL. The database faults need a server,
so they always run against PostgreSQL (a scratch database of their own), on both passes of
the suite.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

import ctrlrun
from ctrlrun import conf
from ctrlrun.models import EffectRecord, Event, Receipt
from tests.support import LEDGER_POLICY, REPO, require_postgresql, script_environment

pytestmark = pytest.mark.usefixtures("store_db")


def _some_receipts(agent) -> None:
    @ctrlrun.protect("audit.note")
    def note(text: str) -> None: ...

    note(text="a")
    note(text="b")


# --------------------------------------------------------------------------- append-only evidence


@pytest.mark.parametrize("statement", [
    'UPDATE "ctrlrun_receipt" SET "result" = \'committed\'',
    'UPDATE "ctrlrun_receipt" SET "document" = \'{}\'',
    'DELETE FROM "ctrlrun_receipt"',
    'UPDATE "ctrlrun_event" SET "type" = \'ACTION_DENIED\'',
    'DELETE FROM "ctrlrun_event"',
])
def test_database_refuses_edits_of_evidence(agent, statement):
    """The database itself refuses UPDATE and DELETE on receipts and events."""
    _some_receipts(agent)
    before = list(Receipt.objects.order_by("seq").values_list("document", flat=True))
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
    assert list(Receipt.objects.order_by("seq").values_list("document", flat=True)) == before
    assert Event.objects.count() > 0


def test_orm_delete_of_evidence_refused(agent):
    """Even the ORM (a shell, an admin action) cannot delete a receipt."""
    _some_receipts(agent)
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic():
            Receipt.objects.all().delete()
    assert Receipt.objects.count() == 2


def test_truncate_refused_on_postgresql(agent):
    """On PostgreSQL a TRUNCATE of the evidence is refused too (SQLite has no TRUNCATE)."""
    _some_receipts(agent)
    statement = 'TRUNCATE "ctrlrun_event"' if connection.vendor == "postgresql" else 'DELETE FROM "ctrlrun_event"'
    with pytest.raises(DatabaseError, match="append-only"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement)
    assert Event.objects.count() > 0


# --------------------------------------------------------------------------- killed workers

WORKER = """
import json, os, sys, time, datetime as dt
import ctrlrun

ready, ledger = sys.argv[1], sys.argv[2]

@ctrlrun.protect("ledger.post", effect="post:{entry_id}", lease=dt.timedelta(hours=1))
def post(entry_id: str) -> str:
    with open(ledger, "a") as handle:
        handle.write(entry_id + "\\n")     # the remote acted...
    open(ready, "w").close()
    time.sleep(600)                        # ...and the worker dies before it can say so
    return "never"

with ctrlrun.context(agent="doomed-worker"):
    post(entry_id="e1")
"""


def _wait_for(path: Path, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while not path.exists():
        assert process.poll() is None, process.stderr.read() if process.stderr else "worker exited"
        assert time.time() < deadline, "the worker never reached its function"
        time.sleep(0.05)


def test_sigkilled_worker_is_refused_then_swept_and_reconciled(tmp_path, agent):
    """A worker killed mid-function: refused within its lease; then swept, reconciled, never run twice."""
    env = script_environment(tmp_path, LEDGER_POLICY)
    (tmp_path / "worker.py").write_text(WORKER)
    ledger, ready = tmp_path / "ledger.txt", tmp_path / "ready"
    worker = subprocess.Popen([sys.executable, "worker.py", str(ready), str(ledger)], cwd=tmp_path, env=env,
                              stderr=subprocess.PIPE, text=True)
    _wait_for(ready, worker)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)

    record = EffectRecord.objects.get(pk="post:e1")
    assert record.state == "executing" and record.lease_expires_at is not None
    assert not Receipt.objects.filter(effect_key="post:e1").exists()  # a dead worker writes no receipt

    def remote_has(effect_key: str) -> str:
        return "committed" if effect_key.removeprefix("post:") in ledger.read_text().split() else "not_executed"

    @ctrlrun.protect("ledger.post", effect="post:{entry_id}", reconcile=remote_has)
    def post(entry_id: str) -> str:
        with open(ledger, "a") as handle:
            handle.write(entry_id + "\n")
        return "posted"

    with pytest.raises(ctrlrun.DuplicateEffect) as caught:  # within the lease
        post(entry_id="e1")
    assert caught.value.state == "in_progress"

    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    conf.set_clock(lambda: later)
    try:
        from io import StringIO

        out = StringIO()
        call_command("reconcile", stdout=out)
    finally:
        conf.set_clock(None)
    assert "post:e1  swept" in out.getvalue() and "post:e1  committed" in out.getvalue()
    record.refresh_from_db()
    assert (record.state, record.resolved_by) == ("committed", "reconcile:ledger.post")
    swept = Event.objects.get(type="EXECUTION_AMBIGUOUS", effect_key="post:e1")
    assert swept.data["reason"] == "lease_expired"

    with pytest.raises(ctrlrun.DuplicateEffect):
        post(entry_id="e1")
    assert ledger.read_text().split() == ["e1"]  # it happened exactly once


KILL_IN_TRANSACTION = """
import os, signal, sys
import ctrlrun
from django.db import connection

@ctrlrun.protect("ledger.post", effect="post:{entry_id}")
def post(entry_id: str) -> str:
    return entry_id

def die_at_events_insert(execute, sql, params, many, context):
    if 'INSERT INTO "ctrlrun_event"' in sql:   # the record's outcome is already written, uncommitted
        os.kill(os.getpid(), signal.SIGKILL)
    return execute(sql, params, many, context)

with ctrlrun.context(agent="fragile-worker"):
    post(entry_id="warm")                      # the store exists and the policy row is written
    with connection.execute_wrapper(die_at_events_insert):
        post(entry_id="e2")
"""


def test_worker_killed_inside_a_transaction_leaves_no_partial_rows(tmp_path, agent, clock, hook_registry):
    """SIGKILL between two statements of the outcome write: the database keeps nothing of that transaction;
    the record stays held, as a killed worker leaves it, and the sweep later writes its evidence."""
    env = script_environment(tmp_path, LEDGER_POLICY)
    (tmp_path / "worker.py").write_text(KILL_IN_TRANSACTION)
    result = subprocess.run([sys.executable, "worker.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert EffectRecord.objects.filter(pk="post:warm", state="committed").exists()
    record = EffectRecord.objects.get(pk="post:e2")
    assert (record.state, record.attempt) == ("executing", 1)  # the outcome's UPDATE rolled back with the rest
    assert not Event.objects.filter(effect_key="post:e2").exists()
    assert not Receipt.objects.filter(effect_key="post:e2").exists()
    assert call_command("receipts", "--verify-chain", stdout=open(os.devnull, "w")) is None

    clock.now = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=10)  # its lease lapses
    from ctrlrun import reconcile

    assert [e.effect_key for e in reconcile.run_once().swept] == ["post:e2"]
    assert list(Event.objects.filter(effect_key="post:e2").values_list("type", flat=True)) == [
        "ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED", "EXECUTION_STARTED", "EXECUTION_AMBIGUOUS"]
    [dead] = [json.loads(r.document) for r in Receipt.objects.filter(effect_key="post:e2")]
    assert (dead["result"], dead["attempt"], dead["principal"]["agent"]) == ("ambiguous", 1, "fragile-worker")
    assert call_command("receipts", "--verify-chain", stdout=open(os.devnull, "w")) is None


# --------------------------------------------------------------------------- database faults (PostgreSQL)

FAULTS = """
import json, sys, time, datetime as dt
import psycopg
import ctrlrun
from django.db import connection

url = sys.argv[1]
executed = []

def remote_has(effect_key):
    return "committed" if effect_key in executed else "not_executed"

@ctrlrun.protect("ledger.post", effect="post:{entry_id}", lease=dt.timedelta(seconds=1), reconcile=remote_has)
def post(entry_id: str, drop: bool = False) -> str:
    executed.append("post:" + entry_id)
    if drop:   # the database connection goes away between the reservation and the outcome write
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    return "posted " + entry_id

report = {}
with ctrlrun.context(agent="flaky-network"):
    try:
        report["first"] = post(entry_id="f1", drop=True)
    except ctrlrun.StoreUnavailable as exc:
        report["first_error"] = str(exc)
    report["second"] = post(entry_id="f2")          # same process: service resumes
    time.sleep(1.5)                                  # f1's lease lapses
    from ctrlrun import reconcile
    result = reconcile.run_once()
    report["swept"] = [e.effect_key for e in result.swept]
    report["lines"] = [[l.effect_key, l.outcome] for l in result.lines]
    try:
        post(entry_id="f1")
    except ctrlrun.DuplicateEffect as exc:
        report["retry"] = exc.state
    report["executed"] = executed
print(json.dumps(report))
"""


@pytest.fixture
def scratch_postgres():
    """A PostgreSQL database of this test's own, dropped afterwards."""
    import psycopg

    require_postgresql()

    name = f"ctrlrun_faults_{uuid.uuid4().hex[:8]}"
    admin_url = "postgresql://postgres@127.0.0.1:5432/postgres"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _standalone(tmp_path: Path, source: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "ctrlrun.yaml").write_text(LEDGER_POLICY)
    (tmp_path / "script.py").write_text(source)
    base = {k: v for k, v in os.environ.items()
            if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE")}
    base["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "script.py", *args], cwd=tmp_path, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def test_connection_dropped_before_outcome_write(tmp_path, scratch_postgres):
    """The connection dies mid-call: no success is reported, the record ends reconciled, service resumes."""
    result = _standalone(tmp_path, FAULTS, scratch_postgres, CTRLRUN_STORE_URL=scratch_postgres)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert "first" not in report  # the value was never handed back: its outcome was not recorded
    assert "outcome could not be recorded" in report["first_error"] and "do not retry blindly" in report["first_error"]
    assert report["second"] == "posted f2"
    assert report["swept"] == ["post:f1"]
    assert report["lines"] == [["post:f1", "committed"]]
    assert report["retry"] == "committed"
    assert report["executed"] == ["post:f1", "post:f2"]  # nothing ran twice


def test_database_down_at_reservation(tmp_path):
    """With the database unreachable the function never runs and the caller gets StoreUnavailable."""
    source = """
import ctrlrun
ran = []

@ctrlrun.protect("ledger.post", effect="post:{entry_id}")
def post(entry_id: str) -> None:
    ran.append(entry_id)

with ctrlrun.context(agent="a"):
    try:
        post(entry_id="x")
    except ctrlrun.StoreUnavailable as exc:
        print("refused:", exc)
print("ran:", ran)
"""
    # Port 1 on loopback: nothing listens there, so the connection is refused at once.
    result = _standalone(tmp_path, source, CTRLRUN_STORE_URL="postgresql://postgres@127.0.0.1:1/ctrlrun")
    assert result.returncode == 0, result.stderr
    assert "refused: the ctrlrun store (postgresql ctrlrun on 127.0.0.1) could not be opened" in result.stdout
    assert "nothing ran" in result.stdout
    assert result.stdout.strip().endswith("ran: []")


EAGER_FAULT = """
import json, sys, datetime as dt
import psycopg
import ctrlrun
from django.db import connection

url = sys.argv[1]

def cut_the_connection():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])

def hook(effect_key):
    cut_the_connection()   # the store goes away while the hook answers
    return "committed"

@ctrlrun.protect("ledger.post", effect="post:{entry_id}", reconcile=hook, reconcile_eagerly=True)
def post(entry_id: str) -> str:
    raise TimeoutError("read timed out")

report = {}
with ctrlrun.context(agent="eager"):
    try:
        post(entry_id="g1")
    except Exception as exc:
        report["raised"] = type(exc).__name__
from ctrlrun.models import EffectRecord, Receipt
report["state"] = EffectRecord.objects.get(pk="post:g1").state
report["receipts"] = [json.loads(r.document)["result"] for r in Receipt.objects.filter(effect_key="post:g1")]
print(json.dumps(report))
"""


def test_eager_reconcile_that_cannot_be_recorded_still_leaves_the_receipt(tmp_path, scratch_postgres):
    """The store drops while the eager hook answers: the call still gets its ambiguous receipt, and the caller
    its function's own exception, not the store's."""
    result = _standalone(tmp_path, EAGER_FAULT, scratch_postgres, CTRLRUN_STORE_URL=scratch_postgres)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"raised": "TimeoutError", "state": "ambiguous", "receipts": ["ambiguous"]}
