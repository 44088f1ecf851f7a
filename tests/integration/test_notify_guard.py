"""The mail tables against plain SQL (what the application's database role may send): the guard (version
8) refuses what would rewrite who was told or make a used link usable again, and what it allows is not
signed, so it is never sent and the page says so. On both databases, through the test store's own
connection with the guard installed (the real-role matrix is tests/integration/test_role_matrix.py)."""
from __future__ import annotations

import re

import pytest
from django.core import mail
from django.db import DatabaseError, connection

from ctrlrun import notify, store
from tests.support import approval_url, ask, make_user, text

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")


@pytest.fixture
def mailed(settings, refund):
    """ana and bea mailed about one request, the first mail's link used."""
    settings.CTRLRUN_NOTIFY_BASE_URL = "https://ops.example.test"
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    make_user("approver", "ana")
    make_user("approver", "bea")
    notify.connect_signal_receiver()
    try:
        request_id = ask(refund, "txn_guard")
    finally:
        notify.disconnect_signal_receiver()
    link = re.findall(r"https://ops\.example\.test(/\S+)", mail.outbox[0].body)[0]
    addressee = mail.outbox[0].to[0].split("@")[0]
    assert notify.check_link(request_id, link.rstrip("/").rsplit("/", 1)[1], addressee).outcome == "ok"
    return request_id


def _sql(statement: str, *params) -> None:
    if connection.vendor == "sqlite":
        statement = statement.replace("%s", "?")
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@pytest.mark.parametrize("statement", [
    'UPDATE "ctrlrun_delivery" SET "address" = \'mallory@evil.test\'',
    'UPDATE "ctrlrun_delivery" SET "recipient" = \'mallory\'',
    'UPDATE "ctrlrun_delivery" SET "basis" = \'setting\'',
    'UPDATE "ctrlrun_delivery" SET "link_nonce" = \'0000\' || "link_nonce"',
    'UPDATE "ctrlrun_delivery" SET "status" = \'pending\', "next_try" = "created_at" WHERE "status" = \'sent\'',
    'UPDATE "ctrlrun_delivery" SET "attempts" = 0 WHERE "attempts" > 0',
    'DELETE FROM "ctrlrun_delivery"',
    'UPDATE "ctrlrun_linkuse" SET "used_by" = \'mallory\'',
    'DELETE FROM "ctrlrun_linkuse"',
])
def test_the_guard_refuses_rewriting_who_was_told_and_unusing_a_link(mailed, statement):
    with pytest.raises(DatabaseError, match="ctrlrun mail"):
        _sql(statement)


def test_a_delivery_cannot_be_inserted_already_sent_and_a_link_use_cannot_be_replaced(mailed):
    with pytest.raises(DatabaseError):
        _sql('INSERT INTO "ctrlrun_delivery" ("approval_id", "recipient", "address", "basis", "status", "attempts", '
             '"created_at", "link_nonce") VALUES (%s, \'zed\', \'zed@evil.test\', \'setting\', \'sent\', 1, '
             'CURRENT_TIMESTAMP, \'n-zed\')', mailed)
    replace = ('INSERT OR REPLACE INTO "ctrlrun_linkuse" SELECT "nonce", "approval_id", \'mallory\', "used_at", NULL '
               'FROM "ctrlrun_linkuse"' if connection.vendor == "sqlite" else
               'INSERT INTO "ctrlrun_linkuse" SELECT "nonce", "approval_id", \'mallory\', "used_at", NULL FROM '
               '"ctrlrun_linkuse" ON CONFLICT ("nonce") DO UPDATE SET "used_by" = EXCLUDED."used_by"')
    with pytest.raises(DatabaseError, match="ctrlrun mail link"):
        _sql(replace)


def test_what_the_guard_allows_is_unsigned_never_sent_and_named_on_the_page(mailed, client):
    request_id = mailed
    _sql('INSERT INTO "ctrlrun_delivery" ("approval_id", "recipient", "address", "basis", "status", "attempts", '
         '"created_at", "next_try", "link_nonce") VALUES (%s, \'mallory\', \'mallory@evil.test\', \'setting\', '
         '\'pending\', 0, \'2000-01-01 00:00:00\', \'2000-01-01 00:00:00\', \'n-mallory\')', request_id)
    mail.outbox.clear()
    report = notify.run_once()
    assert mail.outbox == [] and report.unsigned == 1
    rows = store.notifications.deliveries_for(request_id)
    assert [d.recipient for d in rows if not d.signature_ok] == ["mallory"]
    _sql('UPDATE "ctrlrun_delivery" SET "status" = \'sent\' WHERE "recipient" = \'mallory\'')  # allowed: pending
    assert notify.run_once().unsigned == 0 and mail.outbox == []
    make_user("approver", "cy")
    client.login(username="cy", password="console-pass-1")
    page = text(client.get(approval_url(request_id)))
    assert page.count("this delivery does not carry ctrlrun's signature: it is never sent") == 1


def test_a_link_use_inserted_by_hand_only_burns_the_link(mailed, settings):
    """Any row under a link's nonce makes it used: an unsigned one can refuse a genuine link, never license one."""
    request_id = mailed
    pending = [d for d in store.notifications.deliveries_for(request_id) if store.notifications.link_use(d.link_nonce)
               is None]
    [other] = pending
    _sql('INSERT INTO "ctrlrun_linkuse" ("nonce", "approval_id", "used_by", "used_at") VALUES (%s, %s, \'mallory\', '
         'CURRENT_TIMESTAMP)', other.link_nonce, request_id)
    token = notify.link_token(other, store.now())
    found = notify.check_link(request_id, token, other.recipient)
    assert found.outcome == "used" and found.use.signature_ok is False
    assert store.get_approval(request_id).status == "pending"
