"""The approved-policy flow in a real headless Chromium at 1280 px: a person proposes a candidate,
another reads its diff and the replay beside Approve and approves it, the proposer runs the approved
proposal. Photographed."""
from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote

import ctrlrun
from ctrlrun import store
from ctrlrun.control import default_control
from tests.support import GOVERNED_POLICY as GOVERNED, make_user, receipts

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

WIDER = GOVERNED.replace("amount_lte: 1000", "amount_lte: 5000")


def test_a_policy_is_proposed_reviewed_approved_and_committed(console, use_policy):
    use_policy(GOVERNED)
    control = default_control()
    assert control.call("stripe.refund", {"payment_id": "p1", "amount": 10}, lambda: "ok", principal="agent") == "ok"
    with pytest.raises(ctrlrun.ActionDenied):
        control.call("stripe.refund", {"payment_id": "p2", "amount": 3000}, lambda: "ok", principal="agent")
    denied = receipts()[-1]["receipt_id"]
    make_user("approver", "olivia")
    make_user("approver", "ana")

    console.login("olivia")
    console.open("/admin/ctrlrun/policydocument/")
    console.click(console.by_id("ctrlrun-propose-link"))
    assert console.path() == "/admin/ctrlrun/policydocument/propose/"
    console.by_id("id_text").send_keys(WIDER)
    console.shot("propose")
    console.click(console.by_id("ctrlrun-propose"))
    approval = store.list_approvals()[0]
    assert console.path() == f"/admin/ctrlrun/approval/{quote(approval.approval_id)}/change/"
    assert any("another person must approve it" in m for m in console.messages())
    console.shot("proposed")

    console.driver.delete_all_cookies()
    console.login("ana")
    console.open(f"/admin/ctrlrun/approval/{quote(approval.approval_id)}/change/")
    diff = console.by_id("ctrlrun-policy-diff").text
    assert "-      - when: { amount_lte: 1000 }" in diff and "+      - when: { amount_lte: 5000 }" in diff
    replay = console.by_id("ctrlrun-policy-replay").text
    assert denied in replay and "deny (rule[1])" in replay and "allow (rule[0])" in replay
    # Beside each other, and beside the Approve button: the diff on the left, the replay on the right.
    approve, pane = console.by_id("ctrlrun-approve"), console.by_id("ctrlrun-policy-replay")
    assert pane.location["x"] > console.by_id("ctrlrun-policy-diff").location["x"] + 300
    assert pane.location["y"] - approve.location["y"] < 400
    console.shot("review")
    assert console.driver.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")  # fits 1280 px
    console.click(approve)
    console.shot("confirm-approve")
    console.click(console.by_id("ctrlrun-confirm"))
    assert store.get_approval(approval.approval_id).status == "granted"

    console.driver.delete_all_cookies()
    console.login("olivia")
    console.open(f"/admin/ctrlrun/approval/{quote(approval.approval_id)}/change/")
    console.shot("granted")
    console.click(console.by_id("ctrlrun-commit"))
    assert console.path() == "/admin/ctrlrun/policydocument/propose/"
    console.shot("confirm-commit")
    console.click(console.by_id("ctrlrun-confirm"))
    assert any("is approved" in m for m in console.messages()), console.messages()
    console.shot("committed")
    last = receipts()[-1]
    assert (last["action"], last["result"]) == ("ctrlrun.policy.change", "committed")
