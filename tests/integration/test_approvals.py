"""Approvals end to end on a real database (§8): the request an approve decision leaves, the
human's answer through the real commands, presenting it (every row of §8.4's table), the
allowed-action consumption, ``wait=True``, and the races that must leave exactly one effect."""
from __future__ import annotations

import datetime as dt
import getpass
import json
import threading
import time

import pytest
from django.core.management import CommandError
from django.db import connections

import ctrlrun
from ctrlrun import conf, store
from ctrlrun.canonical import ACTION_SCHEMA, canonical_bytes, evidence_time, sha256_hash
from ctrlrun.models import Approval, EffectRecord, Event, Receipt
from ctrlrun.protect import runtime
from ctrlrun.states import Result

from tests.support import REFUND_POLICY
from tests.support import (event, events, hold_key, protected_refund, receipts, run_command, run_together,
                           script_environment)

pytestmark = pytest.mark.usefixtures("store_db")

APPROVED_AMOUNT = 60000  # in the approve band of REFUND_POLICY (above 50000, at most 1000000)

#: Every refund (and the unkeyed ops.restart) needs a human: used to obtain a grant for a call
#: the refund policy itself allows, before switching back to REFUND_POLICY.
APPROVE_ALL = """\
schema: ctrlrun.policy/v2
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: approve
  audit.note:
    decision: approve
"""

WITH_UNKEYED_APPROVE = REFUND_POLICY + """\
  ops.restart:
    decision: approve
"""


# --------------------------------------------------------------------------- helpers


def ask(fn, **kwargs) -> ctrlrun.ApprovalRequired:
    """Call ``fn`` with nothing presented and return the ApprovalRequired it must raise."""
    with pytest.raises(ctrlrun.ApprovalRequired) as caught:
        fn(**kwargs)
    return caught.value


def granted(fn, by: str = "bob", **kwargs) -> str:
    """Ask for ``fn(**kwargs)`` and have ``by`` approve it through the real command; the request id."""
    request_id = ask(fn, **kwargs).request_id
    run_command("approve", request_id, "--by", by)
    return request_id


def status(approval_id: str) -> str:
    return Approval.objects.get(pk=approval_id).status


def answer_when_asked(grant: bool, by: str = "bob") -> tuple[threading.Thread, list]:
    """A human in another thread: waits for the pending request, then answers it through the store."""
    answered: list = []

    def human() -> None:
        try:
            for _ in range(3000):
                pending = list(Approval.objects.filter(status="pending").values_list("approval_id", flat=True))
                if pending:
                    answered.append(store.answer_approval(pending[0], grant, by=by))
                    return
                time.sleep(0.01)
        finally:
            connections.close_all()

    thread = threading.Thread(target=human, daemon=True)
    thread.start()
    return thread, answered


class TickingClock:
    """A clock that moves one minute every time it is read: a wait that never ends still ends."""

    def __init__(self) -> None:
        self.now = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.timezone.utc)

    def __call__(self) -> dt.datetime:
        self.now += dt.timedelta(minutes=1)
        return self.now


# --------------------------------------------------------------------------- §8.2 the request


def test_request_stores_pending_row_and_events_without_receipt(refund, remote, agent, clock, settings):
    """An approve decision stores a pending row (canonical action, policy hash, reason, created+TTL) and no receipt."""
    settings.CTRLRUN_APPROVAL_TTL_SECONDS = 120
    required = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    row = Approval.objects.get(pk=required.request_id)
    assert row.status == "pending" and row.action_id == required.action_id
    assert json.loads(row.action_json) == {
        "arguments": {"amount": APPROVED_AMOUNT, "payment_id": "txn_1"},
        "environment": conf.environment(),
        "name": "stripe.refund",
        "principal": {"agent": "support-agent", "user": None},
        "resource": None,
        "schema": ACTION_SCHEMA,
    }
    assert row.action_hash == sha256_hash(canonical_bytes(json.loads(row.action_json)))
    assert (row.policy_hash, row.decision_reason, row.effect_key) == (runtime().policy.hash, "rule[1]", "refund:txn_1")
    assert (row.created_at, row.expires_at) == (clock.now, clock.now + dt.timedelta(seconds=120))
    assert row.approver is None and row.consumed_at is None
    assert events(required.action_id) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED"]
    assert event("ACTION_PROPOSED").data["action_hash"] == row.action_hash
    assert event("POLICY_EVALUATED").data == {"decision": "approve", "reason": "rule[1]"}
    requested = event("APPROVAL_REQUESTED")
    assert requested.approval_id == row.approval_id and requested.effect_key == "refund:txn_1"
    assert requested.data == {"action_hash": row.action_hash, "expires_at": evidence_time(row.expires_at)}
    assert not Receipt.objects.exists() and not EffectRecord.objects.exists() and remote.calls == []


