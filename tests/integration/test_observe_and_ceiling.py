"""Observe mode (policy v3 ``mode: observe``) and the attempt ceiling (v5 ``max_attempts``), on the
real store, through both drivers (``Control.call`` and ``await Control.acall``): they are decision
points of the one pipeline, so each test runs twice.

Observe mode: every call runs; nothing is refused; nobody is asked; each receipt says ``observed``
with ``execution`` (what happened) and ``would_have`` (what enforcement would have done, the
earliest decision point that would have refused it). The ceiling: attempt N+1 of a key that failed
N = max_attempts times is refused with its own event and a blocked receipt, the row left as it was.
"""
from __future__ import annotations

import asyncio
import json
import gc
import logging

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.models import Approval, EffectRecord, Event
from ctrlrun.policy import parse_policy
from tests.support import Hook, events, hold_key, receipts

pytestmark = pytest.mark.usefixtures("store_db")

RULES = """\
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    max_attempts: 2
    rules:
      - when: {amount_lte: 50000}
        decision: allow
      - when: {amount_lte: 1000000}
        decision: approve
      - decision: deny
  iam.grant_admin:
    decision: deny
  audit.note:
    decision: allow
    max_attempts: 1
  db.migrate:
    rules:
      - when: {env_eq: staging}
        decision: allow
"""
OBSERVE = "schema: ctrlrun.policy/v5\nmode: observe\n" + RULES
ENFORCE = "schema: ctrlrun.policy/v5\n" + RULES


