"""Delegations in the console (§C3): the tree, read-only for the evidence readers, Revoke… for holders
of ctrlrun.revoke_delegation through a confirmation page (POST, CSRF), logged, the Django user named
as revoked_by. Django's test client on a real database."""
from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.test import Client

import ctrlrun
from ctrlrun.control import default_control
from ctrlrun.models import Delegation, Event
from tests.support import DELEGABLE_CHILD, GRANDCHILD, login_redirect, policy_text, text, url
from tests.support import BUDGETED_CHILD, BUDGETED_DELEGATION_POLICY

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

POLICY = policy_text("delegation")

ROLES = ["superuser", "approver", "resolver", "auditor", "staff", "outsider", "anonymous"]


@pytest.fixture
def tree(use_policy):
    use_policy(POLICY)
    control = default_control()
    parent = control.delegate("support", DELEGABLE_CHILD, by="orchestrator")
    child = control.delegate(parent.id, GRANDCHILD, by="worker")
    return parent, child


def revoker(as_role, username: str = "rev"):
    user = as_role("auditor", username)
    user.user_permissions.add(Permission.objects.get(codename="revoke_delegation"))
    return user


@pytest.mark.parametrize("role", ROLES)
def test_who_sees_the_tree(role, tree, as_role, client):
    as_role(role)
    path = url("ctrlrun_delegation_changelist")
    response = client.get(path)
    if role in ("outsider", "anonymous"):
        assert login_redirect(response, path)
    elif role == "staff":
        assert response.status_code == 403
    else:
        assert response.status_code == 200
        body = text(response)
        assert tree[0].id in body and tree[1].id in body and 'data-root="support"' in body
        assert ("Revoke…" in body) is (role == "superuser")
    revoke = url("ctrlrun_delegation_revoke", quote(tree[0].id))
    if role in ("approver", "resolver", "auditor", "staff"):
        assert client.post(revoke).status_code == 403
    assert not Delegation.objects.filter(revoked_at__isnull=False).exists()


def test_revoke_through_the_confirmation_page(tree, as_role, client):
    parent, child = tree
    revoker(as_role)
    body = text(client.get(url("ctrlrun_delegation_changelist")))
    assert "Revoke…" in body and "depth" in body and "orchestrator via api" in body
    page = client.get(url("ctrlrun_delegation_revoke", quote(parent.id)))
    assert page.status_code == 200
    shown = text(page)
    assert "You are about to revoke this delegation" in shown and child.id in shown and "rev" in shown
    assert Delegation.objects.get(pk=parent.id).revoked_at is None  # a GET changes nothing
    checked = Client(enforce_csrf_checks=True)
    checked.force_login(page.wsgi_request.user)
    assert checked.post(url("ctrlrun_delegation_revoke", quote(parent.id))).status_code == 403  # no CSRF token
    done = client.post(url("ctrlrun_delegation_revoke", quote(parent.id)), follow=True)
    assert "Revoked " + parent.id in text(done)
    row = Delegation.objects.get(pk=parent.id)
    assert row.revoked_by == "rev" and row.revoked_at is not None
    assert Event.objects.get(type="DELEGATION_REVOKED").data == {"delegation_id": parent.id, "revoked_by": "rev"}
    assert LogEntry.objects.get(object_id=parent.id).change_message == f"revoked {parent.id}"
    body = text(client.get(url("ctrlrun_delegation_changelist")))
    assert "revoked" in body and "cut: revoked above" in body
    again = client.post(url("ctrlrun_delegation_revoke", quote(parent.id)), follow=True)
    assert "already revoked" in text(again)
    assert Event.objects.filter(type="DELEGATION_REVOKED").count() == 1
    with pytest.raises(ctrlrun.AuthorityDenied, match="authority_revoked"):
        default_control().call("stripe.refund", {"payment_id": "p1", "amount": 1}, lambda: "ok", principal="helper")


def test_never_edited_and_no_such_delegation(tree, as_role, client):
    as_role("superuser")
    parent, _ = tree
    before = Delegation.objects.values().get(pk=parent.id)
    assert client.get(url("ctrlrun_delegation_add")).status_code == 403
    assert client.post(url("ctrlrun_delegation_change", quote(parent.id)), {"revoked_by": "x"}).status_code == 403
    assert client.post(url("ctrlrun_delegation_delete", quote(parent.id)), {"post": "yes"}).status_code == 403
    page = client.get(url("ctrlrun_delegation_change", quote(parent.id)))  # the admin's own links quote the pk
    assert page.status_code == 200 and parent.id in text(page) and 'name="_save"' not in text(page)
    assert Delegation.objects.values().get(pk=parent.id) == before
    assert client.get(url("ctrlrun_delegation_revoke", "dlg_" + "0" * 32)).status_code == 404


def test_hostile_names_are_shown_escaped(use_policy, as_role, client):
    use_policy(POLICY.replace("agent: orchestrator", 'agent: "orch*"'))
    default_control().delegate("support", DELEGABLE_CHILD.replace("worker", "w<script>x</script>\u202e"),
                               by="orch<b>1</b>")
    as_role("auditor")
    raw = client.get(url("ctrlrun_delegation_changelist")).content.decode()
    assert "<script>x" not in raw and "<b>1" not in raw and "\u202e" not in raw


def test_ids_the_admin_would_unquote_still_open(tree, as_role, client):
    """An id like dlg_24ab... holds '_24', which the admin's unquote reads as '$': every link is quoted."""
    parent, _ = tree
    row = Delegation.objects.get(pk=parent.id)
    Delegation.objects.create(delegation_id="dlg_24" + "a" * 30, parent_id="support", depth=1,
                              grant_json=row.grant_json, created_by_agent="orchestrator", created_via="api",
                              created_at=row.created_at)
    revoker(as_role)
    page = client.get(url("ctrlrun_delegation_changelist"))
    link = url("ctrlrun_delegation_revoke", quote("dlg_24" + "a" * 30))
    assert link in page.content.decode()
    assert client.get(link).status_code == 200
    assert client.get(url("ctrlrun_delegation_change", quote("dlg_24" + "a" * 30))).status_code == 200


def test_a_delegations_budgets_are_written_as_everywhere_else(use_policy, as_role, client):
    """The tree writes a budget as the Grants page and inspect --grant do: its cap and window in words,
    money as money (not '≤ 100000 / 172800s')."""
    use_policy(BUDGETED_DELEGATION_POLICY)
    made = default_control().delegate("support", BUDGETED_CHILD, by="orchestrator")
    revoker(as_role)
    body = " ".join(text(client.get(url("ctrlrun_delegation_changelist"))).split())
    assert "budget amount: at most EUR 5,000.00 per day" in body  # the root grant's
    assert "budget amount: at most EUR 1,000.00 per 2 days" in body and "budget count: at most 5 per hour" in body
    assert "≤" not in body and "172800s" not in body
    revoke = " ".join(text(client.get(url("ctrlrun_delegation_revoke", quote(made.id)))).split())
    assert "budget amount: at most EUR 1,000.00 per 2 days" in revoke