def test_default_ttl_is_fifteen_minutes(refund, agent, clock):
    """Without the setting a request expires fifteen minutes after it was created."""
    row = Approval.objects.get(pk=ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id)
    assert row.expires_at - row.created_at == dt.timedelta(minutes=15)


def test_each_unpresented_call_makes_a_new_request(refund, agent):
    """Two identical un-presented calls are two requests with two ids, both pending, same hash."""
    first = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    second = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert first.request_id != second.request_id and first.action_id != second.action_id
    rows = list(Approval.objects.order_by("created_at", "approval_id"))
    assert [r.status for r in rows] == ["pending", "pending"]
    assert rows[0].action_hash == rows[1].action_hash


def test_approval_required_says_how_to_answer_and_retry(refund, agent):
    """The ApprovalRequired message names the request id, the approve command and with_approval."""
    required = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert required.request_id.startswith("apr_") and len(required.request_id) == 36
    message = str(required)
    assert f"approve {required.request_id}" in message
    assert f"ctrlrun.with_approval('{required.request_id}')" in message


def test_approval_required_even_when_the_key_is_committed(refund, remote, agent):
    """The effect state is not consulted before the gate: an approve call on a committed key still asks."""
    refund(payment_id="txn_1", amount=100)
    required = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert status(required.request_id) == "pending"
    assert remote.calls == [("txn_1", 100)]


# --------------------------------------------------------------------------- the whole path


def test_request_approve_present_runs_once(refund, remote, agent, clock):
    """Request, approve via the command, present: runs once; receipt names the approval and approver."""
    required = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    request_id = required.request_id
    row = Approval.objects.get(pk=request_id)
    lines = run_command("approve", request_id, "--by", "bob", "--note", "customer called")
    assert lines[0] == f"granted {request_id} for {row.action_hash}"
    assert lines[1] == f"expires {evidence_time(row.expires_at)}"
    assert f"ctrlrun.with_approval('{request_id}')" in lines[2]
    grant = event("APPROVAL_GRANTED")
    assert (grant.action_id, grant.approval_id) == (required.action_id, request_id)
    assert grant.data == {"approver": "bob", "action_hash": row.action_hash, "note": "customer called"}
    row.refresh_from_db()
    assert (row.status, row.approver, row.note, row.answered_at) == ("granted", "bob", "customer called", clock.now)
    assert remote.calls == []

    with ctrlrun.with_approval(request_id):
        assert refund(payment_id="txn_1", amount=APPROVED_AMOUNT) == {"id": "re_txn_1", "amount": APPROVED_AMOUNT}
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    [doc] = receipts()
    assert (doc["result"], doc["decision"], doc["decision_reason"]) == ("committed", "approve", "rule[1]")
    assert (doc["approval_id"], doc["approver"], doc["action_hash"]) == (request_id, "bob", row.action_hash)
    assert doc["action_id"] != required.action_id
    assert events(doc["action_id"]) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_CONSUMED", "EFFECT_RESERVED",
                                       "EXECUTION_STARTED", "EXECUTION_COMMITTED"]
    consumed = event("APPROVAL_CONSUMED")
    assert (consumed.approval_id, consumed.data) == (request_id, {"approver": "bob"})
    assert event("EFFECT_RESERVED").approval_id == request_id
    row.refresh_from_db()
    assert (row.status, row.consumed_by, row.consumed_at) == ("consumed", doc["action_id"], clock.now)
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "committed"


# --------------------------------------------------------------------------- §8.4 presenting, row by row


