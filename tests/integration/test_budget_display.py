"""Issue 25: how a budget is shown and recorded. One way to write a budget's limit and window (the
Delegations page, the Grants page and ``inspect --grant``), money shown as money where the budget says
so (``currency:``), and a budget refusal recorded with the same decision word as a constraint refusal
(``deny``, as the reference records a constraint refusal), all on the real store."""
from __future__ import annotations

import json

import pytest

import ctrlrun
from ctrlrun.control import Control
from ctrlrun.models import Event
from ctrlrun.policy import parse_policy
from tests.support import receipts, run_command

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


# --------------------------------------------------------------------------- one way to write a budget


def test_one_function_writes_a_limit_and_its_window():
    from ctrlrun.report import amount_text, limit_text

    assert limit_text(500000, 86400) == "500,000 per day"
    assert limit_text(20, 3600) == "20 per hour"
    assert limit_text(5, 7200) == "5 per 2 hours"
    assert limit_text(500000, 86400, "EUR") == "EUR 5,000.00 per day"
    assert limit_text(500000, 86400, grouped=False) == "500000 per day"  # inspect --grant's digits
    assert limit_text(500000, 86400, "EUR", grouped=False) == "EUR 5000.00 per day"
    assert amount_text(5, "EUR") == "EUR 0.05"
    assert amount_text(1234, "JPY") == "JPY 1,234"  # no minor unit
    assert amount_text(1234, "KWD") == "KWD 1.234"  # three digits
    assert amount_text(0) == "0"


MONEY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: support
      subject: {agent: support}
      actions: [stripe.refund]
      budgets:
        - {metric: amount, limit: 500000, window: P1D, currency: EUR}
        - {metric: count, limit: 5, window: P1D}
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


def test_a_budget_may_say_its_amounts_are_money():
    grant = parse_policy(MONEY).authority.grants["support"]
    amount, count = grant.budgets
    assert (amount.currency, count.currency) == ("EUR", None)
    assert amount.canonical() == {"metric": "amount", "limit": 500000, "window": 86400, "currency": "EUR"}
    assert count.canonical() == {"metric": "count", "limit": 5, "window": 86400}  # the hash of old policies kept


@pytest.mark.parametrize(("value", "expected"), [
    ("eur", r"'currency' must be an ISO 4217 code of three capital letters \(EUR, USD, JPY\), got 'eur'"),
    ("EURO", r"got 'EURO'"),
    ("5", r"got '5'"),
    (5, r"got 5"),
])
def test_a_bad_currency_is_one_clear_line(value, expected):
    text = MONEY.replace("currency: EUR", f"currency: {value!r}" if isinstance(value, str) else f"currency: {value}")
    with pytest.raises(ctrlrun.PolicyError, match=expected) as bad:
        parse_policy(text)
    assert "\n" not in str(bad.value) and "line 8" in str(bad.value)


def test_a_count_budget_is_not_money():
    text = MONEY.replace("{metric: count, limit: 5, window: P1D}", "{metric: count, limit: 5, window: P1D, currency: EUR}")
    with pytest.raises(ctrlrun.PolicyError, match="a count budget counts calls, not money: remove 'currency'"):
        parse_policy(text)


def test_inspect_grant_shows_money_as_money(use_policy):
    use_policy(MONEY)
    from ctrlrun.control import default_control

    default_control().call("stripe.refund", {"payment_id": "p1", "amount": 40000}, lambda: "done", principal="support")
    lines = run_command("inspect", "--grant", "support")
    assert lines == ["grant support", "amount: EUR 400.00 of EUR 5000.00 per day, EUR 0.00 held",
                     "count: 1 of 5 per day, 0 held"]
    budgets = json.loads("\n".join(run_command("inspect", "--grant", "support", "--json")))["budgets"]
    assert [(b["metric"], b["consumed"], b.get("currency")) for b in budgets] == [("amount", 40000, "EUR"),
                                                                                ("count", 1, None)]
    assert "currency" not in budgets[1]


def test_a_delegation_keeps_its_currency():
    from ctrlrun.policy import grant_from_json, grant_json

    grant = parse_policy(MONEY).authority.grants["support"]
    again = grant_from_json(grant_json(grant), "dlg_x")
    assert [b.currency for b in again.budgets] == ["EUR", None]
