"""Issue 25: how a budget is shown and recorded. One way to write a budget's limit and window (the
Delegations page, the Grants page and ``inspect --grant``), money shown as money where the budget says
so (``currency:``), and a budget refusal recorded with the same decision word as a constraint refusal
(``deny``, as the reference records a constraint refusal), all on the real store."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun.control import Control
from ctrlrun.models import Event
from ctrlrun.policy import parse_policy
from tests.support import receipts

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: capped
      subject: {agent: capped}
      actions: [stripe.refund]
      constraints: {amount_lte: 500}
    - id: metered
      subject: {agent: metered}
      actions: [stripe.refund, audit.note]
      budgets: [{metric: amount, limit: 100, window: P1D}]
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
  audit.note:
    decision: allow
"""


def test_budget_and_constraint_refusals_record_the_same_decision():
    control = Control(policy=parse_policy(POLICY))

    def refund(agent: str, payment_id: str, amount) -> None:
        control.call("stripe.refund", {"payment_id": payment_id, "amount": amount}, lambda: "done", principal=agent)

    with pytest.raises(ctrlrun.AuthorityDenied):
        refund("capped", "p1", 600)  # authority_constraint
    refund("metered", "p2", 100)
    with pytest.raises(ctrlrun.ActionDenied) as exhausted:
        refund("metered", "p3", 1)  # budget_exhausted
    assert exhausted.value.reason == "budget_exhausted"
    with pytest.raises(ctrlrun.BudgetRefused):
        refund("metered", "p4", "5")  # budget_unmeasurable
    with pytest.raises(ctrlrun.BudgetRefused):
        control.call("audit.note", {"text": "x"}, lambda: "done", principal="metered")  # budget_unkeyed
    denied = [(r["decision_reason"], r["result"], r["decision"]) for r in receipts() if r["result"] == "denied"]
    assert denied == [("authority_constraint", "denied", "deny"), ("budget_exhausted", "denied", "deny"),
                      ("budget_unmeasurable", "denied", "deny"), ("budget_unkeyed", "denied", "deny")]
    # The policy's own answer is still what POLICY_EVALUATED says: it allowed; the budget refused.
    evaluated = Event.objects.filter(type="POLICY_EVALUATED", action_id=exhausted.value.action_id).get()
    assert evaluated.data["decision"] == "allow"