class Remote:
    """Counts what reached it; raises ``fail`` (once per call) when told to."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: BaseException | None = None

    def act(self, what: str):
        def executor():
            self.calls.append(what)
            if self.fail is not None:
                raise self.fail
            return {"done": what}
        return executor


@pytest.fixture(params=["sync", "async"])
def drive(request):
    """Call ``control`` for ``name`` with ``arguments`` through one of the two drivers."""

    def call(control: Control, name: str, arguments: dict, executor, **options):
        if request.param == "sync":
            return control.call(name, arguments, executor, principal="support-agent", **options)

        async def awaited():
            return executor()

        return asyncio.run(control.acall(name, arguments, awaited, principal="support-agent", **options))

    call.kind = request.param
    return call


@pytest.fixture
def observe():
    return Control(policy=parse_policy(OBSERVE))


@pytest.fixture
def enforce():
    return Control(policy=parse_policy(ENFORCE))


def refund(payment_id: str, amount: int = 100) -> dict:
    return {"payment_id": payment_id, "amount": amount}


def last_receipt() -> dict:
    return receipts()[-1]


def fail(control: Control, drive, remote: Remote, *, times: int) -> None:
    """``times`` calls for refund:txn_1 that fail without acting (NotExecuted); the remote keeps failing."""
    remote.fail = ctrlrun.NotExecuted("down")
    for _ in range(times):
        with pytest.raises(ctrlrun.NotExecuted):
            drive(control, "stripe.refund", refund("txn_1"), remote.act("try"))


def would_have(receipt: dict) -> tuple:
    return (receipt["result"], receipt["execution"], receipt["would_have"]["decision"],
            receipt["would_have"]["reason"], receipt["would_have"]["blocked_reason"])


# --------------------------------------------------------------------------- observe mode


def test_observe_runs_every_call_and_records_what_would_have_happened(observe, drive):
    remote = Remote()
    drive(observe, "stripe.refund", refund("txn_1"), remote.act("allowed"))
    drive(observe, "stripe.refund", refund("txn_1"), remote.act("duplicate"))
    drive(observe, "stripe.refund", refund("txn_2", 90000), remote.act("approve band"))
    drive(observe, "stripe.refund", refund("txn_3", 10**9), remote.act("denied by rule"))
    drive(observe, "iam.grant_admin", {"user": "mallory"}, remote.act("bare deny"))
    drive(observe, "no.such.action", {}, remote.act("unknown action"))
    drive(observe, "db.migrate", {"env": "production"}, remote.act("no rule matched"))
    assert remote.calls == ["allowed", "duplicate", "approve band", "denied by rule", "bare deny", "unknown action",
                            "no rule matched"]
    assert [would_have(r) for r in receipts()] == [
        ("observed", "committed", "allow", "rule[0]", None),
        ("observed", "committed", "allow", "rule[0]", "duplicate"),
        ("observed", "committed", "approve", "rule[1]", "approval_required"),
        ("observed", "committed", "deny", "rule[2]", "rule[2]"),
        ("observed", "committed", "deny", "decision", "decision"),
        ("observed", "committed", "deny", "unknown_action", "unknown_action"),
        ("observed", "committed", "deny", "no_matching_rule", "no_matching_rule"),
    ]
    # Nobody was asked and nothing was denied.
    assert not Event.objects.filter(type__in=["ACTION_DENIED", "APPROVAL_REQUESTED"]).exists()
    assert not Approval.objects.exists()
    # The duplicate's refusal is recorded before it ran; the committed row was not touched.
    duplicate = receipts()[1]["action_id"]
    assert events(duplicate) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVATION_REFUSED",
                                   "EXECUTION_STARTED", "EXECUTION_COMMITTED"]
    refusal = Event.objects.get(action_id=duplicate, type="EFFECT_RESERVATION_REFUSED")
    assert refusal.data == {"reason": "duplicate", "state": "committed"}
    row = EffectRecord.objects.get(pk="refund:txn_1")
    assert (row.state, row.attempt, row.action_id) == ("committed", 1, receipts()[0]["action_id"])
    # Free keys were taken, so the records say what really happened.
    assert EffectRecord.objects.get(pk="refund:txn_3").state == "committed"
    assert store.verify().ok


def test_observe_over_an_ambiguous_key_runs_and_leaves_the_row(observe, drive):
    remote = Remote()
    remote.fail = TimeoutError("lost")
    with pytest.raises(TimeoutError):
        drive(observe, "stripe.refund", refund("txn_1"), remote.act("first"))
    remote.fail = None
    before = EffectRecord.objects.get(pk="refund:txn_1")
    assert drive(observe, "stripe.refund", refund("txn_1"), remote.act("retry")) == {"done": "retry"}
    after = EffectRecord.objects.get(pk="refund:txn_1")
    assert (after.state, after.attempt, after.action_id, after.updated_at) == (
        before.state, before.attempt, before.action_id, before.updated_at) and after.state == "ambiguous"
    first, retry = receipts()
    assert would_have(first) == ("observed", "ambiguous", "allow", "rule[0]", None)
    assert first["error"] == "TimeoutError: lost"
    assert would_have(retry) == ("observed", "committed", "allow", "rule[0]", "ambiguous")
    assert remote.calls == ["first", "retry"]


def test_observe_over_a_held_key_says_in_progress(observe, drive):
    hold_key("refund:txn_1")
    remote = Remote()
    drive(observe, "stripe.refund", refund("txn_1"), remote.act("runs anyway"))
    assert would_have(last_receipt())[4] == "in_progress"
    assert remote.calls == ["runs anyway"]
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "executing"  # still the other worker's


def test_observe_attempt_ceiling_and_its_precedence(observe, drive):
    remote = Remote()
    fail(observe, drive, remote, times=3)
    assert [would_have(r)[1:] for r in receipts()] == [
        ("failed", "allow", "rule[0]", None), ("failed", "allow", "rule[0]", None),
        ("failed", "allow", "rule[0]", "attempt_ceiling")]
    assert [r["attempt"] for r in receipts()] == [1, 2, 3]
    row = EffectRecord.objects.get(pk="refund:txn_1")
    assert (row.state, row.attempt) == ("failed", 2)  # the third ran, but the row is as the ceiling leaves it
    refusal = Event.objects.filter(type="EFFECT_RESERVATION_REFUSED").get()
    assert refusal.data == {"reason": "attempt_ceiling", "attempt": 3, "max_attempts": 2}
    # Ceiling (decision point 4) comes before the approval gate (7): the approve band says attempt_ceiling.
    with pytest.raises(ctrlrun.NotExecuted):
        drive(observe, "stripe.refund", refund("txn_1", 90000), remote.act("approve band"))
    assert would_have(last_receipt())[2:] == ("approve", "rule[1]", "attempt_ceiling")
    # The policy (3) before the ceiling (4).
    with pytest.raises(ctrlrun.NotExecuted):
        drive(observe, "stripe.refund", refund("txn_1", 10**9), remote.act("denied"))
    assert would_have(last_receipt())[2:] == ("deny", "rule[2]", "rule[2]")
    assert len(remote.calls) == 5


def granted_for(enforce: Control, drive, arguments: dict) -> str:
    """An approval granted for ``arguments`` (asked under the enforcing twin of the policy)."""
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        drive(enforce, "stripe.refund", arguments, lambda: None)
    store.answer_approval(asked.value.request_id, True, by="alice")
    return asked.value.request_id


def test_observe_presented_approvals(observe, enforce, drive):
    remote = Remote()
    good = granted_for(enforce, drive, refund("txn_1", 90000))
    with ctrlrun.with_approval(good):
        drive(observe, "stripe.refund", refund("txn_1", 90000), remote.act("approved"))
    assert would_have(last_receipt())[2:] == ("approve", "rule[1]", None)
    assert Approval.objects.get(pk=good).status == "consumed"
    # An approval for other arguments (one digit changed) would have been refused: mismatch, left as it is.
    other = granted_for(enforce, drive, refund("txn_2", 90000))
    with ctrlrun.with_approval(other):
        drive(observe, "stripe.refund", refund("txn_2", 90001), remote.act("changed digit"))
    assert would_have(last_receipt())[4] == "mismatch"
    assert Approval.objects.get(pk=other).status == "granted"
    with ctrlrun.with_approval("apr_does_not_exist"):
        drive(observe, "stripe.refund", refund("txn_3", 90000), remote.act("unknown approval"))
    assert would_have(last_receipt())[4] == "unknown"
    # Used once already: consumed.
    with ctrlrun.with_approval(good):
        drive(observe, "stripe.refund", refund("txn_4", 90000), remote.act("replayed"))
    assert would_have(last_receipt())[4] in ("mismatch",)  # another payment: another action hash
    with ctrlrun.with_approval(good):
        drive(observe, "stripe.refund", refund("txn_1", 90000), remote.act("replayed, same action"))
    # Same action hash, already consumed: the approval reason comes before the duplicate key (9 < 10).
    assert would_have(last_receipt())[4] == "consumed"
    # A person's denial.
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        drive(enforce, "stripe.refund", refund("txn_5", 90000), lambda: None)
    store.answer_approval(asked.value.request_id, False, by="bob")
    with ctrlrun.with_approval(asked.value.request_id):
        drive(observe, "stripe.refund", refund("txn_5", 90000), remote.act("denied by a person"))
    assert would_have(last_receipt())[4] == "approval_denied"
    assert len(remote.calls) == 6


def test_observe_wait_true_asks_nobody(observe, drive):
    remote = Remote()
    drive(observe, "stripe.refund", refund("txn_1", 90000), remote.act("ran"), wait=True)
    assert remote.calls == ["ran"] and not Approval.objects.exists()


def test_observe_eager_hook_runs_once_on_a_free_key_and_never_for_a_blocked_retry(observe, drive):
    hook = Hook("committed")
    remote = Remote()
    remote.fail = TimeoutError("lost")
    with pytest.raises(TimeoutError):
        drive(observe, "stripe.refund", refund("txn_1"), remote.act("first"), reconcile=hook,
              reconcile_eagerly=True)
    assert hook.asked == ["refund:txn_1"]
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "committed"
    assert would_have(receipts()[0])[:2] == ("observed", "ambiguous")
    # An ambiguous key met again: a blocking hook is not asked in observe mode.
    remote.fail = TimeoutError("lost again")
    with pytest.raises(TimeoutError):
        drive(observe, "stripe.refund", refund("txn_2"), remote.act("second"))
    remote.fail = None
    blocking = Hook("committed")
    drive(observe, "stripe.refund", refund("txn_2"), remote.act("retry"), reconcile=blocking)
    assert blocking.asked == []
    assert would_have(last_receipt())[4] == "ambiguous"
    assert EffectRecord.objects.get(pk="refund:txn_2").state == "ambiguous"


def test_switching_to_enforce_keeps_what_observe_recorded(observe, enforce, drive):
    """A key observe mode committed is a duplicate once the same rules are enforced."""
    remote = Remote()
    drive(observe, "stripe.refund", refund("txn_1"), remote.act("observed"))
    with pytest.raises(ctrlrun.DuplicateEffect):
        drive(enforce, "stripe.refund", refund("txn_1"), remote.act("enforced"))
    assert remote.calls == ["observed"]
    assert observe.policy_hash != enforce.policy_hash


def test_observe_runs_a_call_whose_effect_key_cannot_be_made_and_says_it_would_have_been_denied(observe, drive):
    """(bug) Observe mode refuses nothing and writes no ACTION_DENIED (docs/policy.md): a key template the
    call cannot fill is what enforcement denies (``effect_key_error``), so observe mode runs the call
    (with no key to take) and its receipt says so. It was refused and recorded ``denied``."""
    remote = Remote()
    assert drive(observe, "stripe.refund", {"amount": 100}, remote.act("no payment id"),
                 effect="refund:{nope}") == {"done": "no payment id"}
    assert remote.calls == ["no payment id"]
    (receipt,) = receipts()
    assert would_have(receipt) == ("observed", "committed", "deny", "effect_key_error", "effect_key_error")
    assert receipt["effect_key"] is None
    types = events(receipt["action_id"])
    assert "ACTION_DENIED" not in types and types[0] == "ACTION_PROPOSED" and types[-1] == "EXECUTION_COMMITTED"
    assert "POLICY_EVALUATED" not in types  # as enforced: the policy did not decide it
    assert not EffectRecord.objects.exists()
    assert store.verify().ok


@pytest.mark.parametrize("state", ["committed", "executing"])
def test_observe_says_what_enforcement_says_of_a_row_whose_signature_fails(observe, enforce, drive, state):
    """(bug) A committed or live-held row whose signature does not verify (altered around ctrlrun): enforcement
    refuses it as it refuses any committed or held key (``duplicate`` / ``in_progress``; the signature is
    read only before a retry or a sweep), so observe mode's would_have must say the same. It said
    ``ambiguous``, with an ``EFFECT_RESERVATION_REFUSED`` unlike enforcement's."""
    from django.db import connection

    from tests.support import evidence_unguarded, hold_key

    remote = Remote()
    if state == "committed":
        drive(enforce, "stripe.refund", refund("txn_1"), remote.act("first"))
    else:
        hold_key("refund:txn_1")
    with evidence_unguarded(), connection.cursor() as cursor:
        cursor.execute('UPDATE "ctrlrun_effectrecord" SET "mac" = %s WHERE "effect_key" = %s',
                       ("forged", "refund:txn_1"))
    with pytest.raises(ctrlrun.DuplicateEffect) as enforced:
        drive(enforce, "stripe.refund", refund("txn_1"), remote.act("enforced"))
    expected = "duplicate" if state == "committed" else "in_progress"
    assert enforced.value.state == ("committed" if state == "committed" else "in_progress")
    enforced_event = Event.objects.filter(type="EFFECT_RESERVATION_REFUSED").order_by("-id").first().data
    drive(observe, "stripe.refund", refund("txn_1"), remote.act("observed"))
    assert would_have(last_receipt())[4] == expected
    observed_event = Event.objects.filter(type="EFFECT_RESERVATION_REFUSED").order_by("-id").first().data
    assert observed_event == enforced_event
    assert EffectRecord.objects.get(pk="refund:txn_1").state == state


