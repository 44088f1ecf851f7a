"""The "Grants and budgets" page in a real headless Chromium at 1280 px: reached from the front page,
showing what real calls spent and hold of a grant's budgets, and followed to a spending call's receipt
and to the ambiguous call's effect record. Photographed for the reviewer."""
from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By

import ctrlrun
from ctrlrun.models import EffectRecord, Receipt
from tests.support import grant_refund as refund
from tests.support import make_user, policy_text

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

POLICY = policy_text("grants")


def test_an_auditor_sees_what_each_budget_spent_and_follows_the_calls(console, use_policy):
    use_policy(POLICY)

    def lost():
        raise TimeoutError("no reply")

    refund("p1", 30000)
    refund("p2", 30000)
    with pytest.raises(TimeoutError):  # ambiguous: it holds its charge
        refund("p3", 20000, lost)
    with pytest.raises(ctrlrun.ActionDenied, match="exhausted"):  # count: 3 per hour, all taken
        refund("p4", 1000)
    make_user("auditor", "otto")

    console.login("otto")
    console.shot("front-page")
    console.click(console.by_id("ctrlrun-grants-front-link").find_element(By.LINK_TEXT, "Grants and budgets"))
    assert console.path() == "/admin/ctrlrun/budgetledger/grants/"
    body = console.text()
    for expected in ("grant support", "grant mailer", "amount_lte: 500000", "at most 100,000 per day",
                     "at most 3 per hour", "No budgets: this grant's calls are not capped.", "refund:p3"):
        assert expected in body, expected
    support = console.by_id("grant-1")
    amount, count = support.find_elements(By.CSS_SELECTOR, ".ctrlrun-budget")
    assert [amount.find_element(By.CSS_SELECTOR, f".{n}").text for n in ("used", "held", "left")] == [
        "80,000", "20,000", "20,000"]
    assert [count.find_element(By.CSS_SELECTOR, f".{n}").text for n in ("used", "held", "left")] == [
        "3", "1", "0 exhausted"]
    assert len(amount.find_elements(By.CSS_SELECTOR, ".ctrlrun-budget-calls tbody tr")) == 3
    assert "refund:p4" not in body  # refused: it never took its key, it spent nothing
    console.shot("grants-and-budgets")
    assert console.driver.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")  # fits 1280 px
    assert not console.driver.find_elements(By.CSS_SELECTOR, "#content-main form, input[type=submit]")  # read-only

    receipt = Receipt.objects.get(effect_key="refund:p1")
    console.click(amount.find_element(By.CSS_SELECTOR, f'a[title="{receipt.receipt_id}"]'))
    assert receipt.receipt_id in console.text() and "committed" in console.text()
    console.shot("a-spending-receipt")

    console.driver.back()
    ambiguous = console.by_id("grant-1").find_element(By.LINK_TEXT, "refund:p3")
    console.click(ambiguous)
    assert console.path() == f"/admin/ctrlrun/effectrecord/{EffectRecord.objects.get(pk='refund:p3').pk}/change/" \
        .replace(":", "_3A")
    assert "ambiguous" in console.text().lower()
    console.shot("the-holding-effect")

    console.open("/admin/ctrlrun/budgetledger/")
    rows = console.driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 6  # two budgets, three calls that took their key
    console.shot("budget-ledger")
    console.click(console.by_id("ctrlrun-grants-link").find_element(By.LINK_TEXT, "Grants and budgets"))
    assert console.path() == "/admin/ctrlrun/budgetledger/grants/"


def test_delegated_budgets_and_money_under_their_grant(console, use_policy):
    """A grant whose amounts are euros and a delegation of it with budgets of its own: the delegation's
    boxes under the grant, money as money, the delegation linked to its page; fits 1280 px."""
    from ctrlrun.control import default_control
    from tests.support import BUDGETED_CHILD, BUDGETED_DELEGATION_POLICY

    use_policy(BUDGETED_DELEGATION_POLICY)
    control = default_control()
    made = control.delegate("support", BUDGETED_CHILD, by="orchestrator")
    control.call("stripe.refund", {"payment_id": "p1", "amount": 40000}, lambda: "done", principal="orchestrator")
    control.call("stripe.refund", {"payment_id": "p2", "amount": 30000}, lambda: "done", principal="worker")
    make_user("auditor", "otto")
    console.login("otto")
    console.open("/admin/ctrlrun/budgetledger/grants/")
    grant = console.by_id("grant-1")
    amount = grant.find_elements(By.CSS_SELECTOR, ".ctrlrun-budget")[0]
    assert "amount: at most EUR 5,000.00 per day" in amount.text
    assert [amount.find_element(By.CSS_SELECTOR, f".{n}").text for n in ("used", "held", "left")] == [
        "EUR 700.00", "EUR 0.00", "EUR 4,300.00"]
    delegated = console.by_id("grant-1-delegated")
    assert made.id in delegated.text and "amount: at most EUR 1,000.00 per 2 days" in delegated.text
    boxes = delegated.find_elements(By.CSS_SELECTOR, ".ctrlrun-budget")
    assert [boxes[1].find_element(By.CSS_SELECTOR, f".{n}").text for n in ("used", "held", "left")] == ["1", "0", "4"]
    console.shot("delegated-budgets")
    assert console.driver.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    console.click(delegated.find_element(By.PARTIAL_LINK_TEXT, made.id[:12]))
    assert made.id in console.text()
