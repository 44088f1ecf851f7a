"""A mail's link: signed, single use, expiring, its addressee's only, and answering nothing. Each attack
(reused, expired, tampered, another request's, another signed-in user's) gets a clear page and leaves
the request pending and the link's record as it was."""
from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote
from django.core import mail

from ctrlrun import store
from ctrlrun.models import LinkUse
from tests.support import approval_url, ask, login_redirect, make_user, shown_messages, text

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")


@pytest.fixture
def mailed(settings, refund):
    """ana and bea (approvers) are mailed about one request; (request id, {username: link path})."""
    from ctrlrun import notify

    settings.CTRLRUN_NOTIFY_BASE_URL = "https://ops.example.test"
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    make_user("approver", "ana")
    make_user("approver", "bea")
    notify.connect_signal_receiver()
    try:
        request_id = ask(refund, "txn_link")
    finally:
        notify.disconnect_signal_receiver()
    links = {}
    for message in mail.outbox:
        [link] = re.findall(r"https://ops\.example\.test(/\S+)", message.body)
        links[message.to[0].split("@")[0]] = link
    assert set(links) == {"ana", "bea"}
    return request_id, links


def _user(username: str):
    from django.contrib.auth.models import User

    return User.objects.get(username=username)


def _uses() -> list[tuple[str, str]]:
    return list(LinkUse.objects.values_list("approval_id", "used_by"))


def test_the_addressee_opens_the_request_page_once_and_nothing_is_answered(client, mailed):
    request_id, links = mailed
    client.force_login(_user("ana"))
    response = client.get(links["ana"])
    assert response.status_code == 302 and response["Location"] == approval_url(request_id)
    page = client.get(response["Location"])
    assert any("Opened from the mail sent to ana" in m for m in shown_messages(page))
    assert "Approve" in text(page) and store.get_approval(request_id).status == "pending"
    assert _uses() == [(request_id, "ana")]

    again = client.get(links["ana"])  # reused
    assert again.status_code == 410
    assert "This link was already used" in text(again) and "by ana" in text(again)
    assert _uses() == [(request_id, "ana")] and store.get_approval(request_id).status == "pending"


def test_a_link_opened_by_another_signed_in_user_records_nothing_and_still_works_for_its_addressee(client, mailed):
    request_id, links = mailed
    client.force_login(_user("bea"))
    response = client.get(links["ana"])
    assert response.status_code == 403
    assert "This link was sent to ana, and you are signed in as bea" in text(response)
    assert _uses() == []
    client.force_login(_user("ana"))
    assert client.get(links["ana"]).status_code == 302


def test_an_expired_link_opens_nothing(clock, client, mailed):
    request_id, links = mailed
    clock.advance(seconds=901)
    client.force_login(_user("ana"))
    response = client.get(links["ana"])
    assert response.status_code == 410 and "This link expired at" in text(response)
    assert _uses() == [] and store.get_approval(request_id).status in ("pending", "expired")


def test_a_tampered_link_or_one_moved_to_another_request_opens_nothing(client, mailed, refund, settings):
    request_id, links = mailed
    client.force_login(_user("ana"))
    path = links["ana"]
    head, token, _ = path.rsplit("/", 2)
    payload, rest = token.split(":", 1)
    forged = f"{head}/{payload[:-2]}{'A' if payload[-2] != 'A' else 'B'}{payload[-1]}:{rest}/"
    response = client.get(forged)
    assert response.status_code == 400 and "This link is not one ctrlrun sent" in text(response)
    other = ask(refund, "txn_other")
    moved = path.replace(quote(request_id), quote(other))  # ana's genuine token, on another request's URL
    assert moved != path
    response = client.get(moved)
    assert response.status_code == 400 and "This link is not one ctrlrun sent" in text(response)
    assert _uses() == [] and store.get_approval(request_id).status == "pending"


def test_a_link_needs_a_login_and_comes_back_after_it(client, mailed):
    _, links = mailed
    response = client.get(links["ana"])
    assert login_redirect(response, links["ana"])
    assert _uses() == []
