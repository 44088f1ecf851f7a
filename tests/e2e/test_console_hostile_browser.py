"""An approval whose argument hides U+202E (RIGHT-TO-LEFT OVERRIDE), in a real headless Chromium
at 1280 px: the inbox, the request's page, the confirmation page and the effect record show the
character as a highlighted escape with a warning, never rendered; what the approver reads,
decoded, is exactly what then runs. Every page is photographed for the reviewer."""
from __future__ import annotations

import json

import pytest
from django.contrib.admin.utils import quote
from selenium.webdriver.common.by import By

import ctrlrun
from ctrlrun.models import Approval
from tests.support import make_user

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")

WIDTH, HEIGHT = 1280, 900
APPROVED_AMOUNT = 60000  # in the approve band of the refund policy
HOSTILE_ID = "txn_1\u202e0001"  # renders as "txn_11000" when the override is honoured
HIGHLIGHT = "rgba(186, 33, 33, 1)"  # .ctrlrun-hidden's background (#ba2121)


@pytest.fixture
def narrow(console):
    """The shared console, its window and its screenshots WIDTH x HEIGHT."""
    console.width, console.height = WIDTH, HEIGHT
    console.driver.set_window_size(WIDTH, HEIGHT)
    return console


def viewport_width(console) -> int:
    return console.driver.execute_script("return window.innerWidth")


def assert_shown_escaped(console) -> None:
    """The page's rendered text holds the escape and the warning, never U+202E itself; the escape is highlighted."""
    body = console.text()
    assert "\u202e" not in body
    assert "txn_1\\u202e0001" in body
    warning = console.by_id("ctrlrun-hidden-warning")
    assert warning.is_displayed()
    assert "invisible or direction-changing characters" in warning.text and "exactly what will run" in warning.text
    marks = [m for m in console.driver.find_elements(By.CSS_SELECTOR, "span.ctrlrun-hidden") if m.text == "\\u202e"]
    assert marks and all(m.is_displayed() for m in marks)
    assert marks[-1].value_of_css_property("background-color") == HIGHLIGHT
    assert marks[-1].get_attribute("title") == "U+202E RIGHT-TO-LEFT OVERRIDE"
    assert warning.rect["x"] + warning.rect["width"] <= viewport_width(console)  # the warning fits at 1280 px


def test_override_in_an_argument_is_shown_escaped_and_what_runs_is_what_was_read(narrow, refund, remote):
    """At 1280 px the inbox, request, confirmation and effect pages show txn_1\\u202e0001 escaped with the warning;
    the approved retry runs with exactly the argument the approver read."""
    console = narrow
    make_user("approver", "ana")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id=HOSTILE_ID, amount=APPROVED_AMOUNT)
    request_id = caught.value.request_id

    console.login("ana")
    assert viewport_width(console) <= WIDTH
    console.open("/admin/ctrlrun/approval/")
    console.shot("approval-list")
    inbox = console.text()
    assert "\u202e" not in inbox and "txn_1\\u202e0001" in inbox
    badge = console.driver.find_element(By.CSS_SELECTOR, "#result_list span.ctrlrun-hidden-badge")
    assert badge.is_displayed() and "invisible or direction-changing" in badge.get_attribute("title")

    console.click(console.request_link(request_id))
    console.shot("approval-detail")
    assert_shown_escaped(console)
    assert "This request is waiting for a person" in console.by_id("ctrlrun-decision").text

    console.click(console.by_id("ctrlrun-approve"))
    console.shot("confirmation")
    assert_shown_escaped(console)
    assert "You are about to authorise this exact action, once" in console.text()
    read = json.loads(console.driver.find_element(By.CSS_SELECTOR, "pre.ctrlrun-json").text)
    assert read == {"amount": APPROVED_AMOUNT, "payment_id": HOSTILE_ID}  # the escape decodes to the real argument
    console.by_id("id_note").send_keys("checked the escaped id character by character")
    console.click(console.by_id("ctrlrun-confirm"))
    console.shot("approval-granted")
    assert Approval.objects.get(pk=request_id).status == "granted"

    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id):
        refund(payment_id=read["payment_id"], amount=read["amount"])
    assert remote.calls == [(HOSTILE_ID, APPROVED_AMOUNT)]

    console.open(f"/admin/ctrlrun/effectrecord/{quote('refund:' + HOSTILE_ID)}/change/")
    console.shot("effect-detail")
    assert_shown_escaped(console)
    assert "This effect is committed" in console.by_id("ctrlrun-resolution").text
    assert len(console.shots) == 6  # the login page too


def test_a_request_changed_outside_ctrlrun_says_so_and_offers_no_answer(narrow, refund, remote):
    """A pending request whose row was edited with SQL (its signature fails): the page says so in red, at
    1280 px, with no Approve… or Deny…; the agent's retry with it is refused and nothing runs."""
    from django.db import connection

    from tests.support import evidence_unguarded

    console = narrow
    make_user("approver", "ana")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_edit", amount=APPROVED_AMOUNT)
    request_id = caught.value.request_id
    with evidence_unguarded(), connection.cursor() as cursor:  # as the database's owner could
        cursor.execute('UPDATE "ctrlrun_approval" SET "agent" = %s WHERE "approval_id" = %s',
                       ["trusted-agent", request_id])
    console.login("ana")
    console.open(f"/admin/ctrlrun/approval/{quote(request_id)}/change/")
    box = console.by_id("ctrlrun-tampered")
    assert box.is_displayed() and "changed outside ctrlrun" in box.text
    assert box.rect["x"] + box.rect["width"] <= viewport_width(console)
    assert not console.has("ctrlrun-approve") and not console.has("ctrlrun-deny")
    assert "It cannot be answered: its row was changed outside ctrlrun" in console.by_id("ctrlrun-decision").text
    console.shot("tampered-request")
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id):
        with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
            refund(payment_id="txn_edit", amount=APPROVED_AMOUNT)
    assert refused.value.reason == "tampered" and remote.calls == []
    assert Approval.objects.get(pk=request_id).status == "pending"