def test_unknown_approval_is_refused(refund, remote, agent):
    """An id with no row: ApprovalMismatch(unknown), APPROVAL_INVALIDATED, a blocked receipt, nothing runs."""
    with ctrlrun.with_approval("apr_nope"):
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert (caught.value.reason, caught.value.approval_id) == ("unknown", "apr_nope")
    assert "no approval apr_nope" in str(caught.value)
    assert remote.calls == [] and not EffectRecord.objects.exists() and not Approval.objects.exists()
    invalidated = event("APPROVAL_INVALIDATED")
    [doc] = receipts()
    assert invalidated.approval_id == "apr_nope"
    assert invalidated.data == {"reason": "unknown", "action_hash": doc["action_hash"]}
    assert events(doc["action_id"]) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_INVALIDATED"]
    assert (doc["result"], doc["decision"], doc["approval_id"], doc["approver"]) == ("blocked", "approve", "apr_nope",
                                                                                     None)
    assert doc["error"] == str(caught.value)


def test_mismatch_never_runs_and_approval_stays_granted_for_the_original(refund, remote, agent):
    """An amount changed by one digit is a mismatch: never reaches the remote; the grant still works for the original."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    original_hash = Approval.objects.get(pk=request_id).action_hash
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            refund(payment_id="txn_1", amount=80000)
    assert (caught.value.reason, caught.value.approval_id) == ("mismatch", request_id)
    assert original_hash in str(caught.value)
    assert remote.calls == [] and not EffectRecord.objects.exists()
    assert status(request_id) == "granted"
    doc = receipts()[-1]
    assert (doc["result"], doc["approval_id"], doc["approver"]) == ("blocked", request_id, "bob")
    assert doc["action_hash"] != original_hash and doc["action_hash"] in str(caught.value)
    invalidated = event("APPROVAL_INVALIDATED")
    assert invalidated.data == {"reason": "mismatch", "action_hash": doc["action_hash"]}

    with ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    assert status(request_id) == "consumed"


def test_another_agent_gets_mismatch(refund, remote, agent):
    """The hash includes the principal: the same call by another agent does not match the grant."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    with ctrlrun.context(agent="other-agent"), ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert caught.value.reason == "mismatch"
    assert remote.calls == [] and status(request_id) == "granted"


def test_denied_approval_raises_action_denied(refund, remote, agent):
    """A denied request presented: APPROVAL_DENIED then ACTION_DENIED(approval_denied), a denied receipt, nothing runs."""
    request_id = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
    assert run_command("deny", request_id, "--by", "carol") == [f"denied {request_id}"]
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ActionDenied) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert caught.value.reason == "approval_denied"
    assert "carol" in str(caught.value)
    assert remote.calls == [] and not EffectRecord.objects.exists()
    assert status(request_id) == "denied"
    [doc] = receipts()
    assert caught.value.action_id == doc["action_id"]
    assert events(doc["action_id"]) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_DENIED", "ACTION_DENIED"]
    presented_denied = event("APPROVAL_DENIED", action_id=doc["action_id"])
    assert (presented_denied.approval_id, presented_denied.data) == (request_id, {"approver": "carol"})
    action_denied = event("ACTION_DENIED")
    assert (action_denied.approval_id, action_denied.data) == (None, {"reason": "approval_denied"})
    assert (doc["result"], doc["decision"], doc["decision_reason"]) == ("denied", "approve", "approval_denied")
    assert (doc["approval_id"], doc["approver"], doc["error"]) == (request_id, "carol", str(caught.value))


def test_pending_approval_is_refused_then_usable_once_granted(refund, remote, agent):
    """Presenting a request nobody answered yet: ApprovalMismatch(pending); after approval it runs."""
    request_id = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert (caught.value.reason, caught.value.approval_id) == ("pending", request_id)
    assert remote.calls == [] and status(request_id) == "pending"
    assert event("APPROVAL_INVALIDATED").data["reason"] == "pending"
    assert receipts()[-1]["result"] == "blocked"

    run_command("approve", request_id, "--by", "bob")
    with ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]