# --------------------------------------------------------------------------- the ceiling, enforced


def test_ceiling_refuses_past_max_attempts_and_leaves_the_row(enforce, drive):
    remote = Remote()
    fail(enforce, drive, remote, times=2)
    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(enforce, "stripe.refund", refund("txn_1"), remote.act("third"))
    assert refused.value.reason == "attempt_ceiling"
    assert "attempt 3" in str(refused.value) and "max_attempts is 2" in str(refused.value)
    assert remote.calls == ["try", "try"]
    last = last_receipt()
    assert (last["result"], last["decision"], last["decision_reason"], last["attempt"]) == (
        "blocked", "allow", "rule[0]", 3)
    row = EffectRecord.objects.get(pk="refund:txn_1")
    assert (row.state, row.attempt) == ("failed", 2)
    event = Event.objects.get(type="EFFECT_RESERVATION_REFUSED")
    assert event.data == {"reason": "attempt_ceiling", "attempt": 3, "max_attempts": 2}
    assert events(last["action_id"]) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVATION_REFUSED"]
    # Still refused the next time; other keys are unaffected.
    with pytest.raises(ctrlrun.ActionDenied):
        drive(enforce, "stripe.refund", refund("txn_1"), remote.act("fourth"))
    remote.fail = None
    drive(enforce, "stripe.refund", refund("txn_2"), remote.act("other key"))
    assert remote.calls == ["try", "try", "other key"]
    assert store.verify().ok


