"""At-most-once and the evidence, attacked rather than merely crashed (issue 8).

- a worker frozen with SIGSTOP past its lease, and a slow but live worker (real OS processes);
- evidence rewritten with plain SQL while the database's guard is in place (what anyone holding the
  application's database credentials can do), and with the guard lifted (the database's owner);
- SQLite's REPLACE / UPSERT forms, which delete without firing DELETE triggers.

Everything runs on the suite's database (SQLite, then PostgreSQL in CI's second pass). The
PostgreSQL-only attacks (a real application role without trigger rights, a host whose clock is
ten minutes off) are in test_application_role.py.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import DatabaseError, connection

import ctrlrun
from ctrlrun import reconcile, store
from ctrlrun.models import Approval, ChainHead, EffectRecord, Event, Receipt
from tests.support import LEDGER_POLICY, evidence_unguarded, receipts, script_environment
from tests.support import execute_sql as _execute

pytestmark = pytest.mark.usefixtures("store_db")


class TokenRemote:
    """A stand-in remote that dedupes on the idempotency token, as Stripe does: a request whose token it
    has seen is a replay of the first, not a second effect. It lives in a file, so OS processes share it."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "remote.log"

    def requests(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def effects(self) -> int:
        return len({token for token, _ in self.requests()})

    def has(self, entry_id: str) -> bool:
        return any(entry == entry_id for _, entry in self.requests())


REMOTE_SOURCE = """
import json, pathlib
def remote(folder, token, entry_id):
    with open(pathlib.Path(folder) / "remote.log", "a") as log:
        log.write(json.dumps([token, entry_id]) + "\\n")
"""

FROZEN = REMOTE_SOURCE + """
import datetime as dt, logging, sys, time, pathlib
import ctrlrun
logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
folder = pathlib.Path(sys.argv[1])

@ctrlrun.protect("ledger.post", effect="post:{entry_id}", lease=dt.timedelta(seconds=float(sys.argv[2])))
def post(entry_id: str) -> str:
    (folder / "inside").touch()
    while not (folder / "go").exists():      # the worker is about to call the remote...
        time.sleep(0.02)
    remote(folder, ctrlrun.idempotency_token(), entry_id)
    return "posted"

with ctrlrun.context(agent="frozen-worker"):
    try:
        print("returned", post(entry_id="e1"))
    except ctrlrun.AmbiguousEffect as exc:
        print("ambiguous", exc)
"""


def _start(tmp_path: Path, source: str, *args: str) -> subprocess.Popen:
    env = script_environment(tmp_path, LEDGER_POLICY)
    (tmp_path / "worker.py").write_text(source)
    return subprocess.Popen([sys.executable, "worker.py", str(tmp_path), *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, process: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"the worker exited early: {process.communicate()}")
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.02)


def _protected_post(remote_folder: Path, hook=None):
    @ctrlrun.protect("ledger.post", effect="post:{entry_id}", reconcile=hook)
    def post(entry_id: str) -> str:
        with open(remote_folder / "remote.log", "a") as log:
            log.write(json.dumps([ctrlrun.idempotency_token(), entry_id]) + "\n")
        return "posted by the retry"

    return post


# --------------------------------------------------------------------------- a worker alive past its lease


def test_worker_frozen_past_its_lease_replays_the_retry_at_a_deduping_remote(tmp_path, use_policy, hook_registry):
    """SIGSTOP inside the function past the lease: the sweep, a truthful not_executed and the retry run, and
    the woken worker's late call carries the same idempotency token, so the remote sees one effect."""
    use_policy(LEDGER_POLICY)
    remote = TokenRemote(tmp_path)
    worker = _start(tmp_path, FROZEN, "1.5")
    try:
        _wait_for(tmp_path / "inside", worker)
        os.kill(worker.pid, signal.SIGSTOP)                    # a VM pause, a long GC, a stopped container
        time.sleep(2.5)                                        # its lease lapses: nobody renews it now

        post = _protected_post(tmp_path, hook=lambda key: "committed" if remote.has(key[5:]) else "not_executed")
        with ctrlrun.context(agent="retrying-agent"):
            report = reconcile.run_once()                      # swept, then the hook answers truthfully
            assert [e.effect_key for e in report.swept] == ["post:e1"]
            assert [(line.effect_key, line.outcome) for line in report.lines] == [("post:e1", "failed")]
            assert post(entry_id="e1") == "posted by the retry"  # attempt 2 runs: the remote had nothing

        os.kill(worker.pid, signal.SIGCONT)
        time.sleep(1.0)                                        # its heartbeat wakes first and finds it moved
        (tmp_path / "go").touch()                              # ...then the woken function calls the remote
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
    assert out.startswith("ambiguous"), out + err              # never reported as success
    assert "renewal stops" in err                              # the heartbeat noticed and said so
    tokens = [token for token, _ in remote.requests()]
    assert len(tokens) == 2 and tokens[0] == tokens[1]         # two requests, one token: a replay
    assert remote.effects() == 1
    record = EffectRecord.objects.get(pk="post:e1")
    assert (record.state, record.attempt) == ("committed", 2)
    results = [(d["attempt"], d["result"]) for d in receipts() if d["effect_key"] == "post:e1"]
    assert results == [(1, "ambiguous"), (2, "committed"), (1, "ambiguous")]  # swept, retried, the late outcome


SLOW = REMOTE_SOURCE + """
import datetime as dt, sys, time, pathlib
import ctrlrun
folder = pathlib.Path(sys.argv[1])

@ctrlrun.protect("ledger.post", effect="post:{entry_id}", lease=dt.timedelta(seconds=1))
def post(entry_id: str) -> str:
    (folder / "inside").touch()
    time.sleep(4)                             # four leases long, and alive all along
    remote(folder, ctrlrun.idempotency_token(), entry_id)
    return "posted"

with ctrlrun.context(agent="slow-worker"):
    print(post(entry_id="slow"))
"""


def test_a_slow_live_call_is_never_swept(tmp_path, use_policy, hook_registry):
    """A function running four times its lease keeps it: sweeps and contenders meet a live lease throughout."""
    use_policy(LEDGER_POLICY)
    worker = _start(tmp_path, SLOW)
    post = _protected_post(tmp_path, hook=lambda key: "not_executed")
    refusals = []
    try:
        _wait_for(tmp_path / "inside", worker)
        with ctrlrun.context(agent="impatient-agent"):
            while worker.poll() is None:
                assert reconcile.run_once().swept == []
                try:
                    post(entry_id="slow")
                except ctrlrun.DuplicateEffect as exc:
                    refusals.append(exc.state)
                time.sleep(0.25)
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert out.strip() == "posted", err
    while refusals and refusals[-1] == "committed":  # the worker finished between two looks
        refusals.pop()
    assert len(refusals) >= 5 and set(refusals) == {"in_progress"}
    assert TokenRemote(tmp_path).effects() == 1
    assert EffectRecord.objects.get(pk="post:slow").state == "committed"


def test_renewal_runs_while_the_function_runs_and_stops_when_it_returns(agent, monkeypatch):
    """The heartbeat renews a short lease during a long call, from the store's clock, and never after it."""
    renewals: list[str] = []
    real_renew = store.renew_lease

    def counted(call, attempt, lease):
        renewals.append(call.effect_key)
        return real_renew(call, attempt, lease)

    monkeypatch.setattr(store, "renew_lease", counted)
    leases: list[dt.datetime] = []

    @ctrlrun.protect("email.send", effect="email:{msg_id}", lease=dt.timedelta(seconds=0.3))
    def send(msg_id: str) -> str:
        for _ in range(6):
            time.sleep(0.2)
            leases.append(EffectRecord.objects.get(pk=f"email:{msg_id}").lease_expires_at)
        return "sent"

    assert send(msg_id="long") == "sent"
    during = len(renewals)
    assert during >= 3 and set(renewals) == {"email:long"}
    assert leases == sorted(leases) and leases[-1] > leases[0]  # each renewal pushed the lease forward
    time.sleep(1.0)
    assert len(renewals) == during                         # nothing renews a finished call
    record = EffectRecord.objects.get(pk="email:long")
    assert (record.state, record.lease_expires_at) == ("committed", None)


def test_dead_workers_sweep_writes_its_ambiguous_receipt(agent, clock, hook_registry):
    """A held record whose worker never came back: the sweep writes the attempt's opening events and receipt."""
    from tests.support import hold_key

    held = hold_key("refund:txn_dead")
    assert not Receipt.objects.filter(effect_key="refund:txn_dead").exists()
    clock.advance(minutes=6)
    [swept] = reconcile.run_once().swept
    assert swept.effect_key == "refund:txn_dead" and swept.state == "ambiguous"
    [doc] = [d for d in receipts() if d["effect_key"] == "refund:txn_dead"]
    assert (doc["result"], doc["attempt"], doc["action_id"]) == ("ambiguous", 1, held.call.action.action_id)
    assert doc["error"].startswith("lease expired")
    assert [e.type for e in store.events_for_action(held.call.action.action_id)] == [
        "ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED", "EXECUTION_STARTED", "EXECUTION_AMBIGUOUS"]
    assert store.verify().ok


# --------------------------------------------------------------------------- the evidence under plain SQL

def _mixed_calls(refund, remote) -> None:
    """A few calls of every kind: committed, denied, refused, ambiguous, an approval request."""
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="a1", amount=100)
        with pytest.raises(ctrlrun.ActionDenied):
            refund(payment_id="a2", amount=10**9)
        with pytest.raises(ctrlrun.DuplicateEffect):
            refund(payment_id="a1", amount=100)
        remote.fail_with = TimeoutError("read timed out")
        with pytest.raises(TimeoutError):
            refund(payment_id="a3", amount=300)
        remote.fail_with = None
        with pytest.raises(ctrlrun.ApprovalRequired):
            refund(payment_id="a4", amount=500000)


