"""An approval spent by an attempt that provably did nothing is given back (issue 25).

A granted call whose function raised ``NotExecuted`` (or whose ambiguous outcome a reconcile hook
answered ``not_executed``) ends ``failed``: the approval returns to ``granted`` for the same action
hash, until it expires, with an ``APPROVAL_RETURNED`` event; the person need not approve the same
action twice. A committed or ambiguous attempt never gives it back, and the effect key still
guarantees at most once. Both drivers."""
from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.models import Approval, EffectRecord, Event
from tests.support import Hook, Remote, receipts, run_command

pytestmark = pytest.mark.usefixtures("store_db")

AMOUNT = 60000  # in the approve band of the refund policy


@pytest.fixture(params=["sync", "async"])
def protected(request, remote, agent):
    """``refund(**kwargs)`` through the sync or the async driver, with ``options`` for protect."""

    def make(**options):
        if request.param == "sync":
            @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", **options)
            def refund(payment_id: str, amount: int) -> dict:
                return remote.refund(payment_id, amount)

            return refund

        @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", **options)
        async def arefund(payment_id: str, amount: int) -> dict:
            return remote.refund(payment_id, amount)

        return lambda **kwargs: asyncio.run(arefund(**kwargs))

    return make


def granted(refund) -> str:
    with pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_1", amount=AMOUNT)
    run_command("approve", caught.value.request_id, "--by", "bob")
    return caught.value.request_id


def row(approval_id: str) -> Approval:
    return Approval.objects.get(pk=approval_id)


def returned_events(approval_id: str) -> list[dict]:
    return [e.data for e in Event.objects.filter(type="APPROVAL_RETURNED", approval_id=approval_id).order_by("seq")]


def test_not_executed_gives_the_approval_back(protected, remote):
    refund = protected()
    request_id = granted(refund)
    remote.fail_with = ctrlrun.NotExecuted("connection refused")
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.NotExecuted):
            refund(payment_id="txn_1", amount=AMOUNT)
        first = receipts()[-1]["action_id"]
        approval = row(request_id)
        assert (approval.status, approval.returned, approval.consumed_by) == ("granted", 1, None)
        assert returned_events(request_id) == [{"attempt": 1, "action_id": first, "reason": "not_executed",
                                                "error": "connection refused"}]
        remote.fail_with = None
        assert refund(payment_id="txn_1", amount=AMOUNT) == {"id": "re_txn_1", "amount": AMOUNT}  # no new approval
        # Committed: spent for good, and the key stops any further run.
        with pytest.raises(ctrlrun.ApprovalMismatch) as caught:
            refund(payment_id="txn_1", amount=AMOUNT)
    assert caught.value.reason == "consumed"
    approval = row(request_id)
    assert (approval.status, approval.returned) == ("consumed", 1)
    assert approval.consumed_by == receipts()[-2]["action_id"]
    assert remote.calls == [("txn_1", AMOUNT)] * 2
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "committed"
    assert [d["result"] for d in receipts()] == ["failed", "committed", "blocked"]
    assert store.verify().ok


def test_an_ambiguous_attempt_keeps_it_spent_and_a_not_executed_answer_gives_it_back(protected, remote):
    refund = protected(reconcile=Hook("not_executed"), reconcile_eagerly=True)
    request_id = granted(refund)
    remote.fail_with = TimeoutError("read timed out")
    with ctrlrun.with_approval(request_id):
        with pytest.raises(TimeoutError):
            refund(payment_id="txn_1", amount=AMOUNT)
    # The hook said it never happened: failed, and the approval given back, recorded as such.
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "failed"
    approval = row(request_id)
    assert (approval.status, approval.returned) == ("granted", 1)
    [back] = returned_events(request_id)
    assert (back["attempt"], back["reason"], back["resolver"]) == (1, "reconcile_not_executed",
                                                                    "reconcile:stripe.refund")
    assert store.verify().ok


def test_an_unanswered_ambiguous_attempt_never_gives_it_back(protected, remote):
    refund = protected(reconcile=Hook("unknown"), reconcile_eagerly=True)
    request_id = granted(refund)
    remote.fail_with = TimeoutError("read timed out")
    with ctrlrun.with_approval(request_id):
        with pytest.raises(TimeoutError):
            refund(payment_id="txn_1", amount=AMOUNT)
    assert row(request_id).status == "consumed"
    # A person resolving it failed is not a proof the remote never received it: it stays spent.
    run_command("resolve", "refund:txn_1", "--failed", "--by", "carol", "--reason", "checked")
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "failed"
    assert (row(request_id).status, returned_events(request_id)) == ("consumed", [])


def test_a_lapsed_approval_is_not_given_back(protected, remote, clock):
    refund = protected()
    request_id = granted(refund)
    expires_at = row(request_id).expires_at

    def late(payment_id, amount):
        clock.now = expires_at + dt.timedelta(seconds=1)  # it expired while the call ran
        raise ctrlrun.NotExecuted("connection refused")

    remote.refund = late
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.NotExecuted):
            refund(payment_id="txn_1", amount=AMOUNT)
    assert (row(request_id).status, returned_events(request_id)) == ("consumed", [])


def test_given_back_twice_counts_two(protected, remote):
    refund = protected()
    request_id = granted(refund)
    remote.fail_with = ctrlrun.NotExecuted("connection refused")
    with ctrlrun.with_approval(request_id):
        for _ in range(2):
            with pytest.raises(ctrlrun.NotExecuted):
                refund(payment_id="txn_1", amount=AMOUNT)
    assert (row(request_id).status, row(request_id).returned) == ("granted", 2)
    assert [e["attempt"] for e in returned_events(request_id)] == [1, 2]
    assert store.verify().ok


def _columns(approval: Approval) -> dict:
    return {f: getattr(approval, f) for f in ("status", "consumed_at", "consumed_by", "returned", "mac")}


@pytest.mark.parametrize("copy", ["before_first_use", "given_back"])
def test_an_older_signed_copy_put_back_by_the_owner_is_named(remote, agent, copy):
    """Past the guard (the tables' owner): a genuine granted copy from before the last use carries a
    valid signature, and the event chain is what shows it out of date."""
    from tests.support import evidence_unguarded, protected_refund

    refund = protected_refund(remote)
    request_id = granted(refund)
    copies = {"before_first_use": _columns(row(request_id))}
    remote.fail_with = ctrlrun.NotExecuted("connection refused")
    with ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.NotExecuted):
            refund(payment_id="txn_1", amount=AMOUNT)
        copies["given_back"] = _columns(row(request_id))
        remote.fail_with = None
        refund(payment_id="txn_1", amount=AMOUNT)
    assert store.verify().ok
    with evidence_unguarded():
        Approval.objects.filter(pk=request_id).update(**copies[copy])
    report = store.verify()
    assert {(b.name, b.kind) for b in report.breaks} == {("rewound", "approval")}, report.breaks
