"""The console end to end in a real headless Chromium on the live server: a person logs in
through the login form and clicks through the pages, while the test plays the agent in-process
through ``ctrlrun.protect``. Every console page visited is photographed for the reviewer."""
from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.db import connection
from selenium.webdriver.common.by import By

import ctrlrun
from ctrlrun.canonical import idempotency_token_for
from ctrlrun.models import Approval, EffectRecord, Event, Receipt
from tests.support import (APPROVED_AMOUNT, evidence_unguarded, make_ambiguous, make_user, row_link, shown_json,
                           tile)

# No reconcile hook from another test: a person decides here.
pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")


def test_approver_approves_and_the_agents_retry_runs_once(console, refund, remote):
    """The agent is told to wait; an approver approves in the browser; the retry under with_approval runs exactly once."""
    make_user("approver", "ana")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    request_id = caught.value.request_id
    assert remote.calls == []

    console.login("ana")
    waiting = tile(console, "status=pending")
    assert waiting.text.split() == ["1", "approval", "waiting"]
    console.shot("index")
    console.click(waiting)
    assert console.path() == "/admin/ctrlrun/approval/"
    console.shot("approval-list")
    console.click(console.request_link(request_id))
    console.shot("approval-detail")
    assert "This request is waiting for a person" in console.by_id("ctrlrun-decision").text
    assert console.has("ctrlrun-deny")
    console.click(console.by_id("ctrlrun-approve"))
    console.shot("confirmation")
    summary = console.text()
    assert "You are about to authorise this exact action, once" in summary
    assert '"amount": 60000' in summary and '"payment_id": "txn_1"' in summary and "support-agent" in summary
    console.by_id("id_note").send_keys("customer called, refund agreed")
    console.click(console.by_id("ctrlrun-confirm"))
    console.shot("approval-granted")
    [granted] = console.messages()
    assert granted.startswith(f"Request {request_id} granted. The agent's call of stripe.refund with exactly these "
                              f"arguments may now run, once, until ")
    assert "This request is granted (answered by ana)" in console.by_id("ctrlrun-decision").text
    row = Approval.objects.get(pk=request_id)
    assert (row.status, row.approver, row.note) == ("granted", "ana", "customer called, refund agreed")
    assert remote.calls == []

    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id):
        assert refund(payment_id="txn_1", amount=APPROVED_AMOUNT) == {"id": "re_txn_1", "amount": APPROVED_AMOUNT}
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    assert Approval.objects.get(pk=request_id).status == "consumed"

    console.open("/admin/ctrlrun/effectrecord/")
    console.shot("effect-list")
    console.click(row_link(console, "refund:txn_1"))
    console.shot("effect-detail")
    assert "This effect is committed" in console.by_id("ctrlrun-resolution").text
    assert not console.has("ctrlrun-resolve-form") and not console.has("ctrlrun-ask")
    receipt = Receipt.objects.get(effect_key="refund:txn_1")
    console.open("/admin/ctrlrun/receipt/")
    console.shot("receipt-list")
    console.click(row_link(console, receipt.receipt_id))
    console.shot("receipt-detail")
    document = shown_json(console)
    assert (document["result"], document["approval_id"], document["approver"]) == ("committed", request_id, "ana")
    console.open("/admin/ctrlrun/receipt/")
    console.click(console.by_id("ctrlrun-verify-link"))
    console.shot("verify")
    console.click(console.by_id("ctrlrun-run-check"))
    console.shot("verify-checked")
    assert console.by_id("ctrlrun-chain").text.startswith("The chain is intact")
    assert len(console.shots) == 12