def test_second_presentation_is_refused_as_consumed(refund, remote, agent):
    """An approval authorises once: the second presentation is ApprovalMismatch(consumed) and never runs."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    with ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert (caught.value.reason, caught.value.approval_id) == ("consumed", request_id)
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    assert Event.objects.filter(type="APPROVAL_CONSUMED").count() == 1
    assert event("APPROVAL_INVALIDATED").data["reason"] == "consumed"
    assert [d["result"] for d in receipts()] == ["committed", "blocked"]


def test_replay_on_a_key_resolved_failed_is_still_refused(refund, remote, agent):
    """A consumed approval cannot authorise a retry, even when a person resolved the key failed and it
    could be renewed: only an attempt that provably did nothing (NotExecuted, a hook's not_executed)
    gives its approval back (tests/integration/test_approval_give_back.py)."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    remote.fail_with = TimeoutError("read timed out")
    with ctrlrun.with_approval(request_id):
        with pytest.raises(TimeoutError):
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
        run_command("resolve", "refund:txn_1", "--failed", "--by", "carol", "--reason", "checked")
        assert EffectRecord.objects.get(pk="refund:txn_1").state == "failed"
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert caught.value.reason == "consumed"
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    assert EffectRecord.objects.get(pk="refund:txn_1").attempt == 1


def test_expiry_is_checked_at_consumption(refund, remote, agent, clock):
    """A grant presented after expires_at: row marked expired, APPROVAL_EXPIRED then INVALIDATED, nothing runs."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    expires_at = Approval.objects.get(pk=request_id).expires_at
    clock.now = expires_at + dt.timedelta(seconds=1)
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert (caught.value.reason, caught.value.approval_id) == ("expired", request_id)
    assert remote.calls == [] and not EffectRecord.objects.exists()
    assert status(request_id) == "expired"
    [doc] = receipts()
    assert events(doc["action_id"]) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_EXPIRED",
                                       "APPROVAL_INVALIDATED"]
    expired = event("APPROVAL_EXPIRED")
    assert (expired.approval_id, expired.data) == (request_id, {})
    assert event("APPROVAL_INVALIDATED").data == {"reason": "expired", "action_hash": doc["action_hash"]}
    assert (doc["result"], doc["approval_id"], doc["approver"]) == ("blocked", request_id, "bob")

    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ApprovalMismatch) as again:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert again.value.reason == "expired" and remote.calls == []


def test_grant_is_usable_until_the_expiry_instant(refund, remote, agent, clock):
    """The TTL runs from the request and granting does not extend it: just before expiry the grant still works."""
    request_id = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
    row = Approval.objects.get(pk=request_id)
    clock.advance(minutes=14)
    run_command("approve", request_id, "--by", "bob")
    assert Approval.objects.get(pk=request_id).expires_at == row.expires_at
    clock.now = row.expires_at - dt.timedelta(seconds=1)
    with ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)] and status(request_id) == "consumed"


def test_approve_without_effect_key_consumes_the_approval_alone(use_policy, agent):
    """An unkeyed approve action consumes its approval and runs, with no effect record."""
    use_policy(WITH_UNKEYED_APPROVE)
    ran = []

    @ctrlrun.protect("ops.restart")
    def restart(service: str) -> str:
        ran.append(service)
        return "restarted"

    request_id = granted(restart, service="billing")
    with ctrlrun.with_approval(request_id):
        assert restart(service="billing") == "restarted"
    assert ran == ["billing"] and not EffectRecord.objects.exists()
    assert status(request_id) == "consumed"
    doc = receipts()[-1]
    assert (doc["result"], doc["approval_id"], doc["approver"], doc["effect_key"]) == ("committed", request_id, "bob",
                                                                                       None)
    assert events(doc["action_id"]) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_CONSUMED",
                                       "EXECUTION_STARTED", "EXECUTION_COMMITTED"]
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            restart(service="billing")
    assert caught.value.reason == "consumed" and ran == ["billing"]


# --------------------------------------------------------------------------- reservation refused


def test_committed_key_refuses_and_the_approval_stays_granted(refund, remote, agent):
    """A reservation refused because the key is committed: DuplicateEffect, and the approval is not spent."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    refund(payment_id="txn_1", amount=100)  # another call commits the same key meanwhile
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.DuplicateEffect) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert caught.value.state == "committed"
    assert remote.calls == [("txn_1", 100)]
    assert status(request_id) == "granted"
    assert not Event.objects.filter(type="APPROVAL_CONSUMED").exists()
    doc = receipts()[-1]
    assert (doc["result"], doc["decision"], doc["approval_id"]) == ("blocked", "approve", request_id)


