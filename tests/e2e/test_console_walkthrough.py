"""An operator on call, in a real headless Chromium at a laptop's 1280x800 (issue 9): each group walks
the story from the front page, every list fits the screen, and an expired request offers nothing to
click. Every page visited is photographed under test-output/screenshots/."""
from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from selenium.webdriver.common.by import By

import ctrlrun
from ctrlrun.models import Approval, EffectRecord, Event, Receipt
from tests.support import (APPROVED_AMOUNT, Hook, hold_key, make_ambiguous, make_user, protected_refund, row_link,
                           shown_json, tile)

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")


def fits(console) -> dict:
    """Whether the page scrolls sideways, and where the change list's table ends."""
    return console.driver.execute_script("""
        const table = document.querySelector('#result_list');
        return {page: document.documentElement.scrollWidth, window: window.innerWidth,
                results: table ? table.parentElement.scrollWidth - table.parentElement.clientWidth : 0,
                right: table ? table.getBoundingClientRect().right : 0};""")


def column_visible(console, css: str) -> bool:
    """Every cell of the column is inside the window (not scrolled out of view)."""
    return console.driver.execute_script("""
        const cells = [...document.querySelectorAll(arguments[0])];
        return cells.length > 0 && cells.every(c => { const r = c.getBoundingClientRect();
            return r.width > 0 && r.right <= window.innerWidth; });""", css)


def test_approver_walks_from_the_front_page_to_the_call_it_unblocked_and_its_receipts(console, refund, remote):
    make_user("approver", "ana")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    request_id = caught.value.request_id

    console.login("ana")
    console.click(tile(console, "status=pending"))
    console.click(console.request_link(request_id))
    console.shot("approval-detail")
    assert "rule[1]" in console.text() and "when amount_gte: 0, amount_lte: 1000000 → approve" in console.text()
    console.click(console.by_id("ctrlrun-approve"))
    console.shot("confirmation")
    console.by_id("id_note").send_keys("customer called, refund agreed")
    console.click(console.by_id("ctrlrun-confirm"))
    console.shot("granted")
    assert "This request is granted (answered by ana)" in console.by_id("ctrlrun-decision").text

    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    used_by = Approval.objects.get(pk=request_id).consumed_by

    console.driver.refresh()
    console.shot("consumed")
    decision = console.by_id("ctrlrun-decision")
    assert "This request is consumed (answered by ana)" in decision.text and "Used by the call" in decision.text
    console.click(decision.find_element(By.CSS_SELECTOR, f'a[title="{used_by}"]'))
    console.shot("call")
    assert console.path() == f"/admin/ctrlrun/event/call/{quote(used_by)}/"
    assert "What the policy decided" in console.text() and "approve" in console.by_id("ctrlrun-call-decision").text
    assert '"payment_id": "txn_1"' in console.by_id("ctrlrun-action").text
    receipt = Receipt.objects.get(action_id=used_by)
    console.click(console.by_id("ctrlrun-call-receipts").find_element(By.CSS_SELECTOR, "a"))
    console.shot("receipt")
    assert console.path() == f"/admin/ctrlrun/receipt/{quote(receipt.receipt_id)}/change/"
    assert shown_json(console)["approver"] == "ana"
    console.click(console.link("refund:txn_1"))
    console.shot("effect")
    assert "This effect is committed" in console.by_id("ctrlrun-resolution").text
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]


