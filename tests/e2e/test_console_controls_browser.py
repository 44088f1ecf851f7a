"""Controls and observe mode in a real headless Chromium at 1280 px: a receipt citing two controls
and an approval show the controls' titles, a long title wraps inside the page, the receipt list
filters by control, and the OBSERVE MODE banner tops every page while an observe-mode policy is
loaded. Receipts come from real protected calls under v4 policies in files; every page is
photographed (tests/e2e/conftest.py says where)."""
from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from selenium.webdriver.common.by import By

import ctrlrun
from ctrlrun.models import Receipt
from tests.support import BANNER, CONTROLS_POLICY, LONG_TITLE, OBSERVE_POLICY, make_user, note, send_email

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")


def controls(console) -> list[dict[str, str]]:
    """The cited controls on the page, as a person sees them (only what is displayed)."""
    items = console.driver.find_elements(By.CSS_SELECTOR, "ul.ctrlrun-controls li")
    return [{"id": li.get_attribute("data-control"), "text": li.text} for li in items if li.is_displayed()]


def fits_the_page(console) -> bool:
    """Nothing wider than the window: no horizontal scrollbar, every cited control inside the viewport."""
    return console.driver.execute_script("""
        const width = document.documentElement.clientWidth;
        if (document.documentElement.scrollWidth > width) return false;
        return [...document.querySelectorAll('ul.ctrlrun-controls li')].every(
            li => li.getBoundingClientRect().right <= width);
    """)


def test_controls_titles_and_the_observe_banner(console, use_policy, refund):
    use_policy(CONTROLS_POLICY)
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_1", amount=100)
        send_email(msg_id="m1")
        note(text="looked at the card")
        with pytest.raises(ctrlrun.ApprovalRequired) as caught:
            refund(payment_id="txn_3", amount=60_000)
    make_user("auditor", "otto")
    console.login("otto")
    assert not console.has("ctrlrun-observe-banner")

    # A receipt citing two controls: ids, titles and the source, in registry order.
    refund_receipt = Receipt.objects.get(action="stripe.refund", result="committed")
    console.open(f"/admin/ctrlrun/receipt/{quote(refund_receipt.receipt_id)}/change/")
    console.shot("receipt-two-controls")
    cited = controls(console)
    assert [c["id"] for c in cited] == ["pci-3.4", "soc2-cc6.1"]
    assert cited[0]["text"] == "pci-3.4 Render PAN unreadable (PCI DSS v4.0 §3.4)"
    assert cited[1]["text"] == "soc2-cc6.1 <b>Logical</b> access & <script>alert(1)</script>"  # text, not markup
    assert fits_the_page(console)

    # A long title wraps inside the page.
    email_receipt = Receipt.objects.get(action="email.send")
    console.open(f"/admin/ctrlrun/receipt/{quote(email_receipt.receipt_id)}/change/")
    console.shot("receipt-long-title")
    cited = controls(console)
    assert [c["id"] for c in cited][-1] == "long-one"
    assert LONG_TITLE.strip() in cited[-1]["text"]
    long_item = console.driver.find_elements(By.CSS_SELECTOR, "ul.ctrlrun-controls li")[-1]
    assert long_item.size["height"] > 2 * console.driver.find_elements(
        By.CSS_SELECTOR, "ul.ctrlrun-controls li")[0].size["height"]  # it wrapped onto several lines
    assert fits_the_page(console)

    # The approval: the controls its call would cite.
    console.open(f"/admin/ctrlrun/approval/{quote(caught.value.request_id)}/change/")
    console.shot("approval-controls")
    assert [c["id"] for c in controls(console)] == ["pci-3.4"]
    assert "Render PAN unreadable" in controls(console)[0]["text"]

    # The receipt list, filtered by a control from the sidebar.
    console.open("/admin/ctrlrun/receipt/")
    console.click(console.driver.find_element(By.PARTIAL_LINK_TEXT, "pci — Card data"))
    console.shot("receipt-list-by-control")
    rows = console.driver.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(rows) == 1 and "audit.note" in rows[0].text

    # Observe mode: the banner on top of every page, before the content. Once a call was decided
    # under the policy (the kernel records its document), the banner links to it.
    use_policy(OBSERVE_POLICY)
    console.open("/admin/")
    assert "ctrlrun.yaml" in console.by_id("ctrlrun-observe-file").text  # not stored yet: the file is named
    with ctrlrun.context(agent="support-agent"):
        note(text="under the observe policy")
    for page, path in (("index", "/admin/"), ("receipt", f"/admin/ctrlrun/receipt/{quote(refund_receipt.receipt_id)}/change/"),
                       ("approvals", "/admin/ctrlrun/approval/")):
        console.open(path)
        console.shot(f"observe-banner-{page}")
        banner = console.by_id("ctrlrun-observe-banner")
        assert banner.is_displayed() and banner.get_attribute("role") == "alert"
        assert " ".join(banner.text.split()).startswith(BANNER), banner.text
        content = console.by_id("content")
        assert banner.location["y"] < content.location["y"]
        assert banner.size["width"] >= 1200  # across the page
        assert fits_the_page(console)
    # A refund the rules deny, run in observe mode: its receipt says what happened and what would have.
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_9", amount=10**9)
    observed = Receipt.objects.get(effect_key="refund:txn_9")
    console.open(f"/admin/ctrlrun/receipt/{quote(observed.receipt_id)}/change/")
    console.shot("observed-receipt")
    page = " ".join(console.text().split())
    assert "Observe mode" in page and "deny" in page and "rule[2]" in page and "committed" in page
    assert fits_the_page(console)
    console.click(console.by_id("ctrlrun-observe-policy"))
    console.shot("observe-policy")
    assert "mode: observe" in console.text()
