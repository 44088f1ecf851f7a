"""Approvers hear about a request: mail over a real SMTP server on loopback (aiosmtpd, Django's smtp
EmailBackend), who is told and who is not, hostile text in the mail, and an SMTP server that is down or
refuses: retried with backoff, logged, never failing the agent's call."""
from __future__ import annotations

import datetime as dt
import re
from types import SimpleNamespace

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group, User
from django.core.management import call_command

import ctrlrun
from ctrlrun import notify, store
from tests.support import SmtpServer, ask, closed_port, make_user, smtp_settings

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

ROLE_POLICY = """\
schema: ctrlrun.policy/v6
controls:
  four-eyes: {title: "Refunds over 500 need finance", approver_role: finance}
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gte: 0, amount_lte: 50000 }
        decision: allow
      - when: { amount_gte: 0, amount_lte: 1000000 }
        decision: approve
        controls: [four-eyes]
      - decision: deny
"""


@pytest.fixture
def notifier(settings):
    settings.CTRLRUN_NOTIFY_BASE_URL = "https://ops.example.test"
    notify.connect_signal_receiver()
    yield settings
    notify.disconnect_signal_receiver()


def _deliveries(approval_id: str) -> dict[str, object]:
    return {d.recipient: d for d in store.notifications.deliveries_for(approval_id)}


def test_the_console_approvers_are_mailed_over_smtp_with_a_link(notifier, refund):
    make_user("approver", "ana")
    make_user("auditor", "otto")  # may read, may not decide: not told
    with SmtpServer() as smtp:
        smtp_settings(notifier, smtp.port)
        request_id = ask(refund, "txn_mail")
    [mail] = smtp.mails
    assert mail["To"] == "ana@example.com" and mail["X-Envelope-To"] == "ana@example.com"
    assert mail["Subject"] == f"ctrlrun: approve stripe.refund? (request {request_id})"
    body = mail.get_content()
    assert '"payment_id": "txn_mail"' in body and "support-agent asks to run stripe.refund" in body
    assert "may decide approvals (ctrlrun.decide_approval)" in body
    [link] = re.findall(r"https://ops\.example\.test/\S+", body)
    assert f"/admin/ctrlrun/approval/{quote(request_id)}/link/" in link  # as the admin quotes a key
    [delivery] = store.notifications.deliveries_for(request_id)
    assert (delivery.recipient, delivery.status, delivery.attempts, delivery.signature_ok) == ("ana", "sent", 1, True)
    assert store.get_approval(request_id).status == "pending"  # a mail answers nothing


def test_the_requesting_user_and_a_user_without_an_address_are_recorded_but_not_mailed(notifier, refund):
    make_user("approver", "ana")
    make_user("approver", "bea")
    User.objects.filter(username="bea").update(email="")
    with SmtpServer() as smtp:
        smtp_settings(notifier, smtp.port)
        make_user("approver", "cid")
        request_id = ask(refund, "txn_own", user="ANA")  # made for ana, however the name is written
    assert [m["To"] for m in smtp.mails] == ["cid@example.com"]
    found = _deliveries(request_id)
    assert found["ana"].status == "dropped" and "on their behalf" in found["ana"].last_error
    assert found["bea"].status == "dropped" and "no email address" in found["bea"].last_error


def test_the_configured_list_is_told_when_no_role_is_pinned(notifier, refund):
    make_user("approver", "ana")
    User.objects.create_user("fay", "fay@example.com", is_staff=True)  # in no group: the list says so
    User.objects.create_user("gus", "gus@example.com")  # not staff: the link would lead nowhere for him
    notifier.CTRLRUN_NOTIFY_RECIPIENTS = ["fay", "gus", "nobody-here"]
    with SmtpServer() as smtp:
        smtp_settings(notifier, smtp.port)
        request_id = ask(refund, "txn_list")
    assert [m["To"] for m in smtp.mails] == ["fay@example.com"]
    found = _deliveries(request_id)
    assert found["fay"].basis == "setting" and list(found) == ["fay", "gus"]
    assert found["gus"].status == "dropped" and "not staff" in found["gus"].last_error


