"""Paused agent runs in the console (ctrlrun.resumption): a read-only list and detail page, seen by
whoever may read approvals, linked both ways with the approval the run waits on; the state shown
escaped and collapsed, cut when large. Django's test client on a real database."""
from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote

from ctrlrun import store
from ctrlrun.admin import STATE_SHOWN
from ctrlrun.models import PausedRun
from tests.support import approval_url, has_id, login_redirect, pause, text, url
from tests.support import evidence_unguarded

pytestmark = pytest.mark.usefixtures("store_db", "console_groups", "files")

ROLES = ["superuser", "approver", "resolver", "auditor", "staff", "outsider", "anonymous"]
READERS = {"superuser", "approver", "resolver", "auditor"}


def words(response) -> str:
    """The page's text without its tags."""
    return re.sub(r"<[^>]+>", "", text(response))


def run_url(pk: int, action: str = "change") -> str:
    return url(f"ctrlrun_pausedrun_{action}", str(pk))


@pytest.fixture
def paused():
    approval_id = pause("pydantic-ai")
    return PausedRun.objects.get(approval_id=approval_id)


@pytest.mark.parametrize("role", ROLES)
def test_who_sees_paused_runs(role, paused, as_role, client):
    as_role(role)
    for path in (url("ctrlrun_pausedrun_changelist"), run_url(paused.pk)):
        response = client.get(path)
        if role in ("outsider", "anonymous"):
            assert login_redirect(response, path), response.status_code
        elif role == "staff":
            assert response.status_code == 403
        else:
            assert response.status_code == 200, (path, response.status_code)
    if role in READERS:
        assert "Paused runs" in text(client.get(url("index")))


@pytest.mark.parametrize("role", ["superuser", "approver"])
def test_never_editable(role, paused, as_role, client):
    as_role(role)
    before = PausedRun.objects.values().get(pk=paused.pk)
    assert client.get(url("ctrlrun_pausedrun_add")).status_code == 403
    assert client.post(run_url(paused.pk), {"status": "resumed", "state": "{}"}).status_code == 403
    assert client.post(run_url(paused.pk, "delete"), {"post": "yes"}).status_code == 403
    page = client.get(run_url(paused.pk))
    assert "<textarea" not in page.content.decode() and 'name="_save"' not in page.content.decode()
    assert PausedRun.objects.values().get(pk=paused.pk) == before


def test_the_list_and_the_detail_say_what_is_known(paused, as_role, client):
    store.answer_approval(paused.approval_id, True, by="alice")
    assert store.claim_paused_run(paused.pk, "granted", "worker-7:4242")
    store.finish_paused_run(paused.pk, error="RuntimeError: the model is down")
    as_role("auditor")
    listing = client.get(url("ctrlrun_pausedrun_changelist"))
    shown = text(listing)
    for expected in ("failed", "pydantic-ai", paused.approval_id, "pydantic-refunds", "granted", "worker-7:4242"):
        assert expected in shown, expected
    assert approval_url(paused.approval_id) in listing.content.decode()
    assert [p.pk for p in listing.context["cl"].result_list] == [paused.pk]
    assert listing.context["cl"].result_list[0].get_deferred_fields() == {"state"}  # the list never reads it
    filtered = client.get(url("ctrlrun_pausedrun_changelist") + "?status__exact=pending")
    assert list(filtered.context["cl"].result_list) == []

    page = client.get(run_url(paused.pk))
    body = text(page)
    for expected in ("RuntimeError: the model is down", "worker-7:4242", "paused at", "claimed at", "finished at",
                     "UTC", "not trusted for consent"):
        assert expected.lower() in body.lower(), expected
    assert approval_url(paused.approval_id) in page.content.decode()
    assert '<details id="ctrlrun-paused-state">' in page.content.decode()  # collapsed until opened


