"""Reconciliation on a real database (§6): the eager and blocking triggers inside a protected
call, and the deferred pass (``reconcile.run_once()`` and the ``reconcile`` command) that also
sweeps lapsed leases to AMBIGUOUS before asking each record's hook."""
from __future__ import annotations

import datetime as dt
import sys

import pytest
from django.core.management import CommandError

import ctrlrun
from ctrlrun import reconcile, store
from ctrlrun.canonical import evidence_time
from ctrlrun.models import EffectRecord, Event, Receipt
from tests.support import (Hook, Remote, event, events, hold_key, make_ambiguous, protected_refund, receipts,
                           run_command)

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db")

SEED_POLICY = """\
schema: ctrlrun.policy/v2

actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


def refund_with(hook, remote: Remote, *, eagerly: bool, lease: dt.timedelta | None = None):
    return protected_refund(remote, reconcile=hook, reconcile_eagerly=eagerly, lease=lease)


# --------------------------------------------------------------------------- eager trigger


def test_eager_committed_moves_row_and_keeps_ambiguous_receipt(remote, agent, clock):
    """Eager 'committed': row committed by reconcile:<action>, receipt still ambiguous, exception propagates."""
    hook = Hook("committed")
    refund = refund_with(hook, remote, eagerly=True)
    remote.fail_with = TimeoutError("read timed out")
    with pytest.raises(TimeoutError, match="read timed out"):
        refund(payment_id="txn_1", amount=100)
    assert hook.asked == ["refund:txn_1"]
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.resolved_by) == ("committed", "reconcile:stripe.refund")
    assert record.error == "resolved committed by reconcile:stripe.refund (was: TimeoutError: read timed out)"
    [doc] = receipts()
    action_id = doc["action_id"]
    assert events(action_id)[-5:] == ["EXECUTION_STARTED", "EXECUTION_AMBIGUOUS", "RECONCILIATION_STARTED",
                                      "RECONCILIATION_RESOLVED", "EFFECT_RESOLVED"]
    assert event("RECONCILIATION_STARTED").data == {"effect_key": "refund:txn_1", "trigger": "eager"}
    assert event("RECONCILIATION_RESOLVED").data == {"outcome": "committed"}
    assert event("EFFECT_RESOLVED").data == {"state": "committed", "resolver": "reconcile:stripe.refund",
                                             "resolved_by": "reconcile"}
    assert (doc["result"], doc["error"], doc["attempt"]) == ("ambiguous", "TimeoutError: read timed out", 1)


def test_eager_receipt_is_written_after_the_reconciliation_events(remote, agent, clock):
    """The eager trigger's receipt does not exist while the hook runs and is stamped after its answer."""
    def slow_hook(effect_key: str) -> str:
        seen.append(Receipt.objects.count())
        clock.advance(seconds=7)  # the remote takes a while to answer
        return "committed"

    seen: list[int] = []
    refund = refund_with(slow_hook, remote, eagerly=True)
    make_ambiguous(refund, remote, "txn_1")
    assert seen == [0]
    [doc] = receipts()
    ambiguous_at = event("EXECUTION_AMBIGUOUS").ts
    resolved_at = event("RECONCILIATION_RESOLVED").ts
    assert resolved_at == ambiguous_at + dt.timedelta(seconds=7)
    assert doc["finished_at"] == evidence_time(resolved_at)


def test_eager_not_executed_marks_failed(remote, agent, clock):
    """Eager 'not_executed': the row becomes failed (a retry may run); the exception still propagates."""
    refund = refund_with(Hook("not_executed"), remote, eagerly=True)
    make_ambiguous(refund, remote, "txn_1")
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.resolved_by) == ("failed", "reconcile:stripe.refund")
    assert event("EFFECT_RESOLVED").data["state"] == "failed"
    assert receipts()[-1]["result"] == "ambiguous"