def test_auditor_sees_no_buttons(console, refund, remote):
    """An auditor reads every page but sees no Approve, Deny, Ask or Resolve, and the confirmation URL is 403."""
    make_user("auditor", "otto")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    request_id = caught.value.request_id
    key = make_ambiguous(refund, remote, "txn_2")
    events_before = Event.objects.count()

    console.login("otto")
    assert tile(console, "status=pending").text.split()[0] == "1"
    assert tile(console, "attention=ambiguous").text.split()[0] == "1"
    assert not console.driver.find_elements(By.CSS_SELECTOR, "a.addlink")
    console.shot("index")
    console.click(tile(console, "status=pending"))
    console.shot("approval-list")
    assert not console.driver.find_elements(By.NAME, "action")  # no bulk actions either
    console.click(console.request_link(request_id))
    console.shot("approval-detail")
    assert not console.has("ctrlrun-approve") and not console.has("ctrlrun-deny")
    assert "You can read this request but not answer it" in console.by_id("ctrlrun-decision").text
    console.open(f"/admin/ctrlrun/approval/{quote(request_id)}/decide/approve/")
    console.shot("confirmation-forbidden")
    assert "You are not allowed to do this" in console.text() and "decide_approval" in console.text()
    assert not console.has("ctrlrun-confirm")

    console.open("/admin/")
    console.click(tile(console, "attention=ambiguous"))
    console.shot("effect-list")
    console.click(row_link(console, key))
    console.shot("effect-detail")
    assert "Nobody knows whether this effect happened" in console.by_id("ctrlrun-resolution").text
    assert not console.has("ctrlrun-ask") and not console.has("ctrlrun-resolve-form")
    assert not console.has("ctrlrun-resolve")
    assert "You can read this record but not resolve it" in console.text()
    console.click(console.driver.find_element(By.CSS_SELECTOR, "fieldset.module table.ctrlrun-timeline:not(#ctrlrun-events) a"))
    console.shot("receipt-detail")
    assert shown_json(console)["result"] == "ambiguous"
    assert not console.driver.find_elements(By.CSS_SELECTOR, "input[type=submit], a.deletelink")
    console.open("/admin/ctrlrun/receipt/")
    console.shot("receipt-list")
    console.click(console.by_id("ctrlrun-verify-link"))
    console.shot("verify")
    console.click(console.by_id("ctrlrun-run-check"))
    console.shot("verify-checked")
    assert console.by_id("ctrlrun-chain").text.startswith("The chain is intact")

    assert Approval.objects.get(pk=request_id).status == "pending"
    assert EffectRecord.objects.get(pk=key).state == "ambiguous"
    assert Event.objects.count() == events_before


def test_resolver_marks_ambiguous_committed_and_the_retry_is_a_duplicate(console, refund, remote):
    """A resolver records 'committed' with a reason; the agent's retry is then refused as a duplicate."""
    make_user("resolver", "rita")
    key = make_ambiguous(refund, remote, "txn_9")

    console.login("rita")
    lost = tile(console, "attention=ambiguous")
    assert lost.text.split() == ["1", "ambiguous", "effect"]
    console.shot("index")
    console.click(lost)
    console.shot("effect-list")
    console.click(row_link(console, key))
    console.shot("effect-detail")
    resolution = console.by_id("ctrlrun-resolution").text
    assert "Nobody knows whether this effect happened" in resolution
    assert "Pinned to attempt 1" in resolution
    assert idempotency_token_for(key, 1) in console.text()
    assert [row.find_elements(By.TAG_NAME, "td")[2].text for row in
            console.driver.find_elements(By.CSS_SELECTOR, "#ctrlrun-events tbody tr")][-1] == "EXECUTION_AMBIGUOUS"
    console.driver.find_element(By.CSS_SELECTOR, "input[name=outcome][value=committed]").click()
    console.by_id("id_reason").send_keys("Stripe dashboard shows re_txn_9 for 100")
    console.click(console.by_id("ctrlrun-resolve"))
    console.shot("effect-resolved")
    assert console.messages() == [
        f"Effect {key} resolved committed by rita; a retry will be refused as a duplicate"]
    assert "This effect is committed" in console.by_id("ctrlrun-resolution").text
    record = EffectRecord.objects.get(pk=key)
    assert (record.state, record.resolved_by) == ("committed", "rita")
    resolved = Event.objects.get(effect_key=key, type="EFFECT_RESOLVED")
    assert resolved.data == {"state": "committed", "resolver": "rita", "resolved_by": "human", "attempt": 1,
                             "reason": "Stripe dashboard shows re_txn_9 for 100"}

    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.DuplicateEffect) as refused:
        refund(payment_id="txn_9", amount=100)
    assert refused.value.state == "committed"
    assert remote.calls == [("txn_9", 100)]

    console.open("/admin/ctrlrun/receipt/")
    console.shot("receipt-list")
    last = Receipt.objects.order_by("-seq").first()
    assert last.effect_key == key and last.result == "blocked"
    console.click(row_link(console, last.receipt_id))
    console.shot("receipt-detail")
    assert shown_json(console)["result"] == "blocked"
    console.click(console.driver.find_element(By.LINK_TEXT, "Receipts"))
    console.click(console.by_id("ctrlrun-verify-link"))
    console.shot("verify")
    console.click(console.by_id("ctrlrun-run-check"))
    console.shot("verify-checked")
    assert console.by_id("ctrlrun-chain").text.startswith("The chain is intact")