def test_ceiling_fast_path_asks_nobody(enforce, drive):
    remote = Remote()
    fail(enforce, drive, remote, times=2)
    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(enforce, "stripe.refund", refund("txn_1", 90000), remote.act("approve band"), wait=True)
    assert refused.value.reason == "attempt_ceiling"
    assert not Approval.objects.exists()  # no human asked about a call that cannot run
    assert last_receipt()["attempt"] == 3 and last_receipt()["decision"] == "approve"


def test_ceiling_comes_before_a_presented_approval_which_stays_granted(enforce, drive):
    remote = Remote()
    approval = granted_for(enforce, drive, refund("txn_1", 90000))
    fail(enforce, drive, remote, times=2)
    with ctrlrun.with_approval(approval), pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(enforce, "stripe.refund", refund("txn_1", 90000), remote.act("approved but over"))
    assert refused.value.reason == "attempt_ceiling"
    assert Approval.objects.get(pk=approval).status == "granted"
    assert last_receipt()["approval_id"] == approval


def test_max_attempts_one_means_no_retry(enforce, drive):
    remote = Remote()
    remote.fail = ctrlrun.NotExecuted("down")
    with pytest.raises(ctrlrun.NotExecuted):
        drive(enforce, "audit.note", {"text": "x"}, remote.act("once"), effect="note:{text}")
    with pytest.raises(ctrlrun.ActionDenied):
        drive(enforce, "audit.note", {"text": "x"}, remote.act("twice"), effect="note:{text}")
    assert remote.calls == ["once"]