@pytest.fixture
def roles_built(use_policy):
    """A policy whose approve rule cites a control with an ``approver_role``: the request pins it."""
    use_policy(ROLE_POLICY)


def test_the_holders_of_the_pinned_role_are_told_and_override_replaces_them(notifier, refund, roles_built):
    finance = Group.objects.create(name="finance")
    make_user("approver", "ana")  # may decide, but holds no finance role
    gil = User.objects.create_user("gil", "gil@example.com", is_staff=True)
    finance.user_set.add(gil)
    with SmtpServer() as smtp:
        smtp_settings(notifier, smtp.port)
        request_id = ask(refund, "txn_role")
        assert [m["To"] for m in smtp.mails] == ["gil@example.com"]
        assert _deliveries(request_id)["gil"].basis == 'role:["finance"]'
        assert "you hold the role finance the request pins" in smtp.mails[0].get_content()
        notifier.CTRLRUN_NOTIFY_RECIPIENTS, notifier.CTRLRUN_NOTIFY_RECIPIENTS_OVERRIDE = ["ana"], True
        other = ask(refund, "txn_role2")
        assert [m["To"] for m in smtp.mails[1:]] == ["ana@example.com"]
    assert list(_deliveries(other)) == ["ana"]


def test_a_recipient_removed_from_the_role_before_delivery_is_dropped(notifier, refund, roles_built, clock):
    finance = Group.objects.create(name="finance")
    gil = User.objects.create_user("gil", "gil@example.com", is_staff=True)
    hal = User.objects.create_user("hal", "hal@example.com", is_staff=True)
    finance.user_set.add(gil, hal)
    smtp_settings(notifier, closed_port())  # the first try fails: both wait for a retry
    request_id = ask(refund, "txn_left")
    assert {d.status for d in _deliveries(request_id).values()} == {"pending"}
    finance.user_set.remove(hal)
    clock.advance(minutes=2)
    with SmtpServer() as smtp:
        smtp_settings(notifier, smtp.port)
        call_command("notify")
    assert [m["To"] for m in smtp.mails] == ["gil@example.com"]
    found = _deliveries(request_id)
    assert found["gil"].status == "sent"
    assert found["hal"].status == "dropped" and found["hal"].last_error == "they no longer hold the role finance"


def test_newlines_and_bidi_controls_reach_no_header(notifier, refund):
    make_user("approver", "ana")
    hostile = "txn_7\r\nBcc: mallory@evil.test\r\nSubject: ok\u202e"
    with SmtpServer() as smtp:
        smtp_settings(notifier, smtp.port)
        with ctrlrun.context(agent="agent\r\nBcc: mallory@evil.test\u202e"):
            with pytest.raises(ctrlrun.ApprovalRequired):
                refund(payment_id=hostile, amount=60000)
    [mail] = smtp.mails
    assert mail["Bcc"] is None and mail["X-Envelope-To"] == "ana@example.com"
    assert mail.get_all("Subject") == [mail["Subject"]] and "\n" not in mail["Subject"]
    body = mail.get_content()
    assert "\u202e" not in body and "\\u202e" in body and "\\r\\nBcc" in body
    # The action's name is the policy's (its keys refuse such characters); the subject holds either way.
    subject = notify.subject_for(SimpleNamespace(action="a\r\nBcc: x@evil.test\u2067" + "n" * 200, approval_id="apr_1"))
    assert "\r" not in subject and "\n" not in subject and "\u2067" not in subject
    assert "\\u000d\\u000aBcc" in subject and "\\u2067" in subject and len(subject) < 140