def test_resolver_asks_the_remote_then_records_what_happened(console, remote):
    """The hook cannot say (unknown): the record stays ambiguous, and the resolver records 'failed' with a reason."""
    make_user("resolver", "rita")
    hook = Hook("unknown")
    refund = protected_refund(remote, reconcile=hook)
    key = make_ambiguous(refund, remote, "txn_5")

    console.login("rita")
    console.click(tile(console, "attention=ambiguous"))
    console.shot("effect-list")
    console.click(row_link(console, key))
    console.shot("effect-detail")
    assert '"payment_id": "txn_5"' in console.by_id("ctrlrun-proposed").text
    console.click(console.by_id("ctrlrun-ask"))
    console.shot("asked")
    assert hook.asked == [key]
    assert console.messages()[0].startswith(f"Asked the remote about {key}: unknown")
    started = Event.objects.get(effect_key=key, type="RECONCILIATION_STARTED")
    assert started.data["trigger"] == "operator" and started.data["requested_by"] == "rita"
    assert "Nobody knows whether this effect happened" in console.by_id("ctrlrun-resolution").text
    console.driver.find_element(By.CSS_SELECTOR, "input[name=outcome][value=failed]").click()
    console.by_id("id_reason").send_keys("no refund for txn_5 in the Stripe dashboard")
    console.click(console.by_id("ctrlrun-resolve"))
    console.shot("resolved-failed")
    assert console.messages() == [f"Effect {key} resolved failed by rita; a retry is now permitted"]
    box = console.by_id("ctrlrun-resolution")
    assert "the remote did not act" in box.text and "ok" not in box.get_attribute("class").split()
    assert EffectRecord.objects.get(pk=key).state == "failed"
    console.open("/admin/ctrlrun/receipt/")
    console.shot("receipt-list")
    assert "resolved since:" in console.text()


def test_an_expired_request_offers_no_buttons(console, refund, clock):
    make_user("approver", "ana")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    request_id = caught.value.request_id
    clock.advance(minutes=16)

    console.login("ana")
    assert tile(console, "status=pending").text.split()[0] == "0"
    console.open("/admin/ctrlrun/approval/")
    console.shot("approval-list")
    row = console.driver.find_element(By.CSS_SELECTOR, "#result_list tbody tr")
    assert "expired" in row.text and "pending" not in row.text
    console.click(console.request_link(request_id))
    console.shot("approval-detail")
    assert "This request is expired" in console.by_id("ctrlrun-decision").text
    assert not console.has("ctrlrun-approve") and not console.has("ctrlrun-deny")
    console.open(f"/admin/ctrlrun/approval/{quote(request_id)}/decide/approve/")
    console.shot("decide-refused")
    assert console.path() == f"/admin/ctrlrun/approval/{quote(request_id)}/change/"
    assert console.messages()[0].startswith(f"Request {request_id} expired at ")
    assert not console.has("ctrlrun-confirm")
    assert Approval.objects.get(pk=request_id).status == "pending"  # looking writes nothing


def test_every_list_fits_a_laptop_screen_with_what_decides_first(console, refund, remote, clock):
    """At 1280 px no list scrolls sideways, and the columns that decide (result, effect key, agent; hook and
    lease; expiry) are on screen."""
    make_user("auditor", "otto")
    refund_with_hook = protected_refund(remote, reconcile=Hook("unknown"))
    with ctrlrun.context(agent="customer-support-agent-eu-west-1", user="someone.with.a.long.name@example.com"):
        for n in range(3):
            refund(payment_id=f"pi_3PqLongStripeIdentifier{n:04d}XYZ", amount=100)
        with pytest.raises(ctrlrun.ApprovalRequired):
            refund(payment_id="pi_3PqLongStripeIdentifierApprovalXYZ", amount=APPROVED_AMOUNT)
    make_ambiguous(refund_with_hook, remote, "pi_3PqLongStripeIdentifierAmbiguousXYZ",
                   error=TimeoutError("HTTPSConnectionPool(host='api.stripe.com', port=443): Read timed out. "
                                      "(read timeout=30)"))
    hold_key("refund:pi_3PqLongStripeIdentifierHeldByADeadWorkerXYZ")
    clock.advance(minutes=6)

    console.login("otto")
    checks = {
        "receipt": [".field-outcome", ".field-shown_key", ".field-shown_agent"],
        "effectrecord": [".field-shown_state", ".field-shown_key", ".field-hook", ".field-lease"],
        "approval": [".field-shown_status", ".field-expiry", ".field-key_arguments"],
        "event": [".field-type", ".field-short_data"],
        "policydocument": [".field-in_force"],
    }
    for model, columns in checks.items():
        console.open(f"/admin/ctrlrun/{model}/")
        console.shot(f"{model}-list")
        size = fits(console)
        assert size["page"] <= size["window"] and size["results"] <= 0, (model, size)
        for column in columns:
            assert column_visible(console, column), (model, column)
    console.open("/admin/ctrlrun/effectrecord/")
    assert "lease lapsed" in console.text() and "lapsed" in console.driver.find_element(
        By.CSS_SELECTOR, ".field-lease strong").text
