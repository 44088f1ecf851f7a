"""Observe mode never changes what the function sees: ``ctrlrun.idempotency_token()`` works in an
observed call over a key that is ambiguous or committed (enforcement would have refused it; observe
mode runs it), with the value the enforced call would have, through both drivers."""
from __future__ import annotations

import asyncio

import pytest

import ctrlrun
from ctrlrun.canonical import idempotency_token_for
from ctrlrun.control import Control
from ctrlrun.models import EffectRecord
from ctrlrun.policy import parse_policy
from tests.support import receipts

pytestmark = pytest.mark.usefixtures("store_db")

OBSERVE = """\
schema: ctrlrun.policy/v5
mode: observe
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


@pytest.fixture(params=["sync", "async"])
def drive(request):
    def call(control: Control, executor):
        arguments = {"payment_id": "txn_1", "amount": 100}
        if request.param == "sync":
            return control.call("stripe.refund", arguments, executor, principal="support-agent")

        async def awaited():
            return executor()

        return asyncio.run(control.acall("stripe.refund", arguments, awaited, principal="support-agent"))

    return call


def token_taker(seen: list[str], fail: BaseException | None = None):
    def executor():
        seen.append(ctrlrun.idempotency_token())
        if fail is not None:
            raise fail
        return {"sent": seen[-1]}
    return executor


def outcome(receipt: dict) -> tuple:
    return receipt["result"], receipt["execution"], receipt["would_have"]["blocked_reason"], receipt["error"]


def test_token_in_an_observed_retry_of_a_committed_key(drive):
    control = Control(policy=parse_policy(OBSERVE))
    seen: list[str] = []
    drive(control, token_taker(seen))
    assert drive(control, token_taker(seen)) == {"sent": idempotency_token_for("refund:txn_1")}
    assert seen == [idempotency_token_for("refund:txn_1")] * 2
    first, retry = receipts()
    assert outcome(first) == ("observed", "committed", None, None)
    assert outcome(retry) == ("observed", "committed", "duplicate", None)
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "committed"


def test_token_in_an_observed_retry_of_an_ambiguous_key(drive):
    control = Control(policy=parse_policy(OBSERVE))
    seen: list[str] = []
    with pytest.raises(TimeoutError):
        drive(control, token_taker(seen, TimeoutError("lost")))
    assert drive(control, token_taker(seen)) == {"sent": idempotency_token_for("refund:txn_1")}
    assert seen == [idempotency_token_for("refund:txn_1")] * 2  # the remote dedupes the late retry
    first, retry = receipts()
    assert outcome(first) == ("observed", "ambiguous", None, "TimeoutError: lost")
    assert outcome(retry) == ("observed", "committed", "ambiguous", None)
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"  # observe left the row alone
