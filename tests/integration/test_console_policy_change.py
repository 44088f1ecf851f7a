"""The console's half of the approved-policy flow (§D7): a person proposes a policy (``request.user``
is the proposer), another sees the candidate's diff and the replay beside Approve, approves, and
the proposer runs the approved proposal. Django's test client on the real store."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control, default_control
from tests.support import GOVERNED_POLICY as GOVERNED, approval_url, has_id, receipts, shown_messages, text, url

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

#: The candidate, with a line a page must escape.
WIDER = GOVERNED.replace("amount_lte: 1000", "amount_lte: 5000") + "# <script>alert(1)</script>\n"


def propose(client, body: str = WIDER):
    return client.post(url("ctrlrun_policydocument_propose"), {"text": body}, follow=True)


def test_propose_review_approve_and_commit(client, as_role, use_policy):
    use_policy(GOVERNED)
    control = default_control()
    with pytest.raises(ctrlrun.ActionDenied):
        control.call("stripe.refund", {"payment_id": "p1", "amount": 3000}, lambda: "ok", principal="agent")
    denied = receipts()[-1]["receipt_id"]

    as_role("approver", "olivia")
    page = client.get(url("ctrlrun_policydocument_changelist"))
    assert has_id(page, "ctrlrun-propose-link")
    response = propose(client)
    assert any("another person must approve it" in m for m in shown_messages(response)), shown_messages(response)
    approval = store.list_approvals()[0]
    assert (approval.action, approval.agent, approval.user) == ("ctrlrun.policy.change", "ctrlrun-console", "olivia")
    body = text(response)
    assert "This request was made on your behalf" in body  # the proposer cannot approve it
    assert not has_id(response, "ctrlrun-approve")

    client.logout()
    as_role("approver", "ana")
    page = client.get(approval_url(approval.approval_id))
    content = page.content.decode()
    assert has_id(page, "ctrlrun-approve") and has_id(page, "ctrlrun-policy-diff")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in content and "<script>alert(1)" not in content
    assert '<span class="ctrlrun-diff-del">-      - when: { amount_lte: 1000 }</span>' in content
    assert '<span class="ctrlrun-diff-add">+      - when: { amount_lte: 5000 }</span>' in content
    replay = text(page).split('id="ctrlrun-policy-replay"')[1]
    assert denied in replay and "deny (rule[1])" in replay and "allow (rule[0])" in replay
    client.post(approval_url(approval.approval_id, "approve"), {"note": ""})
    assert store.get_approval(approval.approval_id).status == "granted"
    assert not has_id(client.get(approval_url(approval.approval_id)), "ctrlrun-commit")  # only the proposer runs it

    client.logout()
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username="olivia"))
    page = client.get(approval_url(approval.approval_id))
    assert has_id(page, "ctrlrun-commit")
    done = client.post(url("ctrlrun_policydocument_propose"), {"approval": approval.approval_id}, follow=True)
    candidate = Control(ctrlrun.policy.parse_policy(WIDER)).policy_hash
    assert any(f"Committed: {candidate} is approved" in m for m in shown_messages(done)), shown_messages(done)
    last = receipts()[-1]
    assert (last["action"], last["result"], last["effect_key"]) == ("ctrlrun.policy.change", "committed",
                                                                    f"policy:{candidate}")


def test_a_candidate_that_does_not_load_is_one_message(client, as_role, use_policy):
    use_policy(GOVERNED)
    as_role("approver", "olivia")
    response = propose(client, "schema: ctrlrun.policy/v6\nactions: [1\n")
    assert response.status_code == 200 and "Traceback" not in text(response)
    assert any("console proposal by olivia" in m for m in shown_messages(response)), shown_messages(response)
    assert store.list_approvals() == []


@pytest.mark.parametrize("role", ["auditor", "staff"])
def test_proposing_needs_the_decide_permission(client, as_role, use_policy, role):
    use_policy(GOVERNED)
    as_role(role)
    assert client.get(url("ctrlrun_policydocument_propose")).status_code == 403
    assert propose(client).status_code == 403
    assert store.list_approvals() == []


def test_a_forged_candidate_row_is_not_diffed(client, as_role, use_policy):
    """The page reads the candidate from the store: a row under its hash that is not ctrlrun's is not shown."""
    from ctrlrun.models import PolicyDocument
    from tests.support import evidence_unguarded

    use_policy(GOVERNED)
    as_role("approver", "olivia")
    propose(client)
    approval = store.list_approvals()[0]
    with evidence_unguarded():
        PolicyDocument.objects.filter(pk=approval.arguments["to"]).update(text=GOVERNED.replace("deny", "allow"))
    client.logout()
    as_role("approver", "ana")
    page = client.get(approval_url(approval.approval_id))
    assert not has_id(page, "ctrlrun-policy-diff")
    assert "Do not approve a change you cannot read" in text(page)