def test_the_approval_page_links_to_the_run_waiting_for_it(paused, as_role, client):
    as_role("approver")
    page = client.get(approval_url(paused.approval_id))
    assert has_id(page, "ctrlrun-paused-run")
    assert f"A paused pydantic-ai run waits for this answer: paused run {paused.pk} (pending)." in words(page)
    assert run_url(paused.pk) in page.content.decode()
    store.answer_approval(paused.approval_id, False, by="bob")
    PausedRun.objects.filter(pk=paused.pk).update(status="resumed")
    assert "A paused pydantic-ai run waited for this answer: paused run" in words(client.get(approval_url(
        paused.approval_id)))


def test_an_approval_without_a_paused_run_has_no_such_line(paused, as_role, client):
    with evidence_unguarded():  # (the database refuses it to the application's role)
        PausedRun.objects.filter(pk=paused.pk).delete()
    as_role("approver")
    assert not has_id(client.get(approval_url(paused.approval_id)), "ctrlrun-paused-run")


def test_hostile_and_huge_values_are_shown_escaped_and_cut(paused, as_role, client):
    hostile = '{"x": "</pre><script>alert(1)</script>\u202etxt", "pad": "' + "a" * (3 * STATE_SHOWN) + '"}'
    with evidence_unguarded():  # as the store's owner could write it
        PausedRun.objects.filter(pk=paused.pk).update(
            state=hostile, resume_with="<b>bold</b>\u200b", claimed_by="<img src=x onerror=alert(1)>",
        framework="<i>fw</i>", status="<s>odd</s>", error="line one\nline <two>")
    as_role("auditor")
    for page in (client.get(run_url(paused.pk)), client.get(url("ctrlrun_pausedrun_changelist"))):
        raw = page.content.decode()
        assert page.status_code == 200
        assert "<script>alert" not in raw and "<img src=x" not in raw and "<b>bold" not in raw and "<i>fw" not in raw
        assert "<s>odd" not in raw and "\u202e" not in raw and "\u200b" not in raw
    raw = client.get(run_url(paused.pk)).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in raw and "\\u202e" in raw and "\\u200b" in raw
    assert f"{len(hostile):,} characters of JSON text; the first {STATE_SHOWN:,} shown" in text(client.get(
        run_url(paused.pk)))
    assert len(raw) < 3 * STATE_SHOWN  # the whole state is not on the page


def test_a_page_for_no_such_run_is_a_redirect_with_a_message_not_a_500(as_role, client):
    as_role("auditor")
    for key in ("999999", "abc", quote("1\x00")):
        response = client.get(f"/admin/ctrlrun/pausedrun/{key}/change/")
        assert response.status_code in (302, 404), (key, response.status_code)


def test_the_list_says_which_approval_each_run_waits_for_and_its_status(paused, as_role, client):
    """Each row names the approval the run waits on and that request's status now: "waits for approval
    apr_… (pending)"; once answered and resumed, "waited for approval apr_… (consumed)"."""
    as_role("auditor")
    short = paused.approval_id[:16] + "…"
    listing = client.get(url("ctrlrun_pausedrun_changelist"))
    assert f"waits for approval {short} (pending)" in words(listing), words(listing)
    assert approval_url(paused.approval_id) in listing.content.decode()
    store.answer_approval(paused.approval_id, True, by="alice")
    assert f"waits for approval {short} (granted)" in words(client.get(url("ctrlrun_pausedrun_changelist")))
    assert store.claim_paused_run(paused.pk, "granted", "worker-7:4242")
    store.finish_paused_run(paused.pk, error="RuntimeError: the model is down")
    assert f"waited for approval {short} (granted)" in words(client.get(url("ctrlrun_pausedrun_changelist")))
    with evidence_unguarded():  # a request row deleted outside ctrlrun: said, not a 500
        from ctrlrun.models import Approval
        Approval.objects.filter(pk=paused.approval_id).delete()
    listing = client.get(url("ctrlrun_pausedrun_changelist"))
    assert listing.status_code == 200
    assert f"waited for approval {short} (no such request in the store)" in words(listing), words(listing)