def test_chain_page_reports_a_tampered_row(console, refund):
    """The front page shows the last recorded check, never re-hashing: 'unchecked', then intact after the chain
    page's button ran a full check; after a receipt row is edited in SQL it still shows that check until the button
    runs another, which names content_altered at that seq, and the front page then says broken."""
    make_user("auditor", "otto")
    with ctrlrun.context(agent="support-agent"):
        for n in range(3):
            refund(payment_id=f"txn_{n}", amount=100)

    console.login("otto")
    chain = tile(console, "receipt/verify")
    assert chain.text.split()[0] == "unchecked" and "attention" in chain.get_attribute("class")
    console.shot("index-unchecked")
    console.click(chain)
    console.shot("verify-unchecked")
    assert console.by_id("ctrlrun-last-check").text.startswith("The chain has never been checked")
    console.click(console.by_id("ctrlrun-run-check"))
    console.shot("verify-intact")
    assert console.by_id("ctrlrun-chain").text.startswith("The chain is intact")
    console.open("/admin/")
    chain = tile(console, "receipt/verify")
    assert chain.text.split("\n") == ["intact", "receipt chain intact, checked just now (full, up to receipt 3); "
                                                 "0 receipts written since"]
    assert chain.get_attribute("class") == "tile chain "
    console.shot("index-intact")

    tampered = Receipt.objects.get(seq=2)
    with evidence_unguarded(), connection.cursor() as cursor:  # as someone who can drop the triggers
        cursor.execute(f"UPDATE {connection.ops.quote_name(Receipt._meta.db_table)} SET document = %s WHERE seq = 2",
                       [tampered.document.replace('"amount":100', '"amount":100000')])

    console.open("/admin/")
    assert tile(console, "receipt/verify").text.split()[0] == "intact"  # the last check's result: no re-hash
    console.click(tile(console, "receipt/verify"))
    assert console.by_id("ctrlrun-last-check").text.startswith("Last check: intact")
    console.click(console.by_id("ctrlrun-run-check"))
    console.shot("verify")
    assert console.by_id("ctrlrun-chain").text.startswith("The chain is broken: 2 breaks")
    breaks = [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")][:2]
              for row in console.driver.find_elements(By.CSS_SELECTOR, "#ctrlrun-breaks tbody tr")]
    assert breaks == [["content_altered", "receipt 2"], ["link_broken", "receipt 3"]]
    console.click(console.driver.find_element(By.LINK_TEXT, "receipt 2"))  # the break names it: a link
    console.shot("break-receipt")
    assert [r.text.split()[0] for r in console.driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")] == ["2"]
    console.open("/admin/")
    chain = tile(console, "receipt/verify")
    assert chain.text.split()[0] == "broken" and "alert" in chain.get_attribute("class")
    assert "(full, up to receipt 3): 2 breaks" in chain.text
    console.shot("index")
    console.open("/admin/ctrlrun/receipt/")
    console.shot("receipt-list")
    console.click(row_link(console, tampered.receipt_id))
    console.shot("receipt-detail")
    assert shown_json(console)["arguments"]["amount"] == 100000


def test_front_page_shows_the_last_checks_result_and_age(console, refund, clock):
    """After an incremental check from the command, the front page shows intact, its age, its mode and position and
    what was written since, styled by the tag's own stylesheet; once older than the threshold it turns to warning."""
    from io import StringIO

    from django.core.management import call_command

    make_user("auditor", "otto")
    with ctrlrun.context(agent="support-agent"):
        for n in range(2):
            refund(payment_id=f"txn_{n}", amount=100)
    call_command("receipts", "--verify-chain", "--incremental", stdout=StringIO())
    clock.advance(minutes=4)
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_9", amount=100)

    console.login("otto")
    chain = tile(console, "receipt/verify")
    assert chain.text.split("\n") == ["intact", "receipt chain intact, checked 4 minutes ago (incremental, up to "
                                                 "receipt 2); 1 receipt written since"]
    green = chain.value_of_css_property("border-left-color")
    assert chain.value_of_css_property("border-left-width") == "6px"  # overview.css, linked by the tag itself
    console.shot("index")
    clock.advance(days=2)
    console.open("/admin/")
    chain = tile(console, "receipt/verify")
    assert "older than 1 day" in chain.text and "attention" in chain.get_attribute("class")
    assert chain.value_of_css_property("border-left-color") != green
    console.shot("index-stale")