def test_in_progress_key_refuses_then_the_same_approval_runs(refund, remote, agent):
    """A concurrent holder of the key wins: the approval stays granted and works once the holder failed."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    holder = hold_key("refund:txn_1")
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.DuplicateEffect) as caught:
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert caught.value.state == "in_progress"
    assert status(request_id) == "granted" and remote.calls == []

    store.record_outcome(holder.call, holder.attempt, Result.FAILED, error="connection refused")
    with ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    assert status(request_id) == "consumed"
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.attempt) == ("committed", 2)


# --------------------------------------------------------------------------- other decisions


def test_deny_decision_does_not_consume_but_names_the_approval(refund, remote, agent):
    """A policy deny with an approval presented: not consumed; ACTION_DENIED and the receipt carry its id."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ActionDenied) as caught:
            refund(payment_id="txn_1", amount=10**9)
    assert caught.value.reason == "rule[2]"
    assert status(request_id) == "granted" and remote.calls == []
    denied = event("ACTION_DENIED")
    assert (denied.action_id, denied.approval_id) == (caught.value.action_id, request_id)
    doc = receipts()[-1]
    assert (doc["result"], doc["decision"], doc["approval_id"]) == ("denied", "deny", request_id)


def test_allowed_call_consumes_a_matching_approval(refund, remote, agent, use_policy):
    """A granted approval presented on a call the policy allows is consumed (required false) and the call runs."""
    use_policy(APPROVE_ALL)
    request_id = granted(refund, payment_id="txn_1", amount=100)
    use_policy(REFUND_POLICY)  # the policy relaxed: 100 is allowed outright now
    with ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=100)
    assert remote.calls == [("txn_1", 100)]
    assert status(request_id) == "consumed"
    doc = receipts()[-1]
    assert (doc["decision"], doc["result"], doc["approval_id"], doc["approver"]) == ("allow", "committed", request_id,
                                                                                     "bob")
    consumed = event("APPROVAL_CONSUMED")
    assert consumed.data == {"approver": "bob", "required": False}
    assert events(doc["action_id"]) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_CONSUMED", "EFFECT_RESERVED",
                                       "EXECUTION_STARTED", "EXECUTION_COMMITTED"]


def test_allowed_unkeyed_call_consumes_a_matching_approval(agent, use_policy):
    """The allowed-action consumption also holds without an effect key."""
    use_policy(APPROVE_ALL)

    @ctrlrun.protect("audit.note")
    def note(text: str) -> str:
        return "noted"

    request_id = granted(note, text="refund issued")
    use_policy(REFUND_POLICY)
    with ctrlrun.with_approval(request_id):
        assert note(text="refund issued") == "noted"
    assert status(request_id) == "consumed"
    doc = receipts()[-1]
    assert (doc["decision"], doc["approval_id"], doc["approver"]) == ("allow", request_id, "bob")
    assert event("APPROVAL_CONSUMED").data == {"approver": "bob", "required": False}


