"""The console's "Grants and budgets" page (§C5): every grant of the current policy, per budget what is
spent, held and left in the window ending now and the calls that spent or hold it, linked to their
receipts and effect records. Read-only, seen by the console's evidence readers; a policy that has no
authority section, or does not load, is one clear line. Django's test client on a real database, with
real calls through the kernel."""
from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote

import ctrlrun
from ctrlrun import store
from ctrlrun.control import default_control
from ctrlrun.models import BudgetLedger, EffectRecord, Receipt
from tests.support import grant_refund as refund
from tests.support import has_id, login_redirect, policy_text, receipt_url, text, url
from tests.support import BUDGETED_CHILD, BUDGETED_DELEGATION_POLICY

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

ROLES = ["superuser", "approver", "resolver", "auditor", "staff", "outsider", "anonymous"]
READERS = {"superuser", "approver", "resolver", "auditor"}

POLICY = policy_text("grants")

HOSTILE = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: hostile
      subject: {agent: "<b>bot\u202e*"}
      actions: ["stripe.<i>*", "stripe.*"]
      resources: ["<img src=x>:*"]
      tasks: ["<script>alert(1)</script>"]
      constraints: {note_in: ["<svg onload=x>"]}
      budgets: [{metric: count, limit: 5, window: PT1H}]
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "<img src=x>:{payment_id}"
    decision: allow
