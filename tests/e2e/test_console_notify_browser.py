"""Approvers hear about a request, in a real headless Chromium at 1280 px: the mail's link opened by its
addressee (after signing in) leads to the request's page, whose "Who was told" part shows each
delivery; the same link again, or another user's, is a clear page. Photographed for the reviewer."""
from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.core import mail

from ctrlrun import notify, store
from tests.support import SmtpServer, ask, make_user, smtp_settings

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")


def test_an_approver_follows_the_mail_to_the_request_and_sees_who_was_told(console, settings, refund, live_server):
    settings.CTRLRUN_NOTIFY_BASE_URL = live_server.url
    make_user("approver", "ana")
    make_user("approver", "bea")
    make_user("approver", "cy")
    make_user("approver", "dee")
    User.objects.filter(username="cy").update(email="")
    notify.connect_signal_receiver()
    try:
        with SmtpServer(refuse_to={"dee@example.com"}) as smtp:  # dee's mailbox is busy: retried later
            smtp_settings(settings, smtp.port)
            request_id = ask(refund, "txn_browser")
    finally:
        notify.disconnect_signal_receiver()
    sent = {m["To"]: m for m in smtp.mails}
    assert set(sent) == {"ana@example.com", "bea@example.com"}
    [link] = re.findall(re.escape(live_server.url) + r"/\S+", sent["ana@example.com"].get_content())
    [bea_link] = re.findall(re.escape(live_server.url) + r"/\S+", sent["bea@example.com"].get_content())
    assert not mail.outbox

    console.open(link[len(live_server.url):])  # not signed in: the login page first, then back to the link
    assert "/admin/login/" in console.path()
    console.shot("link-needs-login")
    console.driver.find_element("id", "id_username").send_keys("ana")
    console.driver.find_element("id", "id_password").send_keys("console-pass-1")
    console.click(console.driver.find_element("css selector", "input[type=submit]"))
    assert console.path().endswith("/change/"), console.path()
    assert any("Opened from the mail sent to ana" in m for m in console.messages())
    table = console.by_id("ctrlrun-deliveries")
    rows = {r.get_attribute("data-recipient"): r.text for r in table.find_elements("css selector", "tr[data-recipient]")}
    assert "sent" in rows["ana"] and "ana@example.com" in rows["ana"]
    assert "dropped" in rows["cy"] and "no email address" in rows["cy"]
    assert "pending" in rows["dee"] and "450" in rows["dee"]
    assert "ctrlrun.decide_approval" in rows["ana"]
    console.driver.execute_script("document.getElementById('ctrlrun-deliveries').scrollIntoView()")
    console.shot("approval-who-was-told")
    assert console.driver.execute_script(
        "return document.documentElement.scrollWidth <= document.documentElement.clientWidth")  # fits 1280 px
    assert store.get_approval(request_id).status == "pending"

    console.open(link[len(live_server.url):])  # the same link again
    refused = console.by_id("ctrlrun-link-refused")
    assert refused.get_attribute("data-outcome") == "used" and "already used" in refused.text
    console.shot("link-used-again")
    console.open(bea_link[len(live_server.url):])  # bea's link, opened by ana
    refused = console.by_id("ctrlrun-link-refused")
    assert refused.get_attribute("data-outcome") == "not_yours" and "sent to bea" in refused.text
    console.shot("link-of-another-user")