def test_allowed_call_ignores_unknown_or_non_matching_approvals(refund, remote, agent):
    """On an allowed call an unknown id or a grant for another call is left alone and the call runs."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    with ctrlrun.with_approval("apr_nope"):
        refund(payment_id="txn_2", amount=100)
    with ctrlrun.with_approval(request_id):
        refund(payment_id="txn_3", amount=100)
    assert remote.calls == [("txn_2", 100), ("txn_3", 100)]
    assert status(request_id) == "granted"
    assert not Event.objects.filter(type__in=["APPROVAL_CONSUMED", "APPROVAL_INVALIDATED"]).exists()
    assert [(d["result"], d["approval_id"]) for d in receipts()] == [("committed", None), ("committed", None)]


def test_allowed_call_ignores_a_pending_matching_request(refund, remote, agent, use_policy):
    """A matching request nobody granted is not consumed by an allowed call, and never blocks it."""
    use_policy(APPROVE_ALL)
    request_id = ask(refund, payment_id="txn_1", amount=100).request_id
    use_policy(REFUND_POLICY)
    with ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=100)
    assert remote.calls == [("txn_1", 100)] and status(request_id) == "pending"


# --------------------------------------------------------------------------- §8.3 answering


def test_already_answered_is_refused(refund, agent):
    """A request can be answered once: approving or denying it again is an error naming its status."""
    request_id = granted(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    with pytest.raises(CommandError, match=f"approval request {request_id} is already granted"):
        run_command("approve", request_id, "--by", "bob")
    with pytest.raises(CommandError, match="is already granted"):
        run_command("deny", request_id, "--by", "carol")
    row = Approval.objects.get(pk=request_id)
    assert (row.status, row.approver) == ("granted", "bob")
    assert Event.objects.filter(type__in=["APPROVAL_GRANTED", "APPROVAL_DENIED"]).count() == 1


def test_unknown_request_is_refused():
    """Answering an id that does not exist is an error naming it, and writes nothing."""
    with pytest.raises(CommandError, match="no approval request apr_nope"):
        run_command("approve", "apr_nope", "--by", "bob")
    with pytest.raises(CommandError, match="no approval request apr_nope"):
        run_command("deny", "apr_nope", "--by", "bob")
    assert not Event.objects.exists()


def test_expired_request_is_marked_expired_and_refused(refund, agent, clock):
    """Answering after expiry: the row is marked expired (kept), APPROVAL_EXPIRED is written, the command fails."""
    required = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    expires_at = Approval.objects.get(pk=required.request_id).expires_at
    clock.advance(minutes=16)
    with pytest.raises(CommandError, match=f"expired at {evidence_time(expires_at)}"):
        run_command("approve", required.request_id, "--by", "bob")
    row = Approval.objects.get(pk=required.request_id)
    assert (row.status, row.approver) == ("expired", None)
    expired = event("APPROVAL_EXPIRED")
    assert (expired.action_id, expired.approval_id) == (required.action_id, required.request_id)
    with pytest.raises(CommandError, match="is already expired"):
        run_command("deny", required.request_id, "--by", "bob")


def test_requesting_user_cannot_answer_their_own_request(refund, remote):
    """The principal's user cannot approve or deny their own request; another person can."""
    with ctrlrun.context(agent="support-agent", user="alice"):
        request_id = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
        with pytest.raises(CommandError, match="made on behalf of user alice, who cannot answer it"):
            run_command("approve", request_id, "--by", "alice")
        with pytest.raises(CommandError, match="made on behalf of user alice, who cannot answer it"):
            run_command("deny", request_id, "--by", "alice")
        assert status(request_id) == "pending"
        assert not Event.objects.filter(type__in=["APPROVAL_GRANTED", "APPROVAL_DENIED"]).exists()
        run_command("approve", request_id, "--by", "bob")
        with ctrlrun.with_approval(request_id):
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    assert receipts()[-1]["approver"] == "bob"


def test_blank_approver_is_refused(refund, agent):
    """An answer needs a named person: a blank --by is refused and the request stays pending."""
    request_id = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
    with pytest.raises(CommandError, match="--by NAME"):
        run_command("approve", request_id, "--by", "  ")
    assert status(request_id) == "pending"


def test_default_approver_is_the_os_user(refund, agent):
    """Without --by the approver recorded (row and event) is the operating-system user."""
    request_id = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
    run_command("approve", request_id)
    assert Approval.objects.get(pk=request_id).approver == getpass.getuser()
    assert event("APPROVAL_GRANTED").data["approver"] == getpass.getuser()


def test_deny_command_records_the_denial(refund, agent, clock):
    """deny ID --by NAME --note TEXT: row denied with approver and note, APPROVAL_DENIED under the requester."""
    required = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert run_command("deny", required.request_id, "--by", "carol", "--note", "too large") == [
        f"denied {required.request_id}"]
    row = Approval.objects.get(pk=required.request_id)
    assert (row.status, row.approver, row.note, row.answered_at) == ("denied", "carol", "too large", clock.now)
    denied = event("APPROVAL_DENIED")
    assert (denied.action_id, denied.approval_id) == (required.action_id, required.request_id)
    assert denied.data == {"approver": "carol", "note": "too large"}