def _unguarded(statement: str, params: tuple = ()) -> None:
    """As the database's owner could: with the guard lifted."""
    with evidence_unguarded():
        _execute(statement, params)


def _breaks(kind: str | None = None) -> list[tuple[str, str, int | str | None]]:
    report = store.verify()
    return [(b.name, b.kind, b.seq if b.kind in ("receipt", "event", "head") else b.subject) for b in report.breaks
            if kind is None or b.kind == kind]


def _sha(document: dict) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _event_hash(row: dict, seq: int, prev: str) -> str:
    """An event's chain hash, computed here from its definition (ctrlrun.event/v1) rather than by ctrlrun."""
    ts = row["ts"].astimezone(dt.timezone.utc).isoformat(timespec="microseconds")
    document = ["ctrlrun.event/v1", seq, prev, ts, row["type"], row["action_id"], row["effect_key"],
                row["approval_id"], row["data"]]
    text = json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_a_forged_approval_granted_event_is_named(refund, remote):
    """An APPROVAL_GRANTED row inserted by hand, even hashed and linked at the head, is named by verify."""
    _mixed_calls(refund, remote)
    request = Approval.objects.get()
    head = ChainHead.objects.get()
    forged = {"ts": dt.datetime.now(dt.timezone.utc), "type": "APPROVAL_GRANTED", "action_id": request.action_id,
              "effect_key": request.effect_key, "approval_id": request.approval_id,
              "data": json.dumps({"approver": "cfo", "action_hash": request.action_hash})}
    digest = _event_hash(forged, head.event_seq + 1, head.event_hash)
    _execute('INSERT INTO "ctrlrun_event" ("ts","type","action_id","effect_key","approval_id","data","seq",'
             '"prev_hash","hash") VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)',
             (connection.ops.adapt_datetimefield_value(forged["ts"]), forged["type"], forged["action_id"],
              forged["effect_key"], forged["approval_id"], forged["data"], head.event_seq + 1,
              head.event_hash, digest))
    assert ("head_mismatch", "event", head.event_seq) in _breaks()     # beyond the head it leaves behind
    _execute('UPDATE "ctrlrun_chainhead" SET "event_seq" = %s, "event_hash" = %s', (head.event_seq + 1, digest))
    assert _breaks() == [("signature_invalid", "head", head.seq),    # ...and moving the head is unsigned,
                         ("rewound", "approval", request.approval_id)]  # and the request never was granted
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.StoreUnavailable, match="refuses to act"):
        refund(payment_id="a9", amount=100)                            # nothing acts on a forged head
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.StoreUnavailable, match="refuses to add"):
        refund(payment_id="a2", amount=10**9)                          # nor is any evidence added to it
    assert ("a9", 100) not in remote.calls and not EffectRecord.objects.filter(pk="refund:a9").exists()


