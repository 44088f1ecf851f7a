"""Review 11: attacks on observe mode and the attempt ceiling. Those marked "(bug)" failed before their fix;
the others are attacks that held, kept as regressions."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.models import Approval, EffectRecord, Event
from tests.integration.test_observe_and_ceiling import (  # noqa: F401 - fixtures
    Remote, drive, enforce, last_receipt, observe, refund, types_of, would_have)
from tests.support import Hook, receipts

pytestmark = pytest.mark.usefixtures("store_db")


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
    assert types_of(last["action_id"])[-1] == "EFFECT_RESERVATION_REFUSED"
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
    types = types_of(receipt["action_id"])
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
