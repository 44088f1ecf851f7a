"""M-of-N in a real headless Chromium at 1280 px: two people of finance approve one refund in the
console; the page says "1 of 2 approvals", by whom, and the role still needed, then the agent's retry
runs and its receipt names both. Every page visited is photographed for the reviewer."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

import ctrlrun
from ctrlrun.models import Approval
from tests.support import APPROVED_AMOUNT, TWO_OF_FINANCE_POLICY as TWO_OF_FINANCE, make_user, row_link, shown_json

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")



def approve(console, request_id: str, tally: str) -> None:
    console.open("/admin/ctrlrun/approval/")
    console.click(console.request_link(request_id))
    console.click(console.by_id("ctrlrun-approve"))
    assert tally in console.by_id("ctrlrun-approvals").text  # the confirmation says where it stands too
    console.shot(f"approvers-confirm-{tally.split()[0]}")
    console.click(console.by_id("ctrlrun-confirm"))


def test_two_of_finance_approve_and_the_page_says_how_many_and_who(console, refund, remote, use_policy):
    use_policy(TWO_OF_FINANCE)
    group, _ = Group.objects.get_or_create(name="finance")
    for name in ("ana", "ben"):
        make_user("approver", name).groups.add(group)
    with ctrlrun.context(agent="support-agent", user="rita"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    request_id = caught.value.request_id

    console.login("ana")
    console.open("/admin/ctrlrun/approval/")
    console.click(console.request_link(request_id))
    box = console.by_id("ctrlrun-approvals").text
    assert "0 of 2 approvals" in box and "the role finance (control four-eyes)" in box
    console.shot("approvers-none-yet")
    approve(console, request_id, "0 of 2 approvals")
    [said] = console.messages()
    assert said.startswith(f"Your approval of request {request_id} is recorded: 1 of 2 approvals"), said
    box = console.by_id("ctrlrun-approvals").text
    assert "1 of 2 approvals" in box and "approved by ana" in box and "Still needed: 1 more person" in box
    assert "You already approved it" in box and not console.has("ctrlrun-approve") and console.has("ctrlrun-deny")
    console.shot("approvers-one-of-two")
    console.driver.delete_all_cookies()  # ana leaves; ben signs in on the same browser

    console.login("ben")
    approve(console, request_id, "1 of 2 approvals")
    decision = console.by_id("ctrlrun-decision").text
    assert "This request is granted (answered by ben)" in decision and "2 of 2 approvals" in decision
    assert "approved by ana" in decision and "ben" in decision
    console.shot("approvers-two-of-two")
    assert Approval.objects.get(pk=request_id).status == "granted"

    with ctrlrun.context(agent="support-agent", user="rita"), ctrlrun.with_approval(request_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    console.open("/admin/ctrlrun/receipt/")
    console.click(row_link(console, next(iter(shown_receipts(request_id)))))
    document = shown_json(console)
    assert [a["user"] for a in document["approvers"]] == ["ana", "ben"]
    console.shot("approvers-receipt")


def shown_receipts(request_id: str) -> list[str]:
    import json

    from ctrlrun.models import Receipt

    return [r.receipt_id for r in Receipt.objects.all() if json.loads(r.document)["approval_id"] == request_id
            and json.loads(r.document)["result"] == "committed"]