def test_an_unchained_forged_event_is_named(refund, remote):
    """A forged event without chain fields is named unchained."""
    _mixed_calls(refund, remote)
    _execute('INSERT INTO "ctrlrun_event" ("ts","type","action_id","data") VALUES (%s,%s,%s,%s)',
             (connection.ops.adapt_datetimefield_value(dt.datetime.now(dt.timezone.utc)), "APPROVAL_GRANTED",
              "act_" + "0" * 32, "{}"))
    assert _breaks() == [("unchained", "event", None)]


@pytest.mark.parametrize("column, value", [("type", "APPROVAL_GRANTED"), ("action_id", "act_" + "1" * 32),
                                           ("data", '{"approver":"cfo"}'), ("effect_key", "refund:zz")])
def test_an_edited_event_is_content_altered(refund, remote, column, value):
    """Any column of an event edited with the guard lifted is content_altered at its seq."""
    _mixed_calls(refund, remote)
    target = Event.objects.order_by("seq")[3]
    _unguarded(f'UPDATE "ctrlrun_event" SET "{column}" = %s WHERE "id" = %s', (value, target.id))
    assert _breaks() == [("content_altered", "event", target.seq), ("link_broken", "event", target.seq + 1)]


def test_an_edited_event_time_is_content_altered(refund, remote):
    """Moving an event's time, even by a microsecond, is named."""
    _mixed_calls(refund, remote)
    target = Event.objects.order_by("seq")[2]
    moved = connection.ops.adapt_datetimefield_value(target.ts + dt.timedelta(microseconds=1))
    _unguarded('UPDATE "ctrlrun_event" SET "ts" = %s WHERE "id" = %s', (moved, target.id))
    assert _breaks() == [("content_altered", "event", target.seq), ("link_broken", "event", target.seq + 1)]