def test_deny_defaults_to_the_os_user(refund, agent):
    """deny without --by records the operating-system user."""
    request_id = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
    run_command("deny", request_id)
    assert Approval.objects.get(pk=request_id).approver == getpass.getuser()


# --------------------------------------------------------------------------- the approvals command


def test_approvals_lists_pending_first_and_filters_by_status(refund, agent, clock):
    """approvals lists pending requests (oldest first) before answered ones; --status keeps one status."""
    assert run_command("approvals") == ["no approval requests yet"]
    first = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
    clock.advance(minutes=1)
    second = ask(refund, payment_id="txn_2", amount=70000).request_id
    clock.advance(minutes=1)
    third = ask(refund, payment_id="txn_3", amount=80000).request_id
    run_command("approve", second, "--by", "bob")
    clock.advance(minutes=2)

    lines = run_command("approvals")
    assert [line.split()[0] for line in lines] == [first, third, second]
    assert lines[0] == (f'{first}  pending  stripe.refund  {{"amount":{APPROVED_AMOUNT},"payment_id":"txn_1"}}  '
                        f"support-agent  age 4m  expires in 11m")
    assert lines[2] == (f'{second}  granted  stripe.refund  {{"amount":70000,"payment_id":"txn_2"}}  '
                        f"support-agent  age 3m  granted by bob")

    granted_lines = run_command("approvals", "--status", "granted")
    assert [line.split()[0] for line in granted_lines] == [second]
    assert [line.split()[0] for line in run_command("approvals", "--status", "pending")] == [first, third]
    assert run_command("approvals", "--status", "denied") == ["no approval requests are denied"]


def test_approvals_shows_the_requesting_user(refund):
    """A request made for a user lists that user beside the agent."""
    with ctrlrun.context(agent="support-agent", user="alice"):
        request_id = ask(refund, payment_id="txn_1", amount=APPROVED_AMOUNT).request_id
    [line] = run_command("approvals")
    assert line.startswith(f"{request_id}  pending") and "support-agent (user alice)" in line


def test_approvals_rejects_an_unknown_status():
    """--status accepts only the five statuses."""
    with pytest.raises(CommandError):
        run_command("approvals", "--status", "approved")


# --------------------------------------------------------------------------- §8.5 wait=True


@pytest.fixture
def waiting_refund(remote, settings):
    settings.CTRLRUN_APPROVAL_POLL_SECONDS = 0.01
    return protected_refund(remote, wait=True)


def test_wait_runs_once_a_human_grants(waiting_refund, remote, agent, clock):
    """wait=True blocks until another thread grants, then runs the same action under that approval."""
    thread, answered = answer_when_asked(grant=True)
    assert waiting_refund(payment_id="txn_1", amount=APPROVED_AMOUNT) == {"id": "re_txn_1", "amount": APPROVED_AMOUNT}
    thread.join(timeout=60)
    [approval] = answered
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    row = Approval.objects.get(pk=approval.approval_id)
    assert row.status == "consumed" and row.consumed_by == row.action_id  # the same action re-ran
    [doc] = receipts()
    assert (doc["action_id"], doc["approval_id"], doc["approver"]) == (row.action_id, row.approval_id, "bob")
    assert events(row.action_id)[-4:] == ["APPROVAL_CONSUMED", "EFFECT_RESERVED", "EXECUTION_STARTED",
                                         "EXECUTION_COMMITTED"]


def test_wait_surfaces_a_denial(waiting_refund, remote, agent, clock):
    """wait=True answered with a denial raises ActionDenied(approval_denied) and never runs."""
    thread, answered = answer_when_asked(grant=False, by="carol")
    with pytest.raises(ctrlrun.ActionDenied) as caught:
        waiting_refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    thread.join(timeout=60)
    [approval] = answered
    assert caught.value.reason == "approval_denied"
    assert remote.calls == [] and status(approval.approval_id) == "denied"
    [doc] = receipts()
    assert (doc["result"], doc["approval_id"], doc["approver"]) == ("denied", approval.approval_id, "carol")