def test_eager_unknown_leaves_row_ambiguous(remote, agent, clock):
    """Eager 'unknown': recorded, nothing moves, no EFFECT_RESOLVED."""
    refund = refund_with(Hook("unknown"), remote, eagerly=True)
    make_ambiguous(refund, remote, "txn_1")
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.resolved_by, record.error) == ("ambiguous", None, "TimeoutError: read timed out")
    assert event("RECONCILIATION_RESOLVED").data == {"outcome": "unknown"}
    assert not Event.objects.filter(type="EFFECT_RESOLVED").exists()
    assert receipts()[-1]["result"] == "ambiguous"


def test_eager_hook_that_raises_is_recorded_not_read_as_answer(remote, agent, clock):
    """A hook raising an Exception: reason 'raised', error '<Type>: <msg>', row unchanged, original exception wins."""
    refund = refund_with(Hook(LookupError("stripe is down")), remote, eagerly=True)
    make_ambiguous(refund, remote, "txn_1")  # raises the executor's TimeoutError, not the hook's LookupError
    assert event("RECONCILIATION_RESOLVED").data == {"outcome": "unknown", "reason": "raised",
                                                     "error": "LookupError: stripe is down"}
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.resolved_by) == ("ambiguous", None)
    assert not Event.objects.filter(type="EFFECT_RESOLVED").exists()


@pytest.mark.parametrize(("answer", "error"), [("yes", "'yes'"), (None, "None"), (True, "True"),
                                               ("COMMITTED", "'COMMITTED'")])
def test_eager_hook_nonsense_answer_is_invalid_return(remote, agent, clock, answer, error):
    """A hook returning anything but the three answers: reason 'invalid_return' with its repr; row unchanged."""
    refund = refund_with(Hook(answer), remote, eagerly=True)
    make_ambiguous(refund, remote, "txn_1")
    assert event("RECONCILIATION_RESOLVED").data == {"outcome": "unknown", "reason": "invalid_return",
                                                     "error": error}
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"


def test_eager_hook_base_exception_propagates_with_receipt(remote, agent, clock):
    """A hook's KeyboardInterrupt propagates; the call's ambiguous receipt is still written."""
    refund = refund_with(Hook(KeyboardInterrupt()), remote, eagerly=True)
    remote.fail_with = TimeoutError("read timed out")
    with pytest.raises(KeyboardInterrupt):
        refund(payment_id="txn_1", amount=100)
    [doc] = receipts()
    assert (doc["result"], doc["error"]) == ("ambiguous", "TimeoutError: read timed out")
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"


def test_eager_hook_not_asked_after_base_exception_or_not_executed(remote, agent, clock):
    """The eager hook runs only after an Exception: not after KeyboardInterrupt, nor after NotExecuted."""
    hook = Hook("committed")
    refund = refund_with(hook, remote, eagerly=True)
    make_ambiguous(refund, remote, "txn_1", KeyboardInterrupt())
    make_ambiguous(refund, remote, "txn_2", ctrlrun.NotExecuted("refused before any byte was sent"))
    assert hook.asked == []
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"
    assert EffectRecord.objects.get(pk="refund:txn_2").state == "failed"
    assert not Event.objects.filter(type="RECONCILIATION_STARTED").exists()