def test_a_removed_event_is_named(refund, remote):
    """A deleted event is missing at its seq (the next no longer links); the last one is a head mismatch."""
    _mixed_calls(refund, remote)
    events = list(Event.objects.order_by("seq"))
    _unguarded('DELETE FROM "ctrlrun_event" WHERE "id" = %s', (events[4].id,))
    assert _breaks() == [("missing", "event", events[4].seq), ("link_broken", "event", events[5].seq)]
    _unguarded('DELETE FROM "ctrlrun_event" WHERE "id" = %s', (events[-1].id,))
    assert ("head_mismatch", "event", events[-1].seq) in _breaks()


def test_a_copied_event_is_refused_or_named(refund, remote):
    """A valid event copied under a new id (same seq, same hash): the database refuses it; with its guard
    lifted and the seq moved past the head, it is named and no call acts on top of it."""
    _mixed_calls(refund, remote)
    original = Event.objects.order_by("seq")[2]
    copy = ('INSERT INTO "ctrlrun_event" ("ts","type","action_id","effect_key","approval_id","data","seq","prev_hash",'
            '"hash") SELECT "ts","type","action_id","effect_key","approval_id","data",{seq},"prev_hash","hash" FROM '
            '"ctrlrun_event" WHERE "id" = %s')
    with pytest.raises(DatabaseError):
        _execute(copy.format(seq='"seq"'), (original.id,))
    assert store.verify().ok
    beyond = ChainHead.objects.get().event_seq + 1
    _execute(copy.format(seq=str(beyond)), (original.id,))  # a plain INSERT: the application role may
    assert ("head_mismatch", "event", beyond - 1) in _breaks()
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.StoreUnavailable, match="past the chain head"):
        refund(payment_id="a9", amount=100)
    assert ("a9", 100) not in remote.calls


def test_reordered_events_are_named(refund, remote):
    """Two events swapped in the order people read them (their ids) are named reordered."""
    _mixed_calls(refund, remote)
    first, second = Event.objects.order_by("seq")[1:3]
    _unguarded('UPDATE "ctrlrun_event" SET "id" = -1 WHERE "id" = %s', (first.id,))
    _unguarded('UPDATE "ctrlrun_event" SET "id" = %s WHERE "id" = %s', (first.id, second.id))
    _unguarded('UPDATE "ctrlrun_event" SET "id" = %s WHERE "id" = -1', (second.id,))
    assert ("reordered", "event", second.seq) in _breaks()


