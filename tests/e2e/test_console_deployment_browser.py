"""The deployment check (``verify`` as a console page) in a real headless Chromium at 1280 px: only
with ctrlrun.run_verify; the button grades the deployment and shows each guarantee, and a hold
"released" around ctrlrun fails G30 with the hold named."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.db.models import F

import ctrlrun
from ctrlrun import store
from ctrlrun.models import Hold
from tests.support import make_user

pytestmark = pytest.mark.usefixtures("store_db", "console_groups", "files")


def test_an_operator_grades_the_deployment_from_the_console(console, use_policy, refund):
    use_policy()
    with ctrlrun.context(agent="support-agent"):
        for n in range(3):
            refund(payment_id=f"txn_{n}", amount=10)
    store.run_check(incremental=False, ran_by="test")

    plain = make_user("auditor", "vera")
    console.login("vera")
    console.open("/admin/ctrlrun/receipt/")
    assert not console.has("ctrlrun-deployment-link")  # without the permission: no link,
    console.open("/admin/ctrlrun/receipt/deployment/")
    assert not console.has("ctrlrun-run-verify")  # and no page
    plain.user_permissions.add(Permission.objects.get(codename="run_verify"))
    console.open("/admin/ctrlrun/receipt/")
    console.click(console.by_id("ctrlrun-deployment-link"))
    assert console.path() == "/admin/ctrlrun/receipt/deployment/"
    console.shot("before")
    console.click(console.by_id("ctrlrun-run-verify"))
    summary = console.by_id("ctrlrun-verify-summary").text
    assert "not recorded" in summary, summary
    # the test database is reached as its owner, a superuser on PostgreSQL: X3 says so, and only X3
    superuser = connection.vendor == "postgresql"
    assert ("1 guarantee FAILED" if superuser else "declared guarantees pass") in summary, summary
    assert ("FAIL" if superuser else "not applicable") in console.by_id("ctrlrun-verify-X3").text
    assert "pass" in console.by_id("ctrlrun-verify-G3").text and "duplicate effect refused" in \
        console.by_id("ctrlrun-verify-G3").text
    assert "not applicable" in console.by_id("ctrlrun-verify-G30").text
    console.shot("graded")
    assert console.driver.execute_script("""
        const table = document.getElementById('ctrlrun-verify');
        return document.documentElement.scrollWidth <= document.documentElement.clientWidth
            && table.getBoundingClientRect().right <= document.documentElement.clientWidth;""")  # fits 1280 px

    store.retention.place_hold("case-<9>", 2, None, "case 9", "legal")
    Hold.objects.filter(pk="case-<9>").update(released_at=F("placed_at"), released_by="intruder")  # around ctrlrun
    console.click(console.by_id("ctrlrun-run-verify"))
    row = console.by_id("ctrlrun-verify-G30").text
    assert "FAIL" in row and "case-<9>" in row and "changed outside ctrlrun" in row, row
    assert ("2 guarantees FAILED" if superuser else "1 guarantee FAILED") in console.by_id("ctrlrun-verify-summary").text
    console.shot("a-hold-edited")