def test_ceiling_without_an_effect_key_warns_once_per_control(drive, caplog):
    remote = Remote()
    for control in (Control(policy=parse_policy(ENFORCE)), Control(policy=parse_policy(ENFORCE))):
        with caplog.at_level(logging.WARNING, logger="ctrlrun"):
            for _ in range(3):
                drive(control, "audit.note", {"text": "x"}, remote.act("unkeyed"))
    warnings = [r for r in caplog.records if "max_attempts" in r.getMessage()]
    assert len(warnings) == 2 and "no effect key" in warnings[0].getMessage()
    assert len(remote.calls) == 6  # no key: nothing to count, every call runs


def test_a_new_control_at_a_dead_controls_address_still_warns(drive, caplog):
    """The once-per-Control memory must die with its Control: CPython hands a freed address to the next
    object. Controls are made and dropped until an address comes round again (it does within a few)."""
    remote, addresses, made = Remote(), set(), 0
    with caplog.at_level(logging.WARNING, logger="ctrlrun"):
        while made < 200 and (made < 10 or len(addresses) == made):
            control = Control(policy=parse_policy(ENFORCE))
            addresses.add(id(control))
            drive(control, "audit.note", {"text": "x"}, remote.act("unkeyed"))
            made += 1
            del control
            gc.collect()
    warnings = [r for r in caplog.records if "max_attempts" in r.getMessage()]
    assert len(warnings) == made