@pytest.mark.parametrize("column, value", [
    ("ts", dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)),
    ("agent", "somebody-else"), ("effect_key", "refund:zz"), ("result", "committed"), ("action", "noop")])
def test_every_receipt_column_the_console_shows_is_checked(refund, remote, column, value):
    """A receipt's time (what lists, filters and the date hierarchy read) and each index column are checked."""
    _mixed_calls(refund, remote)
    target = Receipt.objects.order_by("seq")[1]
    if isinstance(value, dt.datetime):
        value = connection.ops.adapt_datetimefield_value(value)
    _unguarded(f'UPDATE "ctrlrun_receipt" SET "{column}" = %s WHERE "receipt_id" = %s', (value, target.receipt_id))
    assert _breaks() == [("content_altered", "receipt", target.seq)]


def test_a_forged_receipt_at_the_head_is_named(refund, remote):
    """A well-formed receipt appended after the last one and the head moved over it: the head's signature fails."""
    _mixed_calls(refund, remote)
    last = Receipt.objects.order_by("-seq").first()
    doc = json.loads(last.document)
    doc.update(receipt_id="ctr_" + "f" * 32, result="committed", seq=last.seq + 1, prev_hash=last.hash, error=None)
    digest = _sha(doc)
    _execute('INSERT INTO "ctrlrun_receipt" ("receipt_id","seq","action_id","action","agent","decision","result",'
             '"effect_key","ts","document","prev_hash","hash") SELECT %s,%s,"action_id","action","agent","decision",'
             '%s,"effect_key","ts",%s,%s,%s FROM "ctrlrun_receipt" WHERE "receipt_id" = %s',
             (doc["receipt_id"], doc["seq"], "committed", json.dumps(doc, separators=(",", ":")), last.hash, digest,
              last.receipt_id))
    _execute('UPDATE "ctrlrun_chainhead" SET "seq" = %s, "hash" = %s', (doc["seq"], digest))
    assert _breaks() == [("signature_invalid", "head", doc["seq"])]


def test_a_rewound_head_is_refused_by_the_database(refund, remote):
    """The head only moves forward: moving it back to hide the newest evidence is refused."""
    _mixed_calls(refund, remote)
    with pytest.raises(DatabaseError, match="only moves forward"):
        _execute('UPDATE "ctrlrun_chainhead" SET "seq" = "seq" - 1')
    with pytest.raises(DatabaseError, match="never deleted"):
        _execute('DELETE FROM "ctrlrun_chainhead"')
    assert store.verify().ok


def test_a_deleted_head_is_not_silently_restarted(refund, remote):
    """The owner deletes the head row to hide the chain's end: the next writer refuses to start a new one
    over the evidence, and the call does not run."""
    _mixed_calls(refund, remote)
    _unguarded('DELETE FROM "ctrlrun_chainhead"')
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.StoreUnavailable, match="head row is missing"):
        refund(payment_id="a2", amount=10**9)  # a denial: evidence only
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.StoreUnavailable, match="head row is missing"):
        refund(payment_id="a9", amount=100)    # an allowed call: it does not act
    assert ("a9", 100) not in remote.calls and not ChainHead.objects.exists()


# --------------------------------------------------------------------------- signed rows and the state table


def test_a_granted_status_set_by_hand_is_refused_at_use(refund, remote):
    """An approval set granted 'by cfo' with SQL: the refund does not run, and verify names the row."""
    with ctrlrun.context(agent="support-agent"):
        with pytest.raises(ctrlrun.ApprovalRequired) as asked:
            refund(payment_id="big", amount=900000)
    request_id = asked.value.request_id
    _execute('UPDATE "ctrlrun_approval" SET "status" = %s, "approver" = %s, "answered_at" = "created_at" '
             'WHERE "approval_id" = %s', ("granted", "cfo", request_id))
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
            refund(payment_id="big", amount=900000)
    assert refused.value.reason == "tampered" and remote.calls == []
    assert not Event.objects.filter(type="APPROVAL_GRANTED").exists()
    assert receipts()[-1]["result"] == "blocked"
    assert ("signature_invalid", "approval", request_id) in _breaks()
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="cannot be answered"):
        call_command("approve", request_id, "--by", "dana", stdout=open(os.devnull, "w"))


