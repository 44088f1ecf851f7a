"""The retention page in a real headless Chromium at 1280 px: the last prune, the anchors and the holds
(live, released, and one released around ctrlrun, still holding); only with ctrlrun.view_retention."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.db.models import F

import ctrlrun
from ctrlrun import anchor, retention, store
from ctrlrun.models import Hold
from tests.support import make_user

pytestmark = pytest.mark.usefixtures("store_db", "console_groups", "files")


def test_an_operator_reads_the_retention_page(console, use_policy, refund, settings, tmp_path):
    use_policy()
    with ctrlrun.context(agent="support-agent"):
        for n in range(6):
            refund(payment_id=f"txn_{n}", amount=10)
    settings.CTRLRUN_ANCHOR_FILE = str(tmp_path / "anchors.jsonl")
    provider = anchor.load_provider(None)
    store.retention.place_hold("litigation", 5, None, "case <42>", "legal")
    store.retention.place_hold("audit", 1, 1, "audit 2026", "legal")
    store.retention.release_hold("audit", "legal")
    store.retention.place_hold("forged", 6, 6, "someone", "legal")
    Hold.objects.filter(pk="forged").update(released_at=F("placed_at"), released_by="intruder")  # around ctrlrun
    done = retention.prune(through=3, older_than=retention.parse_duration("0s"), by="ops", reason="90-day retention",
                           anchor=provider)
    assert done.receipts_deleted == 3 and done.anchored

    plain = make_user("auditor", "otto")
    console.login("otto")
    console.open("/admin/ctrlrun/hold/")
    assert not console.has("ctrlrun-retention")  # an auditor without the permission: no page
    plain.user_permissions.add(Permission.objects.get(codename="view_retention"))
    console.open("/admin/ctrlrun/hold/")
    assert console.path() == "/admin/ctrlrun/hold/"
    prune_line = console.by_id("ctrlrun-last-prune").text
    assert "through receipt seq 3" in prune_line and "ops" in prune_line and "90-day retention" in prune_line
    assert "Latest anchor: receipt seq 3" in console.by_id("ctrlrun-anchors").text
    body = console.text()
    for expected in ("litigation", "5..end", "case <42>", "live", "audit", "released", "forged", "not signed: holds"):
        assert expected in body, expected
    console.shot("retention-page")
    assert console.driver.execute_script("""
        const table = document.getElementById('result_list'), box = table.parentElement;
        return document.documentElement.scrollWidth <= document.documentElement.clientWidth
            && box.scrollWidth <= box.clientWidth;""")  # fits 1280 px