def test_wait_times_out_and_marks_the_request_expired(waiting_refund, remote, agent):
    """wait=True never answered: ApprovalTimeout naming the request, which is marked expired; no receipt."""
    conf.set_clock(TickingClock())
    try:
        with pytest.raises(ctrlrun.ApprovalTimeout) as caught:
            waiting_refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    finally:
        conf.set_clock(None)
    row = Approval.objects.get()
    assert caught.value.request_id == row.approval_id
    assert row.status == "expired"
    assert events(row.action_id) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED", "APPROVAL_EXPIRED"]
    assert remote.calls == [] and not Receipt.objects.exists() and not EffectRecord.objects.exists()


def test_wait_is_not_used_when_an_approval_is_presented(waiting_refund, remote, agent):
    """A wait=True call that presents a granted approval runs at once, with no new request."""
    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def plain(payment_id: str, amount: int) -> dict:
        raise AssertionError("must not run")

    request_id = granted(plain, payment_id="txn_1", amount=APPROVED_AMOUNT)
    with ctrlrun.with_approval(request_id):
        waiting_refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    assert Approval.objects.count() == 1 and status(request_id) == "consumed"


# --------------------------------------------------------------------------- two OS processes


RACER = """
import fcntl, json, sys, time
import ctrlrun

start_at, approval_id, worker = float(sys.argv[1]), sys.argv[2], sys.argv[3]

@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id: str, amount: int) -> str:
    with open("executions.log", "a") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(payment_id + "\\n")
    return payment_id

with ctrlrun.context(agent="support-agent"):
    refund(payment_id="warm-" + worker, amount=1)  # Django, the store and the policy are ready
    while time.time() < start_at:
        time.sleep(0.001)
    try:
        with ctrlrun.with_approval(approval_id):
            refund(payment_id="txn_race", amount=%d)
        outcome = {"ran": True}
    except ctrlrun.ApprovalMismatch as exc:
        outcome = {"ran": False, "refused": "ApprovalMismatch", "reason": exc.reason}
    except ctrlrun.DuplicateEffect as exc:
        outcome = {"ran": False, "refused": "DuplicateEffect", "reason": exc.state}
print(json.dumps(outcome))
""" % APPROVED_AMOUNT


@pytest.mark.slow
def test_two_processes_presenting_one_approval_run_once(refund, agent, tmp_path):
    """Two OS processes present the same grant at the same moment: exactly one runs, the other is refused."""
    request_id = granted(refund, payment_id="txn_race", amount=APPROVED_AMOUNT)
    (tmp_path / "racer.py").write_text(RACER)
    env = script_environment(tmp_path, REFUND_POLICY)
    env["CTRLRUN_ENVIRONMENT"] = conf.environment()
    start_at = time.time() + 5.0  # both workers have imported Django and warmed up by then
    outputs = run_together(tmp_path, "racer.py", [[str(start_at), request_id, str(n)] for n in range(2)], env)
    outcomes = [json.loads(out) for out in outputs]
    assert sorted(o["ran"] for o in outcomes) == [False, True]
    [loser] = [o for o in outcomes if not o["ran"]]
    assert (loser["refused"], loser["reason"]) in {("ApprovalMismatch", "consumed"), ("DuplicateEffect", "in_progress")}
    executed = [line for line in (tmp_path / "executions.log").read_text().split() if line == "txn_race"]
    assert executed == ["txn_race"]
    row = Approval.objects.get(pk=request_id)
    assert row.status == "consumed"
    assert EffectRecord.objects.get(pk="refund:txn_race").action_id == row.consumed_by
    assert Event.objects.filter(type="APPROVAL_CONSUMED", approval_id=request_id).count() == 1
    committed = [d for d in receipts() if d["effect_key"] == "refund:txn_race" and d["result"] == "committed"]
    assert [(d["action_id"], d["approval_id"]) for d in committed] == [(row.consumed_by, request_id)]
    assert store.verify().ok