def test_a_committed_record_never_moves_again(refund, remote):
    """Setting a committed record back to failed (or deleting it) is refused by the database; its key stays closed."""
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="once", amount=100)
    for statement in ('UPDATE "ctrlrun_effectrecord" SET "state" = \'failed\' WHERE "effect_key" = %s',
                      'UPDATE "ctrlrun_effectrecord" SET "state" = \'ambiguous\' WHERE "effect_key" = %s',
                      'UPDATE "ctrlrun_effectrecord" SET "effect_key" = \'refund:other\' WHERE "effect_key" = %s',
                      'DELETE FROM "ctrlrun_effectrecord" WHERE "effect_key" = %s'):
        with pytest.raises(DatabaseError, match="state table|never deleted"):
            _execute(statement, ("refund:once",))
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.DuplicateEffect):
        refund(payment_id="once", amount=100)
    assert remote.calls == [("once", 100)]


def test_a_forged_resolution_does_not_reopen_the_key(refund, remote):
    """An ambiguous record set failed 'by alice' with SQL (an allowed edge): the retry is refused, nothing runs."""
    with ctrlrun.context(agent="support-agent"):
        remote.fail_with = TimeoutError("read timed out")
        with pytest.raises(TimeoutError):
            refund(payment_id="amb", amount=100)
        remote.fail_with = None
    _execute('UPDATE "ctrlrun_effectrecord" SET "state" = \'failed\', "resolved_by" = \'alice\' '
             'WHERE "effect_key" = %s', ("refund:amb",))
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.AmbiguousEffect, match="signature"):
        refund(payment_id="amb", amount=100)
    assert remote.calls == [("amb", 100)]
    assert ("signature_invalid", "effect", "refund:amb") in _breaks()


def test_a_live_lease_moved_into_the_past_is_refused_or_not_swept(refund, remote, hook_registry):
    """A holder's lease moved into the past: the database refuses it; with its guard lifted, contenders and
    the sweeper refuse the row (its signature fails) and never lapse it."""
    from tests.support import hold_key

    hold_key("refund:live")
    past = connection.ops.adapt_datetimefield_value(dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc))
    move = ('UPDATE "ctrlrun_effectrecord" SET "lease_expires_at" = %s WHERE "effect_key" = %s', (past, "refund:live"))
    with pytest.raises(DatabaseError, match="state table"):
        _execute(*move)
    _unguarded(*move)
    assert reconcile.run_once().swept == []
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.AmbiguousEffect, match="signature"):
        refund(payment_id="live", amount=100)
    assert EffectRecord.objects.get(pk="refund:live").state == "executing" and remote.calls == []


def test_an_older_signed_lease_put_back_is_refused(agent, clock):
    """The lease and signature a live holder had before its renewal, written back: the database refuses it
    (a lease only moves later), so nobody can make a renewed worker look lapsed."""
    from tests.support import hold_key

    held = hold_key("refund:renewed", minutes=0.5)
    before = EffectRecord.objects.get(pk="refund:renewed")
    clock.advance(seconds=10)
    assert store.renew_lease(held.call, held.attempt, dt.timedelta(seconds=30))
    with pytest.raises(DatabaseError, match="state table"):
        _execute('UPDATE "ctrlrun_effectrecord" SET "lease_expires_at" = %s, "mac" = %s WHERE "effect_key" = %s',
                 (connection.ops.adapt_datetimefield_value(before.lease_expires_at), before.mac, "refund:renewed"))
    clock.advance(seconds=25)  # past the old lease, inside the renewed one
    assert reconcile.run_once().swept == []