def test_an_smtp_server_down_never_fails_the_call_and_is_retried_with_backoff(notifier, refund, clock, caplog):
    make_user("approver", "ana")
    smtp_settings(notifier, closed_port())
    request_id = ask(refund, "txn_down")  # the call's own outcome, ApprovalRequired, as without mail
    [delivery] = store.notifications.deliveries_for(request_id)
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.last_error.startswith("ConnectionRefusedError")
    assert delivery.next_try == clock() + dt.timedelta(seconds=60)
    assert "mail about %s to ana failed (attempt 1 of 5)" % request_id in caplog.text

    call_command("notify")  # not due yet: nothing tried
    assert store.notifications.deliveries_for(request_id)[0].attempts == 1
    clock.advance(seconds=61)
    with SmtpServer(refuse="451 4.3.0 try again later") as refusing:
        smtp_settings(notifier, refusing.port)
        call_command("notify")
    [delivery] = store.notifications.deliveries_for(request_id)
    assert (delivery.status, delivery.attempts) == ("pending", 2) and "451" in delivery.last_error
    assert delivery.next_try == clock() + dt.timedelta(seconds=120)  # doubled
    clock.advance(seconds=121)
    with SmtpServer() as smtp:
        smtp_settings(notifier, smtp.port)
        call_command("notify")
    assert [m["To"] for m in smtp.mails] == ["ana@example.com"]
    assert store.notifications.deliveries_for(request_id)[0].status == "sent"


def test_after_the_last_attempt_a_delivery_fails_and_says_why(notifier, refund, clock, caplog):
    make_user("approver", "ana")
    notifier.CTRLRUN_NOTIFY_MAX_ATTEMPTS = 2
    smtp_settings(notifier, closed_port())
    request_id = ask(refund, "txn_never")
    clock.advance(seconds=61)
    call_command("notify")
    [delivery] = store.notifications.deliveries_for(request_id)
    assert (delivery.status, delivery.attempts, delivery.next_try) == ("failed", 2, None)
    assert "failed 2 times, giving up" in caplog.text


def test_a_request_answered_before_its_retry_is_not_mailed_again(notifier, refund, clock):
    make_user("approver", "ana")
    smtp_settings(notifier, closed_port())
    request_id = ask(refund, "txn_answered")
    store.answer_approval(request_id, True, by="dana")
    clock.advance(seconds=61)
    call_command("notify")
    [delivery] = store.notifications.deliveries_for(request_id)
    assert delivery.status == "dropped" and delivery.last_error == "the request is already granted"


def test_a_wrong_setting_is_one_clear_line(notifier):
    notifier.CTRLRUN_NOTIFY_RECIPIENTS = "ana"
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="CTRLRUN_NOTIFY_RECIPIENTS must be a list of console usernames"):
        call_command("notify")


def test_both_drivers_leave_the_call_as_it_was_and_the_mail_recorded(notifier, drive, use_policy):
    """Sync and async (the async driver's phases, and so the receiver, run on ctrlrun's store threads):
    the approve decision raises ApprovalRequired as ever, with the SMTP server down."""
    from ctrlrun.control import Control

    make_user("approver", "ana")
    smtp_settings(notifier, closed_port())
    control = Control.from_file(use_policy())
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        drive(control, "stripe.refund", {"payment_id": "txn_drive", "amount": 60000}, "support-agent")
    [delivery] = store.notifications.deliveries_for(asked.value.request_id)
    assert (delivery.status, delivery.attempts) == ("pending", 1)
    assert delivery.last_error.startswith("ConnectionRefusedError")


def test_without_the_console_address_the_mail_waits_and_its_delivery_says_what_to_set(notifier, refund):
    make_user("approver", "ana")
    del notifier.CTRLRUN_NOTIFY_BASE_URL
    with SmtpServer() as smtp:
        smtp_settings(notifier, smtp.port)
        request_id = ask(refund, "txn_no_url")
    assert smtp.mails == []
    [delivery] = store.notifications.deliveries_for(request_id)
    assert delivery.status == "pending" and "settings.CTRLRUN_NOTIFY_BASE_URL is not set" in delivery.last_error
