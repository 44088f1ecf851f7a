"""Hops (§C7): agent A hands agent B a narrow delegation made with ``Control.hop``; B's calls present it
(``protect(hop=...)`` / ``call(hop=...)``) and it is then the only grant that counts: B's own grants do
not widen it, and A's budgets pay. Both drivers, the real store."""
from __future__ import annotations

import json

import pytest

import ctrlrun
from ctrlrun.canonical import Principal
from ctrlrun.control import Control
from ctrlrun.models import Event
from ctrlrun.policy import parse_policy
from tests.support import receipts, run_command

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: orchestrator
      subject: {agent: orchestrator}
      actions: [stripe.refund]
      resources: ["payment:*"]
      delegable: true
      expires_at: "2030-01-01T00:00:00Z"
      budgets: [{metric: count, limit: 3, window: P1D}]
    - id: worker-own
      subject: {agent: w1}
      actions: [stripe.refund]
      resources: ["payment:*"]
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    decision: allow
"""
HOP = """\
subject: {agent: w1}
actions: [stripe.refund]
resources: ["payment:p*"]
expires_at: "2029-01-01T00:00:00Z"
budgets: [{metric: count, limit: 3, window: P1D}]
"""


@pytest.fixture
def control():
    return Control(policy=parse_policy(POLICY))


def refund(payment_id: str) -> dict:
    return {"payment_id": payment_id, "amount": 1}


def test_a_hop_is_the_only_grant_that_counts_and_its_chain_pays(control, drive):
    made = control.hop("orchestrator", HOP, by="orchestrator", action_id="act_handover")
    created = Event.objects.get(type="DELEGATION_CREATED")
    assert created.data["created_via"] == "hop" and created.data["action_id"] == "act_handover"
    assert drive(control, "stripe.refund", refund("p1"), "w1", hop=made.id) == "done"
    first = receipts()[-1]
    assert (first["authority_grant_id"], first["hop"]) == (made.id, made.id)
    assert {c["grant_id"] for c in first["budget_charges"]} == {made.id, "orchestrator"}
    # Without the hop, w1's own grant lets it refund another payment; under the hop it may not.
    assert drive(control, "stripe.refund", refund("x1"), "w1") == "done"
    with pytest.raises(ctrlrun.AuthorityDenied) as refused:
        drive(control, "stripe.refund", refund("x2"), "w1", hop=made.id)
    assert refused.value.reason == "authority_hop" and f"inspect --hop {made.id}" in str(refused.value)
    denied = Event.objects.filter(type="AUTHORITY_DENIED").last()
    assert denied.data["hop"] == made.id and denied.data["dimension"] == "resources"
    # The orchestrator's count budget pays for the hop's calls: 3 a day.
    assert drive(control, "stripe.refund", refund("p2"), "w1", hop=made.id) == "done"
    assert drive(control, "stripe.refund", refund("p3"), "w1", hop=made.id) == "done"
    with pytest.raises(ctrlrun.ActionDenied) as exhausted:
        drive(control, "stripe.refund", refund("p4"), "w1", hop=made.id)
    assert exhausted.value.reason == "budget_exhausted"


def test_a_hop_presented_by_another_agent_or_naming_nothing(control, drive):
    made = control.hop("orchestrator", HOP, by="orchestrator")
    with pytest.raises(ctrlrun.AuthorityDenied) as stolen:
        drive(control, "stripe.refund", refund("p1"), "w2", hop=made.id)
    assert stolen.value.reason == "authority_hop"
    assert Event.objects.filter(type="AUTHORITY_DENIED").last().data["dimension"] == "subject"
    with pytest.raises(ctrlrun.AuthorityDenied) as bogus:
        drive(control, "stripe.refund", refund("p1"), "w1", hop="dlg_" + "0" * 32)
    assert bogus.value.reason == "authority_hop" and "no such hop" in str(bogus.value)
    control.revoke(made.id, by="ops")
    with pytest.raises(ctrlrun.AuthorityDenied) as revoked:
        drive(control, "stripe.refund", refund("p1"), "w1", hop=made.id)
    assert revoked.value.reason == "authority_revoked"


def test_protect_with_a_hop_template(use_policy):
    use_policy(POLICY)
    from ctrlrun.control import default_control

    made = default_control().hop("orchestrator", HOP, by="orchestrator")

    @ctrlrun.protect("stripe.refund", hop="{hop_id}")
    def send(payment_id: str, hop_id: str) -> str:
        return "sent"

    with ctrlrun.context(agent="w1"):
        assert send(payment_id="p1", hop_id=made.id) == "sent"
        with pytest.raises(ctrlrun.AuthorityDenied):
            send(payment_id="zz", hop_id=made.id)
    started = Event.objects.filter(type="EXECUTION_STARTED").first()
    assert started.data["hop"] == made.id


def test_inspect_hop(control, use_policy):
    use_policy(POLICY)  # the command reads the grants of the policy in settings
    made = control.hop("orchestrator", HOP, by=Principal("orchestrator", "ana"))
    document = json.loads("\n".join(run_command("inspect", "--hop", made.id, "--json")))
    assert document["schema"] == "ctrlrun.hop/v1" and document["hop"] == made.id
    assert document["created_by"] == {"agent": "orchestrator", "user": "ana"}
    assert document["subject"] == {"agent": "w1", "user": None} and document["root_id"] == "orchestrator"
    assert document["chain"][0]["narrowed"] == ["subject", "resources", "expires_at"]
    text = run_command("inspect", "--hop", made.id)
    assert text[0] == f"hop {made.id}" and text[-1] == "root orchestrator"
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="no hop"):
        run_command("inspect", "--hop", "dlg_nope")