def test_observed_receipts_are_readable_by_every_reader(observe, drive):
    """receipts --json prints the observe-mode fields; the chain verifies."""
    from tests.support import run_command

    drive(observe, "stripe.refund", refund("txn_1", 10**9), Remote().act("x"))
    [line] = run_command("receipts", "--json")
    document = json.loads(line)
    assert document["result"] == "observed" and document["would_have"]["blocked_reason"] == "rule[2]"
    assert document["execution"] == "committed"
    [text] = run_command("receipts")
    assert "deny/observed" in text


def test_observe_pending_expired_and_tampered_approvals(observe, enforce, drive, clock):
    from tests.support import execute_sql as _execute

    remote = Remote()
    with pytest.raises(ctrlrun.ApprovalRequired) as pending:
        drive(enforce, "stripe.refund", refund("txn_1", 90000), lambda: None)
    with ctrlrun.with_approval(pending.value.request_id):
        drive(observe, "stripe.refund", refund("txn_1", 90000), remote.act("nobody answered yet"))
    assert would_have(last_receipt())[4] == "pending"
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        drive(enforce, "stripe.refund", refund("txn_2", 90000), lambda: None)
    forged = asked.value.request_id  # granted by hand, with SQL: not by ctrlrun, so not signed
    _execute('UPDATE "ctrlrun_approval" SET "status" = %s, "approver" = %s, "answered_at" = "created_at" '
             'WHERE "approval_id" = %s', ("granted", "cfo", forged))
    with ctrlrun.with_approval(forged):
        drive(observe, "stripe.refund", refund("txn_2", 90000), remote.act("answered around ctrlrun"))
    assert would_have(last_receipt())[4] == "tampered"
    late = granted_for(enforce, drive, refund("txn_3", 90000))
    clock.advance(hours=2)
    with ctrlrun.with_approval(late):
        drive(observe, "stripe.refund", refund("txn_3", 90000), remote.act("too late"))
    assert would_have(last_receipt())[4] == "expired"
    assert Approval.objects.get(pk=late).status == "expired"
    assert len(remote.calls) == 3


def failed_then_lost(enforce, drive) -> Remote:
    """refund:txn_1 under max_attempts 2: attempt 1 fails without acting, attempt 2 loses its reply (ambiguous)."""
    remote = Remote()
    remote.fail = ctrlrun.NotExecuted("down")
    with pytest.raises(ctrlrun.NotExecuted):
        drive(enforce, "stripe.refund", refund("txn_1"), remote.act("1"))
    remote.fail = TimeoutError("lost")
    with pytest.raises(TimeoutError):
        drive(enforce, "stripe.refund", refund("txn_1"), remote.act("2"))
    return remote


def test_a_blocking_hook_that_moves_the_last_attempt_to_failed_meets_the_ceiling(enforce, drive):
    remote = failed_then_lost(enforce, drive)
    remote.fail = None
    hook = Hook("not_executed")
    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(enforce, "stripe.refund", refund("txn_1"), remote.act("3"), reconcile=hook)
    assert refused.value.reason == "attempt_ceiling"
    assert hook.asked == ["refund:txn_1"]
    last = last_receipt()
    assert events(last["action_id"])[-1] == "EFFECT_RESERVATION_REFUSED"
    assert last["attempt"] == 3 and last["result"] == "blocked"
    row = EffectRecord.objects.get(pk="refund:txn_1")
    assert (row.state, row.attempt) == ("failed", 2)
    assert remote.calls == ["1", "2"]
    assert store.verify().ok