def test_hook_without_eager_is_not_asked_on_own_outcome(remote, agent, clock):
    """Without reconcile_eagerly the hook waits for a blocked retry: the first ambiguous outcome asks nobody."""
    hook = Hook("committed")
    refund = refund_with(hook, remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    assert hook.asked == []
    assert receipts()[-1]["result"] == "ambiguous"


# --------------------------------------------------------------------------- blocking trigger


def test_blocking_committed_refuses_retry_as_duplicate(remote, agent, clock):
    """A retry of an ambiguous key asks the hook; 'committed' gives DuplicateEffect(committed) and a blocked receipt."""
    hook = Hook("committed")
    refund = refund_with(hook, remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(ctrlrun.DuplicateEffect) as caught:
        refund(payment_id="txn_1", amount=100)
    assert (caught.value.state, caught.value.effect_key) == ("committed", "refund:txn_1")
    assert hook.asked == ["refund:txn_1"]
    assert remote.calls == [("txn_1", 100)]
    retry = receipts()[-1]
    assert events(retry["action_id"]) == [
        "ACTION_PROPOSED", "POLICY_EVALUATED", "RECONCILIATION_STARTED", "RECONCILIATION_RESOLVED",
        "EFFECT_RESOLVED", "EFFECT_RESERVATION_REFUSED",
    ]
    assert event("RECONCILIATION_STARTED").data == {"effect_key": "refund:txn_1", "trigger": "blocking"}
    assert event("EFFECT_RESERVATION_REFUSED").data == {"reason": "duplicate", "state": "committed"}
    assert (retry["result"], retry["error"]) == ("blocked", str(caught.value))
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.resolved_by) == ("committed", "reconcile:stripe.refund")


def test_blocking_not_executed_runs_the_function_now(remote, agent, clock):
    """'not_executed' on a blocked retry: the row is renewed at attempt 2 and the function runs in this call."""
    hook = Hook("not_executed")
    refund = refund_with(hook, remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    assert refund(payment_id="txn_1", amount=100) == {"id": "re_txn_1", "amount": 100}
    assert remote.calls == [("txn_1", 100), ("txn_1", 100)]
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.attempt, record.resolved_by) == ("committed", 2, None)
    retry = receipts()[-1]
    assert (retry["result"], retry["attempt"]) == ("committed", 2)
    assert events(retry["action_id"]) == [
        "ACTION_PROPOSED", "POLICY_EVALUATED", "RECONCILIATION_STARTED", "RECONCILIATION_RESOLVED",
        "EFFECT_RESOLVED", "EFFECT_RESERVED", "EXECUTION_STARTED", "EXECUTION_COMMITTED",
    ]
    assert event("EFFECT_RESERVED", action_id=retry["action_id"]).data["attempt"] == 2


def test_blocking_unknown_refuses_with_ambiguous(remote, agent, clock):
    """'unknown' on a blocked retry moves nothing: AmbiguousEffect, blocked receipt, function not run."""
    hook = Hook("unknown")
    refund = refund_with(hook, remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(ctrlrun.AmbiguousEffect):
        refund(payment_id="txn_1", amount=100)
    assert hook.asked == ["refund:txn_1"]
    assert remote.calls == [("txn_1", 100)]
    retry = receipts()[-1]
    assert retry["result"] == "blocked"
    assert events(retry["action_id"])[-3:] == ["RECONCILIATION_STARTED", "RECONCILIATION_RESOLVED",
                                               "EFFECT_RESERVATION_REFUSED"]
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"


def test_blocking_hook_raising_refuses_with_ambiguous(remote, agent, clock):
    """A blocking hook that raises is recorded as 'raised' and the retry is refused with AmbiguousEffect."""
    refund = refund_with(Hook(ConnectionError("lookup failed")), remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(ctrlrun.AmbiguousEffect):
        refund(payment_id="txn_1", amount=100)
    assert event("RECONCILIATION_RESOLVED").data == {"outcome": "unknown", "reason": "raised",
                                                     "error": "ConnectionError: lookup failed"}
    assert remote.calls == [("txn_1", 100)]


def test_blocking_trigger_on_lapsed_lease(remote, agent, clock):
    """A retry that finds a dead worker's lapsed lease flips it ambiguous, then asks the hook before refusing."""
    hook = Hook("committed")
    refund = refund_with(hook, remote, eagerly=False)
    hold_key("refund:txn_1", action_id="act_" + "a" * 32)
    clock.advance(minutes=6)
    with pytest.raises(ctrlrun.DuplicateEffect) as caught:
        refund(payment_id="txn_1", amount=100)
    assert caught.value.state == "committed"
    assert hook.asked == ["refund:txn_1"]
    assert remote.calls == []
    lapsed = event("EXECUTION_AMBIGUOUS")
    assert lapsed.action_id == "act_" + "a" * 32 and lapsed.data["reason"] == "lease_expired"


def test_hook_asked_at_most_once_per_call(remote, agent, clock):
    """An eager call whose retry is blocked asks the hook once per execute, never twice in one call."""
    hook = Hook("unknown")
    refund = refund_with(hook, remote, eagerly=True)
    make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(ctrlrun.AmbiguousEffect):
        refund(payment_id="txn_1", amount=100)
    assert hook.asked == ["refund:txn_1", "refund:txn_1"]
    assert [e.data["trigger"] for e in Event.objects.filter(type="RECONCILIATION_STARTED")] == ["eager", "blocking"]


# --------------------------------------------------------------------------- the seed scenario


def test_seed_scenario_lost_reply_reconciled_eagerly(use_policy, agent):
    """The guide's program: the eager hook finds the refund in the ledger, so the retry is a duplicate."""
    use_policy(SEED_POLICY)
    ledger: dict[str, dict] = {}
    calls: list[str] = []

    def refund_at_stripe(payment_id: str, amount: int) -> dict:
        calls.append(payment_id)
        ledger[payment_id] = {"id": f"re_{payment_id}", "amount": amount}
        raise TimeoutError("no response from api.stripe.com after 30s")

    def ask_stripe(effect_key: str) -> ctrlrun.ReconcileOutcome:
        payment_id = effect_key.removeprefix("refund:")
        return "committed" if payment_id in ledger else "not_executed"

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", reconcile=ask_stripe, reconcile_eagerly=True)
    def refund(payment_id: str, amount: int) -> dict:
        return refund_at_stripe(payment_id, amount)

    with ctrlrun.context(agent="refund-agent"):
        with pytest.raises(TimeoutError):
            refund(payment_id="txn_9", amount=50000)
        with pytest.raises(ctrlrun.DuplicateEffect) as caught:
            refund(payment_id="txn_9", amount=50000)
    assert caught.value.state == "committed"
    assert calls == ["txn_9"]
    assert [(d["result"], d["decision_reason"]) for d in receipts()] == [("ambiguous", "decision"),
                                                                         ("blocked", "decision")]
    assert EffectRecord.objects.get(pk="refund:txn_9").resolved_by == "reconcile:stripe.refund"


# --------------------------------------------------------------------------- deferred: run_once()


def test_sweeper_moves_lapsed_lease_to_ambiguous_then_asks_hook(remote, agent, clock):
    """A dead worker's lapsed lease is swept to ambiguous (reason lease_expired), then its hook is asked 'deferred'."""
    hook = Hook("committed")
    refund_with(hook, remote, eagerly=False)
    holder = "act_" + "b" * 32
    hold_key("refund:txn_1", action_id=holder)
    clock.advance(minutes=5, seconds=1)
    result = reconcile.run_once()
    assert [e.effect_key for e in result.swept] == ["refund:txn_1"]
    assert hook.asked == ["refund:txn_1"]
    assert events(holder)[-5:] == ["EXECUTION_STARTED", "EXECUTION_AMBIGUOUS", "RECONCILIATION_STARTED",
                                   "RECONCILIATION_RESOLVED", "EFFECT_RESOLVED"]
    assert event("EXECUTION_AMBIGUOUS").data == {"error": store.LEASE_LAPSED_ERROR, "reason": "lease_expired"}
    assert event("RECONCILIATION_STARTED").data == {"effect_key": "refund:txn_1", "trigger": "deferred"}
    assert event("EFFECT_RESOLVED").data == {"state": "committed", "resolver": "reconcile:stripe.refund",
                                             "resolved_by": "reconcile"}
    assert [(line.effect_key, line.outcome) for line in result.lines] == [("refund:txn_1", "committed")]
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.lease_expires_at, record.resolved_by) == ("committed", None, "reconcile:stripe.refund")


def test_sweeper_leaves_live_lease_alone(remote, agent, clock):
    """A worker whose lease is still live is neither swept nor asked about."""
    hook = Hook("committed")
    refund_with(hook, remote, eagerly=False)
    hold_key("refund:txn_1")
    clock.advance(minutes=4)
    result = reconcile.run_once()
    assert result.swept == [] and result.lines == [] and hook.asked == []
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "executing"


def test_worker_swept_mid_call_cannot_report_success(remote, agent, clock):
    """A slow worker swept while it runs: its late return is recorded ambiguous and the caller gets AmbiguousEffect."""
    hook = Hook("unknown")

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", reconcile=hook, lease=dt.timedelta(seconds=10))
    def slow_refund(payment_id: str, amount: int) -> dict:
        clock.advance(seconds=30)  # the remote is slow; the lease lapses
        swept.append(reconcile.run_once())
        return remote.refund(payment_id, amount)

    swept: list[reconcile.Report] = []
    with pytest.raises(ctrlrun.AmbiguousEffect, match="could not be recorded"):
        slow_refund(payment_id="txn_1", amount=100)
    assert [e.effect_key for e in swept[0].swept] == ["refund:txn_1"]
    assert hook.asked == ["refund:txn_1"]
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"
    assert receipts()[-1]["result"] == "ambiguous"


def test_record_without_hook_needs_a_human(agent, clock):
    """An ambiguous record whose action has no registered hook is reported needs_human and left alone."""
    @ctrlrun.protect("email.send", effect="email:{msg_id}")
    def send(msg_id: str) -> None:
        raise TimeoutError("smtp timed out")

    with pytest.raises(TimeoutError):
        send(msg_id="m1")
    result = reconcile.run_once()
    [line] = result.lines
    assert (line.effect_key, line.action, line.outcome) == ("email:m1", "email.send", "needs_human")
    assert "no reconcile hook" in line.detail
    assert EffectRecord.objects.get(pk="email:m1").state == "ambiguous"
    assert not Event.objects.filter(type="RECONCILIATION_STARTED").exists()


def test_one_hook_raising_touches_only_its_record(remote, agent, clock):
    """In one pass a raising hook is recorded for its record only, while another record is resolved."""
    refund = refund_with(Hook(RuntimeError("stripe 503")), remote, eagerly=False)

    @ctrlrun.protect("email.send", effect="email:{msg_id}", reconcile=Hook("committed"))
    def send(msg_id: str) -> None:
        raise TimeoutError("smtp timed out")

    make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(TimeoutError):
        send(msg_id="m1")
    result = reconcile.run_once()
    outcomes = {line.effect_key: (line.outcome, line.detail) for line in result.lines}
    assert outcomes == {"refund:txn_1": ("unknown", "the hook raised: RuntimeError: stripe 503"),
                        "email:m1": ("committed", "the hook answered committed")}
    refund_row = EffectRecord.objects.get(pk="refund:txn_1")
    assert (refund_row.state, refund_row.reconcile_failures) == ("ambiguous", 1)
    assert refund_row.reconcile_after == clock.now + dt.timedelta(seconds=30)
    email_row = EffectRecord.objects.get(pk="email:m1")
    assert (email_row.state, email_row.resolved_by) == ("committed", "reconcile:email.send")
    assert event("RECONCILIATION_RESOLVED", effect_key="refund:txn_1").data["reason"] == "raised"


def test_unknown_answer_backs_off_until_reconcile_after(remote, agent, clock):
    """After 'unknown' the record is not asked again until the clock passes reconcile_after; then it is."""
    hook = Hook("unknown", "unknown", "committed")
    refund = refund_with(hook, remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    first = reconcile.run_once()
    assert [line.outcome for line in first.lines] == ["unknown"]
    due = EffectRecord.objects.get(pk="refund:txn_1").reconcile_after
    assert due == clock.now + dt.timedelta(seconds=30)

    clock.advance(seconds=29)
    assert reconcile.run_once().lines == []
    assert len(hook.asked) == 1

    clock.advance(seconds=1)
    assert [line.outcome for line in reconcile.run_once().lines] == ["unknown"]
    assert len(hook.asked) == 2
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert record.reconcile_failures == 2
    assert record.reconcile_after == clock.now + dt.timedelta(seconds=60)  # the delay doubles

    clock.advance(seconds=60)
    assert [line.outcome for line in reconcile.run_once().lines] == ["committed"]
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.reconcile_after) == ("committed", None)


def test_backoff_is_capped(remote, agent, clock, settings):
    """The backoff doubles only up to CTRLRUN_RECONCILE_BACKOFF_MAX_SECONDS."""
    settings.CTRLRUN_RECONCILE_BACKOFF_SECONDS = 10
    settings.CTRLRUN_RECONCILE_BACKOFF_MAX_SECONDS = 25
    refund = refund_with(Hook("unknown"), remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    delays = []
    for _ in range(4):
        reconcile.run_once()
        due = EffectRecord.objects.get(pk="refund:txn_1").reconcile_after
        delays.append((due - clock.now).total_seconds())
        clock.now = due
    assert delays == [10, 20, 25, 25]


def test_failed_answer_permits_a_retry(remote, agent, clock):
    """A deferred 'not_executed' leaves the record failed, and the next call renews it at attempt 2."""
    refund = refund_with(Hook("not_executed"), remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    [line] = reconcile.run_once().lines
    assert (line.outcome, line.detail) == ("failed", "the hook answered not_executed")
    refund(payment_id="txn_1", amount=100)
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.attempt) == ("committed", 2)


def test_answer_dropped_when_a_human_resolved_first(remote, agent, clock):
    """If the record was resolved while the hook was asked, the hook's answer is dropped: no EFFECT_RESOLVED."""
    def hook(effect_key: str) -> str:
        store.resolve(effect_key, "failed", by="alice")
        return "committed"

    refund = refund_with(hook, remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    reconcile.run_once()
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.resolved_by) == ("failed", "alice")
    assert [e.data["resolved_by"] for e in Event.objects.filter(type="EFFECT_RESOLVED")] == ["human"]


# --------------------------------------------------------------------------- deferred: the command


def reconcile_command(*args: str) -> list[str]:
    return run_command("reconcile", *args)


def test_command_prints_one_line_per_record_and_a_summary(remote, agent, clock):
    """The command prints swept records, each hook's answer, those needing a human, then the summary."""
    refund_with(Hook("committed"), remote, eagerly=False)

    @ctrlrun.protect("email.send", effect="email:{msg_id}")
    def send(msg_id: str) -> None:
        raise TimeoutError("smtp timed out")

    holder = "act_" + "c" * 32
    hold_key("refund:txn_1", action_id=holder)
    clock.advance(minutes=10)
    with pytest.raises(TimeoutError):
        send(msg_id="m1")
    assert reconcile_command() == [
        f"refund:txn_1  swept  lease lapsed under {holder}; now ambiguous",
        "email:m1  needs_human  no reconcile hook is registered for email.send (import the module that protects "
        "it with --import MODULE), or resolve it by hand",
        "refund:txn_1  committed  the hook answered committed",
        "swept 1 lapsed lease(s); asked 1 hook(s): 1 committed, 0 failed, 0 unknown, 0 dropped (the record moved meanwhile), 0 error(s); 1 need a human; 0 waiting in backoff",
    ]
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "committed"


def test_command_with_nothing_to_do(clock):
    """With no lapsed lease and no ambiguous record the command prints only a zero summary."""
    assert reconcile_command() == [
        "swept 0 lapsed lease(s); asked 0 hook(s): 0 committed, 0 failed, 0 unknown, 0 dropped (the record moved meanwhile), 0 error(s); 0 need a human; 0 waiting in backoff"
    ]


def test_command_action_option_limits_to_one_action(remote, agent, clock):
    """--action asks only that action's records; the others stay ambiguous."""
    refund = refund_with(Hook("committed"), remote, eagerly=False)
    email_hook = Hook("committed")

    @ctrlrun.protect("email.send", effect="email:{msg_id}", reconcile=email_hook)
    def send(msg_id: str) -> None:
        raise TimeoutError("smtp timed out")

    make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(TimeoutError):
        send(msg_id="m1")
    lines = reconcile_command("--action", "email.send")
    assert lines[0] == "email:m1  committed  the hook answered committed"
    assert len(lines) == 2 and lines[1].startswith("swept 0 lapsed lease(s); asked 1 hook(s): 1 committed")
    assert email_hook.asked == ["email:m1"]
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"


def test_command_action_option_also_limits_the_sweep(remote, agent, clock):
    """--action sweeps only that action's lapsed leases."""
    hold_key("refund:txn_1", action="stripe.refund", action_id="act_" + "d" * 32)
    hold_key("email:m1", action="email.send", action_id="act_" + "e" * 32)
    clock.advance(minutes=6)
    lines = reconcile_command("--action", "email.send")
    assert lines[0] == f"email:m1  swept  lease lapsed under {'act_' + 'e' * 32}; now ambiguous"
    assert EffectRecord.objects.get(pk="email:m1").state == "ambiguous"
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "executing"


def test_command_limit_asks_at_most_n_hooks_oldest_first(remote, agent, clock):
    """--limit N asks at most N hooks in a pass, the longest-waiting record first; the rest wait."""
    hook = Hook("committed")
    refund = refund_with(hook, remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    clock.advance(seconds=1)
    make_ambiguous(refund, remote, "txn_2")
    lines = reconcile_command("--limit", "1")
    assert lines[0] == "refund:txn_1  committed  the hook answered committed"
    assert hook.asked == ["refund:txn_1"]
    assert EffectRecord.objects.get(pk="refund:txn_2").state == "ambiguous"
    reconcile_command("--limit", "1")
    assert hook.asked == ["refund:txn_1", "refund:txn_2"]


def test_command_refuses_a_limit_below_one(clock):
    """--limit 0 is a usage error that says what is wrong (argparse exits 2 on the command line)."""
    with pytest.raises(CommandError, match="argument --limit: must be at least 1, got 0"):
        reconcile_command("--limit", "0")


def test_command_imports_hook_modules(tmp_path, monkeypatch, remote, agent, clock):
    """--import MODULE registers the hooks its protected functions declare before the pass."""
    refund = refund_with(None, remote, eagerly=False)
    make_ambiguous(refund, remote, "txn_1")
    (tmp_path / "refund_tools_for_test.py").write_text(
        "import ctrlrun\n"
        "@ctrlrun.protect('stripe.refund', effect='refund:{payment_id}', reconcile=lambda key: 'committed')\n"
        "def refund(payment_id: str, amount: int) -> None: ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "refund_tools_for_test", raising=False)
    try:
        lines = reconcile_command("--import", "refund_tools_for_test")
    finally:
        sys.modules.pop("refund_tools_for_test", None)
    assert lines[0] == "refund:txn_1  committed  the hook answered committed"


def test_command_refuses_an_unimportable_module(clock):
    """--import of a module that does not exist is an error naming it."""
    with pytest.raises(CommandError, match="no_such_hooks_module"):
        reconcile_command("--import", "no_such_hooks_module")


def test_command_refuses_a_hook_module_that_raises_in_one_line(tmp_path, monkeypatch, clock):
    """--import of a module that raises while it is imported is one error naming the module and what it
    raised (as resume_runs says it): never the module's traceback."""
    (tmp_path / "raising_hooks_for_test.py").write_text("raise RuntimeError('the\\nsettings are missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(CommandError) as refused:
            reconcile_command("--import", "raising_hooks_for_test")
    finally:
        sys.modules.pop("raising_hooks_for_test", None)
    assert str(refused.value) == ("could not import hook module 'raising_hooks_for_test': it raised RuntimeError: "
                                  "the settings are missing")
