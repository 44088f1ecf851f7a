"""Delegations in a real headless Chromium at 1280 px: the tree, Revoke… -> the confirmation page ->
revoked, and the next call under the revoked delegation refused authority_revoked. Photographed."""
from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from selenium.webdriver.common.by import By

import ctrlrun
from ctrlrun.control import default_control
from ctrlrun.models import Delegation, Event
from tests.support import CHILD, DELEGABLE_CHILD, GRANDCHILD, make_user, policy_text

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

POLICY = policy_text("delegation")


def test_an_operator_revokes_a_delegation_from_the_tree(console, use_policy):
    use_policy(POLICY)
    control = default_control()
    parent = control.delegate("support", DELEGABLE_CHILD, by="orchestrator")
    child = control.delegate(parent.id, GRANDCHILD, by="worker")
    other = control.delegate("support", CHILD.replace("worker", "reporter"), by=ctrlrun.Principal("orchestrator", "alice"))
    assert control.call("stripe.refund", {"payment_id": "p1", "amount": 10}, lambda: "ok", principal="helper") == "ok"
    user = make_user("auditor", "rita")
    user.user_permissions.add(Permission.objects.get(codename="revoke_delegation"))

    console.login("rita")
    console.click(console.link("Delegations"))
    assert console.path() == "/admin/ctrlrun/delegation/"
    body = console.text()
    for expected in (parent.id, child.id, other.id, "worker", "helper", "orchestrator/alice via api", "live"):
        assert expected in body, expected
    assert console.driver.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")  # fits 1280 px
    console.shot("tree")

    row = console.by_id(f"row-{parent.id}")
    console.click(row.find_element(By.CSS_SELECTOR, "a.ctrlrun-revoke"))
    assert console.path() == f"/admin/ctrlrun/delegation/{quote(parent.id)}/revoke/"
    page = console.text()
    assert "You are about to revoke this delegation" in page and child.id in page and "rita" in page
    console.shot("confirm")
    assert Delegation.objects.get(pk=parent.id).revoked_at is None

    console.click(console.by_id("ctrlrun-confirm"))
    assert console.path() == "/admin/ctrlrun/delegation/"
    assert any(f"Revoked {parent.id}" in m for m in console.messages())
    assert "revoked" in console.by_id(f"row-{parent.id}").text
    assert "cut: revoked above" in console.by_id(f"row-{child.id}").text
    assert "live" in console.by_id(f"row-{other.id}").text
    console.shot("revoked")
    assert Delegation.objects.get(pk=parent.id).revoked_by == "rita"
    assert Event.objects.get(type="DELEGATION_REVOKED").data == {"delegation_id": parent.id, "revoked_by": "rita"}

    with pytest.raises(ctrlrun.AuthorityDenied) as refused:
        control.call("stripe.refund", {"payment_id": "p2", "amount": 10}, lambda: "ok", principal="helper")
    assert (refused.value.reason, refused.value.delegation_id) == ("authority_revoked", child.id)
    assert control.call("stripe.refund", {"payment_id": "p3", "amount": 10}, lambda: "ok",
                        principal=ctrlrun.Principal("reporter")) == "ok"