def test_a_person_resolving_the_last_attempt_failed_meets_the_ceiling_before_anyone_is_asked(enforce, drive):
    remote = failed_then_lost(enforce, drive)
    store.resolve("refund:txn_1", "failed", by="alice")
    remote.fail = None
    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(enforce, "stripe.refund", refund("txn_1", 90000), remote.act("3"))
    assert refused.value.reason == "attempt_ceiling"
    assert not Approval.objects.exists()
    assert remote.calls == ["1", "2"]


# --------------------------------------------------------------------------- real processes

FROZEN_OBSERVER = """
import datetime as dt, sys, time, pathlib
import ctrlrun
folder = pathlib.Path(sys.argv[1])

@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", lease=dt.timedelta(seconds=1))
def refund(payment_id: str, amount: int) -> str:
    (folder / "inside").touch()
    while not (folder / "go").exists():
        time.sleep(0.02)
    return "refunded late"

with ctrlrun.context(agent="frozen-worker"):
    print(refund(payment_id="txn_1", amount=90000))
"""


def test_observe_worker_frozen_past_its_lease_is_swept_as_observed(tmp_path, use_policy):
    """SIGSTOP an observe-mode call inside its function: its lease lapses, the sweeper writes its
    receipt - observed, execution ambiguous, what would have been - and the woken worker's late
    outcome is recorded too, the row left as the sweep made it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from ctrlrun import reconcile
    from tests.support import script_environment

    use_policy(OBSERVE)
    env = script_environment(tmp_path, OBSERVE)
    (tmp_path / "worker.py").write_text(FROZEN_OBSERVER)
    worker = subprocess.Popen([sys.executable, "worker.py", str(tmp_path)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "inside").exists():
            assert worker.poll() is None, worker.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(worker.pid, signal.SIGSTOP)
        time.sleep(2.0)
        report = reconcile.run_once()
        assert [e.effect_key for e in report.swept] == ["refund:txn_1"]
        swept = last_receipt()
        assert (swept["result"], swept["execution"], swept["attempt"]) == ("observed", "ambiguous", 1)
        assert swept["would_have"] == {"decision": "approve", "reason": "rule[1]",
                                       "blocked_reason": "approval_required"}
        os.kill(worker.pid, signal.SIGCONT)
        (tmp_path / "go").touch()
        out, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            os.kill(worker.pid, signal.SIGCONT)
            worker.kill()
    assert worker.returncode == 0, err
    assert out.strip() == "refunded late"  # observe mode never refuses, not even a late outcome
    late = last_receipt()
    assert (late["result"], late["execution"]) == ("observed", "ambiguous")  # the row had moved on
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"
    assert store.verify().ok


CEILING_RACER = """
import sys, time
import ctrlrun

@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id: str, amount: int) -> None:
    with open(sys.argv[2], "a") as log:
        log.write("ran\\n")
    raise ctrlrun.NotExecuted("the remote refused the connection")

start = float(sys.argv[1])
while time.time() < start:
    time.sleep(0.001)
outcomes = []
with ctrlrun.context(agent="racer"):
    for _ in range(6):
        try:
            refund(payment_id="txn_1", amount=100)
        except ctrlrun.NotExecuted:
            outcomes.append("failed")
        except ctrlrun.DuplicateEffect:
            outcomes.append("busy")
            time.sleep(0.01)
        except ctrlrun.ActionDenied as exc:
            outcomes.append(exc.reason)
            break