def test_a_reconcile_hook_is_chosen_by_the_signed_action(refund, remote, hook_registry):
    """A record's action renamed by hand (to ask another action's hook, which would truthfully say
    not_executed): the database refuses it; with the guard lifted the signature fails and no answer applies."""
    _mixed_calls(refund, remote)  # refund:a3 is ambiguous
    rename = ('UPDATE "ctrlrun_effectrecord" SET "action" = %s WHERE "effect_key" = %s', ("email.send", "refund:a3"))
    with pytest.raises(DatabaseError, match="state table"):
        _execute(*rename)
    _unguarded(*rename)
    hook_registry["email.send"] = lambda key: "not_executed"
    assert [(line.effect_key, line.outcome) for line in reconcile.run_once().lines] == [("refund:a3", "dropped")]
    assert EffectRecord.objects.get(pk="refund:a3").state == "ambiguous"
    assert ("signature_invalid", "effect", "refund:a3") in _breaks()


def test_an_older_signed_record_put_back_is_named_and_not_retried(refund, remote):
    """With the guard lifted, a key's failed attempt-1 row put back after attempt 2 committed: its signature is
    genuine, but verify names it out of step with the chain, and the retry it would license is refused."""
    with ctrlrun.context(agent="support-agent"):
        remote.fail_with = ctrlrun.NotExecuted("connection refused")
        with pytest.raises(ctrlrun.NotExecuted):
            refund(payment_id="again", amount=100)
        remote.fail_with = None
        failed = {f: getattr(EffectRecord.objects.get(pk="refund:again"), f) for f in (
            "state", "action_id", "attempt", "error", "resolved_by", "mac", "updated_at")}
        refund(payment_id="again", amount=100)  # attempt 2 commits
    columns = ", ".join(f'"{f}" = %s' for f in failed)
    _unguarded(f'UPDATE "ctrlrun_effectrecord" SET {columns} WHERE "effect_key" = %s',
               (*[connection.ops.adapt_datetimefield_value(v) if isinstance(v, dt.datetime) else v
                  for v in failed.values()], "refund:again"))
    assert ("rewound", "effect", "refund:again") in _breaks()
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.AmbiguousEffect, match="out of date"):
        refund(payment_id="again", amount=100)
    assert remote.calls == [("again", 100), ("again", 100)]  # the failed attempt, then the one that committed


def test_a_record_inserted_by_hand_must_start_executing(agent):
    """An effect record can only be created executing at attempt 1: a pre-made 'failed' row is refused."""
    now = connection.ops.adapt_datetimefield_value(dt.datetime.now(dt.timezone.utc))
    with pytest.raises(DatabaseError, match="starts executing"):
        _execute('INSERT INTO "ctrlrun_effectrecord" ("effect_key","action","state","action_id","attempt",'
                 '"reconcile_failures","created_at","updated_at") VALUES (%s,%s,%s,%s,%s,0,%s,%s)',
                 ("refund:pre", "stripe.refund", "failed", "act_" + "2" * 32, 3, now, now))


def test_a_consumed_approval_put_back_to_granted_is_named(refund, remote):
    """With the guard lifted, a consumed approval's signed granted row put back: verify names it rewound."""
    from django.core.management import call_command

    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as asked:
        refund(payment_id="once", amount=500000)
    request_id = asked.value.request_id
    call_command("approve", request_id, "--by", "dana", stdout=open(os.devnull, "w"))
    granted = {f: getattr(Approval.objects.get(pk=request_id), f) for f in (
        "status", "consumed_at", "consumed_by", "mac")}
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id):
        refund(payment_id="once", amount=500000)
    columns = ", ".join(f'"{f}" = %s' for f in granted)
    _unguarded(f'UPDATE "ctrlrun_approval" SET {columns} WHERE "approval_id" = %s', (*granted.values(), request_id))
    assert _breaks() == [("rewound", "approval", request_id)]


@pytest.mark.parametrize("table", ["ctrlrun_event", "ctrlrun_receipt"])
def test_an_impossible_time_is_a_named_break_not_a_crash(refund, remote, table):
    """A row whose time cannot be read (2026-99-99) is named by verify, never a traceback."""
    if connection.vendor != "sqlite":  # PostgreSQL cannot store an impossible timestamp at all
        with pytest.raises(DatabaseError):
            _unguarded(f'UPDATE "{table}" SET "ts" = %s', ("2026-99-99 00:00:00",))
        return
    _mixed_calls(refund, remote)
    _unguarded(f'UPDATE "{table}" SET "ts" = %s WHERE "seq" = 1', ("2026-99-99 00:00:00",))
    kind = "event" if table == "ctrlrun_event" else "receipt"
    assert ("content_altered", kind, 1) in _breaks()