"""


def words(response) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", text(response)).split())


def grants_url() -> str:
    return url("ctrlrun_grants")


@pytest.fixture
def spent(use_policy, clock):
    """Under 'support': one refund of 50,000 failed (given back), then two of 30,000 committed and one of
    20,000 left ambiguous (it holds)."""
    use_policy(POLICY)

    def lost():
        raise TimeoutError("no reply")

    def refused():
        raise ctrlrun.NotExecuted("the remote refused")

    with pytest.raises(ctrlrun.NotExecuted):
        refund("p4", 50000, refused)
    clock.advance(minutes=1)
    refund("p1", 30000)
    refund("p2", 30000)
    with pytest.raises(TimeoutError):
        refund("p3", 20000, lost)
    assert BudgetLedger.objects.count() == 8  # two budgets, four calls


@pytest.mark.parametrize("role", ROLES)
def test_who_sees_the_page(role, spent, as_role, client):
    as_role(role)
    for path in (grants_url(), url("ctrlrun_budgetledger_changelist")):
        response = client.get(path)
        if role in ("outsider", "anonymous"):
            assert login_redirect(response, path), response.status_code
        elif role == "staff":
            assert response.status_code == 403
        else:
            assert response.status_code == 200, (path, response.status_code)
    if role in READERS:
        front = client.get(url("index"))
        assert has_id(front, "ctrlrun-grants-front-link") and grants_url() in text(front)
        assert "Budget ledgers" in text(client.get(url("app_list", "ctrlrun")))


def test_every_grant_and_what_its_budgets_spent_hold_and_have_left(spent, as_role, client):
    as_role("auditor")
    response = client.get(grants_url())
    assert response.status_code == 200
    page = words(response)
    assert "grant support" in page and "grant mailer" in page
    assert "agent support-* " in page and "stripe.* " in page and "payment:* " in page and "production" in page
    assert "amount_lte: 500000" in page
    assert "agent mailer , user ops-*" in page and "run-*" in page and "2026-11-29 13:00:00 UTC" in page
    # amount per day: 80,000 used (two committed, and 20,000 held by the ambiguous one), 20,000 left
    assert "amount : at most 100,000 per day" in page
    assert "used 80,000 of it held 20,000 left 20,000" in page
    # count per hour: 3 used (1 held), 0 left: exhausted
    assert "count : at most 3 per hour" in page
    assert "used 3 of it held 1 left 0 exhausted" in page
    assert "No budgets: this grant's calls are not capped." in page  # mailer
    html = text(response)
    for key in ("refund:p1", "refund:p2", "refund:p3"):
        assert url("ctrlrun_effectrecord_change", quote(key)) in html, key
    assert "refund:p4" not in html  # failed: its charge was given back, it spends nothing
    for receipt in Receipt.objects.filter(effect_key__in=["refund:p1", "refund:p2", "refund:p3"]):
        assert receipt_url(receipt.receipt_id) in html
    amb = EffectRecord.objects.get(pk="refund:p3")
    assert amb.state == "ambiguous" and url("ctrlrun_call", quote(amb.action_id)) in html


def test_resolving_the_held_call_moves_its_charge(spent, as_role, client, clock):
    as_role("resolver")
    store.resolve("refund:p3", "failed", by="rita", reason="the remote has no such refund")
    page = words(client.get(grants_url()))
    assert "used 60,000 of it held 0 left 40,000" in page and "used 2 of it held 0 left 1" in page
    clock.advance(hours=1)  # the hour's window slid past every call; the day's did not
    page = words(client.get(grants_url()))
    assert "used 0 of it held 0 left 3" in page and "used 60,000 of it held 0 left 40,000" in page
    assert "no call has spent any of it in this window" in page


def test_never_editable(spent, as_role, client):
    as_role("superuser")
    rows = list(BudgetLedger.objects.values())
    assert client.get(url("ctrlrun_budgetledger_add")).status_code == 403
    row = BudgetLedger.objects.first()
    assert client.post(url("ctrlrun_budgetledger_change", str(row.pk)), {"amount": 0}).status_code == 403
    assert client.post(url("ctrlrun_budgetledger_delete", str(row.pk)), {"post": "yes"}).status_code == 403
    assert client.post(grants_url(), {"amount": 0}).status_code == 200  # the page has no form: nothing to post
    assert list(BudgetLedger.objects.values()) == rows


@pytest.mark.parametrize(("policy", "line"), [
    ("schema: ctrlrun.policy/v1\nactions:\n  stripe.refund:\n    decision: allow\n",
     "has no authority section: every call is decided by its rules alone, and nothing is capped."),
    ("schema: ctrlrun.policy/v7\nauthority: 3\nactions: {}\n",
     "The policy does not load, so its grants are unknown:"),
    ("schema: ctrlrun.policy/v7\nauthority:\n  grants: []\nactions: {}\n",
     "The policy's authority section has no grants: it permits no call at all."),
])
def test_no_grants_to_show_is_one_clear_line(policy, line, use_policy, as_role, client):
    use_policy(policy)
    as_role("auditor")
    response = client.get(grants_url())
    assert response.status_code == 200 and has_id(response, "ctrlrun-grants-problem")
    assert line in words(response)


def test_a_missing_policy_file(use_policy, as_role, client, settings, tmp_path):
    as_role("auditor")
    settings.CTRLRUN_POLICY = str(tmp_path / "nowhere.yaml")
    response = client.get(grants_url())
    assert response.status_code == 200 and "The policy does not load" in words(response)


def test_everything_from_the_policy_and_the_ledger_is_escaped(use_policy, as_role, client):
    use_policy(HOSTILE)
    default_control().call("stripe.refund", {"payment_id": "<u>p\u202e1", "note": "<svg onload=x>"}, lambda: None,
                           principal="<b>bot\u202ex", task="<script>alert(1)</script>")
    assert BudgetLedger.objects.get().effect_key == "refund:<u>p\u202e1"
    as_role("auditor")
    html = client.get(grants_url()).content.decode()
    assert "used 1 of it held 0 left 4" in " ".join(re.sub(r"<[^>]+>", " ", html).split())
    for raw in ("<script>", "<b>", "<i>", "<u>", "<img", "<svg onload", "\u202e"):
        assert raw not in html, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;img src=x&gt;:*" in html
    assert "U+202E" in html.upper() or "\\u202e" in html.lower()


def test_money_and_delegated_budgets(use_policy, as_role, client):
    """A budget that says its currency is shown as money; a delegation's own budgets are shown under the
    grant it was made from, with what its calls used (they are charged to it and to the grant above)."""
    use_policy(BUDGETED_DELEGATION_POLICY)
    control = default_control()
    made = control.delegate("support", BUDGETED_CHILD, by="orchestrator")
    control.call("stripe.refund", {"payment_id": "p1", "amount": 40000}, lambda: "done", principal="orchestrator")
    control.call("stripe.refund", {"payment_id": "p2", "amount": 30000}, lambda: "done", principal="worker")
    as_role("auditor")
    response = client.get(grants_url())
    page = words(response)
    root, delegated = page.split("Delegated budgets", 1)
    assert "amount : at most EUR 5,000.00 per day" in root
    assert "used EUR 700.00 of it held EUR 0.00 left EUR 4,300.00" in root
    assert "count : at most 20 per hour" in root and "used 2 of it held 0 left 18" in root
    assert f"delegation {made.id} · worker · depth 1" in delegated
    assert "amount : at most EUR 1,000.00 per 2 days" in delegated
    assert "used EUR 300.00 of it held EUR 0.00 left EUR 700.00" in delegated
    assert "count : at most 5 per hour" in delegated and "used 1 of it held 0 left 4" in delegated
    html = text(response)
    assert url("ctrlrun_delegation_change", quote(made.id)) in html
    assert url("ctrlrun_effectrecord_change", quote("refund:p2")) in html


def test_a_grant_whose_delegations_have_no_budgets_lists_none(spent, as_role, client):
    as_role("auditor")
    assert "Delegated budgets" not in words(client.get(grants_url()))