print(" ".join(outcomes))
"""


def test_the_ceiling_holds_across_racing_processes(tmp_path, use_policy):
    """Six processes retry one failing key at once under max_attempts 2: exactly two executions in all,
    attempts 1 and 2, and every process ends refused by the ceiling."""
    import time

    from tests.support import run_together, script_environment

    use_policy(ENFORCE)
    env = script_environment(tmp_path, ENFORCE)
    (tmp_path / "racer.py").write_text(CEILING_RACER)
    log = tmp_path / "runs.log"
    start = time.time() + 3
    outputs = run_together(tmp_path, "racer.py", [[str(start), str(log)]] * 6, env)
    assert log.read_text().count("ran") == 2
    assert all(out.split()[-1] == "attempt_ceiling" for out in outputs), outputs
    executed = [r["attempt"] for r in receipts() if r["result"] == "failed"]
    assert sorted(executed) == [1, 2]
    row = EffectRecord.objects.get(pk="refund:txn_1")
    assert (row.state, row.attempt) == ("failed", 2)
    assert store.verify().ok


def test_control_environment_ranks_above_a_parsed_policys():
    """Control(environment=) re-reads a Policy object for that environment: its actions and hash say it."""
    staging_text = "schema: ctrlrun.policy/v5\nenvironment: staging\n" + RULES
    parsed = parse_policy(staging_text)
    assert parsed.environment == "staging"
    moved = Control(policy=parsed, environment="prod-eu")
    assert moved.read_policy().environment == "prod-eu"
    assert moved.policy_hash != parsed.hash
    assert Control(policy=parsed).read_policy() is parsed
    assert Control(policy=parsed, environment="staging").read_policy() is parsed
    with pytest.raises(ctrlrun.InvalidArgument):
        Control(policy=parsed, environment="  ")
    moved.call("audit.note", {"text": "x"}, lambda: None, principal="a")
    assert last_receipt()["environment"] == "prod-eu"


def test_an_approval_from_one_environment_never_matches_another(drive):
    text = "schema: ctrlrun.policy/v5\nenvironment: staging\n" + RULES
    staging = Control(policy=parse_policy(text))
    production = Control(policy=parse_policy(text), environment="production")
    approval = granted_for(staging, drive, refund("txn_1", 90000))
    remote = Remote()
    with ctrlrun.with_approval(approval), pytest.raises(ctrlrun.ApprovalMismatch) as refused:
        drive(production, "stripe.refund", refund("txn_1", 90000), remote.act("production"))
    assert refused.value.reason == "mismatch" and remote.calls == []
    with ctrlrun.with_approval(approval):
        drive(staging, "stripe.refund", refund("txn_1", 90000), remote.act("staging"))
    assert remote.calls == ["staging"]
    assert [r["environment"] for r in receipts()][-2:] == ["production", "staging"]


def test_data_labels_decide_protected_calls(use_policy, remote):
    """A labelled parameter with a default is present (defaults are applied before deciding), so its label
    is in data_scope even when the caller leaves it out."""
    labelled = """\
    data: {patient_id: phi, note_id: internal}
    rules:
      - when: {data_scope_in: [phi]}
        decision: approve
      - decision: allow
"""
    use_policy(f"schema: ctrlrun.policy/v4\nactions:\n  notes.read:\n{labelled}  notes.list:\n{labelled}")

    @ctrlrun.protect("notes.read")
    def read_note(note_id: str, patient_id: str | None = None) -> str:
        return note_id

    @ctrlrun.protect("notes.list")
    def list_notes(note_id: str) -> str:
        return note_id

    with ctrlrun.context(agent="clinic-bot"):
        with pytest.raises(ctrlrun.ApprovalRequired):
            read_note(note_id="n1")
        assert list_notes(note_id="n1") == "n1"
    assert [r["decision_reason"] for r in receipts()] == ["rule[1]"]  # (the request has no receipt yet)
    with pytest.raises(ctrlrun.InvalidArgument, match="data_scope"):
        @ctrlrun.protect("notes.read")
        def sneaky(note_id: str, data_scope: list) -> None: ...