def test_unreadable_event_data_is_shown_for_what_it_is(refund, remote):
    """An event whose data is not JSON: inspect and the effect's events show it as unreadable, verify names it."""
    from django.core.management import call_command

    _mixed_calls(refund, remote)
    target = Event.objects.filter(effect_key="refund:a1").order_by("seq").first()
    _unguarded('UPDATE "ctrlrun_event" SET "data" = %s WHERE "id" = %s', ("{not json", target.id))
    shown = [e.data for e in store.events_for_effect("refund:a1") if e.id == target.id]
    assert shown == [{"unreadable": "{not json"}]
    call_command("inspect", target.action_id, stdout=open(os.devnull, "w"))
    assert ("content_altered", "event", target.seq) in _breaks()


# --------------------------------------------------------------------------- REPLACE, UPSERT and friends

REPLACEMENTS = {
    "ctrlrun_receipt": ("receipt_id", "result", "'committed'"),
    "ctrlrun_event": ("id", "type", "'APPROVAL_GRANTED'"),
    "ctrlrun_effectrecord": ("effect_key", "state", "'failed'"),
    "ctrlrun_approval": ("approval_id", "status", "'granted'"),
    "ctrlrun_chainhead": ("id", "seq", "0"),
}


def _copy_columns(table: str) -> list[str]:
    with connection.cursor() as cursor:
        return [c.name for c in connection.introspection.get_table_description(cursor, table)]


def _snapshot() -> dict[str, list]:
    out = {}
    with connection.cursor() as cursor:
        for table in REPLACEMENTS:
            cursor.execute(f'SELECT * FROM "{table}" ORDER BY 1')
            out[table] = cursor.fetchall()
    return out


def _rewrite(form: str, table: str) -> str:
    """A statement of ``form`` that would overwrite ``table``'s first row with a changed column."""
    key, column, value = REPLACEMENTS[table]
    columns = _copy_columns(table)
    quoted = ",".join(f'"{c}"' for c in columns)
    changed = ",".join(value if c == column else f'"{c}"' for c in columns)
    first = f'(SELECT "{key}" FROM "{table}" ORDER BY 1 LIMIT 1)'
    select = f'SELECT {changed} FROM "{table}" WHERE "{key}" = {first}'
    if form == "REPLACE INTO":
        return f'REPLACE INTO "{table}" ({quoted}) {select}'
    if form == "INSERT OR REPLACE":
        return f'INSERT OR REPLACE INTO "{table}" ({quoted}) {select}'
    if form == "UPSERT DO UPDATE":
        return (f'INSERT INTO "{table}" ({quoted}) {select} ON CONFLICT ("{key}") DO UPDATE SET '
                f'"{column}" = excluded."{column}"')
    if form == "UPDATE OR REPLACE":
        return f'UPDATE OR REPLACE "{table}" SET "{column}" = {value} WHERE "{key}" = {first}'
    raise AssertionError(form)


SQLITE_ONLY = {"REPLACE INTO", "INSERT OR REPLACE", "UPDATE OR REPLACE"}


@pytest.mark.parametrize("table", list(REPLACEMENTS))
@pytest.mark.parametrize("form", ["REPLACE INTO", "INSERT OR REPLACE", "UPSERT DO UPDATE", "UPDATE OR REPLACE"])
def test_no_statement_form_rewrites_a_guarded_row(refund, remote, form, table):
    """REPLACE, INSERT OR REPLACE, UPSERT's DO UPDATE and UPDATE OR REPLACE change no guarded row."""
    if form in SQLITE_ONLY and connection.vendor != "sqlite":
        form = "UPSERT DO UPDATE"  # PostgreSQL has no REPLACE: its one rewriting insert is the upsert
    _mixed_calls(refund, remote)
    before = _snapshot()
    try:
        _execute(_rewrite(form, table))  # refused outright, or (effect records, the head) an insert that does nothing
    except DatabaseError:
        pass
    assert _snapshot() == before
    assert store.verify().ok
