"""The human console (the Django admin) through Django's test client, on a real database: which
pages each kind of user may open, the buttons each sees, approving and denying through the
confirmation page, resolving and asking the remote, the read-only evidence, the chain page, the
overview and the ordering of the inbox. Data is made through ``ctrlrun.protect`` and the store;
users go into the groups the data migration created."""
from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from io import StringIO
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group
from django.core.management import CommandError
from django.db import connection
from django.test import Client

import ctrlrun
from ctrlrun import store
from ctrlrun.canonical import idempotency_token_for
from ctrlrun.models import Approval, ChainCheck, EffectRecord, Event, PolicyDocument, Receipt
from tests.support import Hook, Remote, evidence_unguarded, hold_key, make_ambiguous, make_user, protected_refund
from tests.support import (APPROVED_AMOUNT, approval_url, ask, has_id, login_redirect, pay, receipt_url,
                           shown_messages, status, text, url)

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")

ROLES = ["superuser", "approver", "resolver", "auditor", "staff", "outsider", "anonymous"]
READERS = {"superuser", "approver", "resolver", "auditor"}
DECIDERS = {"superuser", "approver"}
RESOLVERS = {"superuser", "resolver"}
LOGGED_OUT = {"outsider", "anonymous"}


# --------------------------------------------------------------------------- helpers


def effect_url(key: str, action: str = "change") -> str:
    return url(f"ctrlrun_effectrecord_{action}", quote(key))


def answer_events(approval_id: str) -> list[Event]:
    return list(Event.objects.filter(approval_id=approval_id, type__in=["APPROVAL_GRANTED", "APPROVAL_DENIED"]))


def log_entries(object_id: str) -> list[LogEntry]:
    return list(LogEntry.objects.filter(object_id=object_id).order_by("id"))


def listed(response) -> list:
    """The primary keys of the rows on a change list page, in the order shown."""
    return [obj.pk for obj in response.context["cl"].result_list]


def pre_json(response) -> object:
    """The JSON inside the page's first ``<pre class="ctrlrun-json">``."""
    match = re.search(r'<pre class="ctrlrun-json">(.*?)</pre>', response.content.decode(), re.S)
    assert match is not None, "no JSON block on the page"
    return json.loads(html.unescape(match.group(1)))


class World:
    """One of everything the console shows: a pending request, an ambiguous effect, a committed
    effect with its receipt, events and the policy document."""

    def __init__(self, refund, remote: Remote) -> None:
        pay(refund, "txn_paid")
        self.approval_id = ask(refund, "txn_big")
        self.ambiguous_key = make_ambiguous(refund, remote, "txn_lost")
        self.receipt_id = Receipt.objects.get(effect_key="refund:txn_paid").receipt_id
        self.event_id = Event.objects.order_by("id").first().id
        self.policy_hash = PolicyDocument.objects.get().hash

    def pages(self) -> dict[str, str]:
        return {
            "index": url("index"),
            "approval-list": url("ctrlrun_approval_changelist"),
            "approval-detail": approval_url(self.approval_id),
            "effect-list": url("ctrlrun_effectrecord_changelist"),
            "effect-detail": effect_url(self.ambiguous_key),
            "receipt-list": url("ctrlrun_receipt_changelist"),
            "receipt-detail": receipt_url(self.receipt_id),
            "verify": url("ctrlrun_receipt_verify"),
            "event-list": url("ctrlrun_event_changelist"),
            "event-detail": url("ctrlrun_event_change", str(self.event_id)),
            "policy-list": url("ctrlrun_policydocument_changelist"),
            "policy-detail": url("ctrlrun_policydocument_change", quote(self.policy_hash)),
        }


@pytest.fixture
def world(refund, remote):
    return World(refund, remote)


# --------------------------------------------------------------------------- the groups


def test_migration_created_the_three_groups_with_their_permissions():
    """Migration 0005's groups: each has the five view permissions, approvers and resolvers one custom permission more."""
    view_all = {"view_approval", "view_effectrecord", "view_event", "view_receipt", "view_policydocument",
                "view_delegation"}
    granted = {g.name: set(g.permissions.values_list("codename", flat=True)) for g in Group.objects.all()}
    assert granted == {
        "approvers": view_all | {"decide_approval"},
        "resolvers": view_all | {"resolve_effect"},
        "auditors": view_all,
    }


# --------------------------------------------------------------------------- who may open what


@pytest.mark.parametrize("role", ROLES)
def test_pages_by_role(role, world, as_role, client):
    """Readers open every console page; staff without a group gets 403 (index aside); others go to the login."""
    as_role(role)
    for page, path in world.pages().items():
        response = client.get(path)
        if role in LOGGED_OUT:
            assert login_redirect(response, path), (page, response.status_code)
        elif role == "staff" and page != "index":
            assert response.status_code == 403, page
        else:
            assert response.status_code == 200, (page, response.status_code)


@pytest.mark.parametrize("role", ["superuser", "approver", "resolver", "auditor", "staff"])
def test_overview_only_for_those_who_may_read(role, world, as_role, client):
    """The index shows the overview tiles to readers of ctrlrun, and not to staff without any ctrlrun permission."""
    as_role(role)
    response = client.get(url("index"))
    assert response.status_code == 200
    assert has_id(response, "ctrlrun-overview") is (role in READERS)
    assert ("permission to view or edit anything" in text(response)) is (role not in READERS)


@pytest.mark.parametrize("role", ["superuser", "approver", "resolver", "auditor"])
def test_buttons_by_permission(role, refund, remote, as_role, client):
    """Approve/Deny only for deciders; Ask and the resolve form only for resolvers; others read a note instead."""
    approval_id = ask(refund)
    key = make_ambiguous(protected_refund(remote, reconcile=Hook("unknown")), remote)
    as_role(role)

    page = client.get(approval_url(approval_id))
    assert page.status_code == 200 and has_id(page, "ctrlrun-decision")
    assert has_id(page, "ctrlrun-approve") is (role in DECIDERS)
    assert has_id(page, "ctrlrun-deny") is (role in DECIDERS)
    assert ("You can read this request but not answer it" in text(page)) is (role not in DECIDERS)

    page = client.get(effect_url(key))
    assert page.status_code == 200 and has_id(page, "ctrlrun-resolution")
    assert has_id(page, "ctrlrun-ask") is (role in RESOLVERS)
    assert has_id(page, "ctrlrun-resolve-form") is (role in RESOLVERS)
    assert has_id(page, "ctrlrun-resolve") is (role in RESOLVERS)
    assert ("You can read this record but not resolve it" in text(page)) is (role not in RESOLVERS)
    for evidence in ("receipt", "event", "policydocument", "approval", "effectrecord"):
        listing = client.get(url(f"ctrlrun_{evidence}_changelist"))
        assert url(f"ctrlrun_{evidence}_add") not in listing.content.decode()
        assert "delete_selected" not in listing.content.decode()


# --------------------------------------------------------------------------- approving and denying


@pytest.mark.parametrize("role", ROLES)
def test_approve_by_role(role, refund, as_role, client, clock):
    """Deciders confirm and grant (row, event with approver and note, admin log); everyone else is refused, nothing changes."""
    approval_id = ask(refund)
    user = as_role(role)
    confirm = approval_url(approval_id, "approve")

    page = client.get(confirm)
    response = client.post(confirm, {"note": "customer called twice"})

    if role in DECIDERS:
        assert page.status_code == 200
        assert has_id(page, "ctrlrun-decide-form") and has_id(page, "ctrlrun-confirm")
        shown = text(page)
        assert "You are about to authorise this exact action, once" in shown
        assert '"amount": 60000' in shown and '"payment_id": "txn_1"' in shown and "support-agent" in shown
        assert response.status_code == 302 and response["Location"] == approval_url(approval_id)
        row = Approval.objects.get(pk=approval_id)
        assert (row.status, row.approver, row.note, row.answered_at) == (
            "granted", user.username, "customer called twice", clock.now)
        [granted] = answer_events(approval_id)
        assert granted.type == "APPROVAL_GRANTED"
        assert granted.data == {"approver": user.username, "action_hash": row.action_hash,
                                "note": "customer called twice"}
        [entry] = log_entries(approval_id)
        assert (entry.user, entry.action_flag) == (user, CHANGE)
        assert entry.get_change_message() == f"granted {approval_id}: customer called twice"
    else:
        if role in LOGGED_OUT:
            assert login_redirect(page, confirm) and login_redirect(response, confirm)
        else:
            assert (page.status_code, response.status_code) == (403, 403)
        assert status(approval_id) == "pending"
        assert answer_events(approval_id) == [] and log_entries(approval_id) == []


@pytest.mark.parametrize("role", ["superuser", "approver", "resolver", "auditor", "staff"])
def test_deny_by_role(role, refund, as_role, client):
    """Deciders deny through the confirmation page; resolvers, auditors and plain staff get 403 and nothing changes."""
    approval_id = ask(refund)
    user = as_role(role)
    confirm = approval_url(approval_id, "deny")
    page = client.get(confirm)
    response = client.post(confirm, {"note": "too large"}, follow=True)
    if role in DECIDERS:
        assert page.status_code == 200 and "You are about to refuse this action" in text(page)
        assert response.redirect_chain == [(approval_url(approval_id), 302)]
        assert shown_messages(response) == [
            f"Request {approval_id} denied. The agent's call of stripe.refund will not run; a retry under this "
            f"request is refused."]
        row = Approval.objects.get(pk=approval_id)
        assert (row.status, row.approver, row.note) == ("denied", user.username, "too large")
        [denied] = answer_events(approval_id)
        assert (denied.type, denied.data) == ("APPROVAL_DENIED", {"approver": user.username, "note": "too large"})
        [entry] = log_entries(approval_id)
        assert entry.user == user and entry.get_change_message() == f"denied {approval_id}: too large"
        assert "This request is denied (answered by" in text(response)
        assert not has_id(response, "ctrlrun-approve")
    else:
        assert (page.status_code, response.status_code) == (403, 403)
        assert status(approval_id) == "pending" and answer_events(approval_id) == []
        assert log_entries(approval_id) == []


def test_links_from_the_inbox_lead_to_working_buttons(refund, as_role, client):
    """The inbox's own (pk-quoted) link opens a page with Approve, whose link opens the confirmation that grants."""
    approval_id = ask(refund)
    as_role("approver")
    inbox = client.get(url("ctrlrun_approval_changelist")).content.decode()
    detail_href = re.search(r'<a href="([^"]+)"><span title="' + approval_id + '">', inbox).group(1)
    detail = client.get(detail_href)
    assert detail.status_code == 200 and has_id(detail, "ctrlrun-approve")
    approve_href = html.unescape(re.search(r'id="ctrlrun-approve" href="([^"]+)"', detail.content.decode()).group(1))
    assert client.get(approve_href).status_code == 200
    response = client.post(approve_href, {"note": "ok"}, follow=True)
    assert response.redirect_chain == [(detail_href, 302)]
    assert status(approval_id) == "granted" and "This request is granted (answered by ana)" in text(response)


def test_grant_in_console_lets_the_agent_retry_run_once(refund, remote, as_role, client):
    """After an approver grants in the console the agent's retry under with_approval runs once, naming the approver."""
    approval_id = ask(refund)
    as_role("approver")
    response = client.post(approval_url(approval_id, "approve"), {"note": ""}, follow=True)
    [message] = shown_messages(response)
    # What happens to the agent's call, for the operator; not a developer's instruction.
    assert message.startswith(f"Request {approval_id} granted. The agent's call of stripe.refund with exactly these "
                              f"arguments may now run, once, until 2") and message.endswith(" UTC; any other call is refused.")
    assert "with_approval" not in message
    assert remote.calls == []
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(approval_id):
        assert refund(payment_id="txn_1", amount=APPROVED_AMOUNT) == {"id": "re_txn_1", "amount": APPROVED_AMOUNT}
    assert remote.calls == [("txn_1", APPROVED_AMOUNT)]
    row = Approval.objects.get(pk=approval_id)
    assert row.status == "consumed" and row.note is None
    assert [e.data for e in answer_events(approval_id)] == [{"approver": "ana", "action_hash": row.action_hash}]
    doc = json.loads(Receipt.objects.get(effect_key="refund:txn_1").document)
    assert (doc["result"], doc["approval_id"], doc["approver"]) == ("committed", approval_id, "ana")


def test_self_approval_is_refused(refund, as_role, client):
    """A staff user whose name is the request's principal user cannot approve it: a message, nothing changes."""
    approval_id = ask(refund, user="alice")
    as_role("approver", username="alice")
    response = client.post(approval_url(approval_id, "approve"), {"note": "mine"}, follow=True)
    assert response.redirect_chain == [(approval_url(approval_id), 302)]
    message = ("this request for stripe.refund was made on behalf of user alice, who cannot answer it; another "
               "person must")
    assert shown_messages(response) == [message]
    assert "made on behalf of user alice, who cannot answer it" in text(response)
    assert status(approval_id) == "pending" and Approval.objects.get(pk=approval_id).approver is None
    assert answer_events(approval_id) == [] and log_entries(approval_id) == []
    assert client.post(approval_url(approval_id, "deny"), follow=True).status_code == 200
    assert status(approval_id) == "pending"


def test_expired_request_is_refused_and_marked_expired(refund, as_role, client, clock):
    """Past expires_at the confirmation is not offered (GET redirects with why), the POST is refused with a
    message and the request becomes expired."""
    approval_id = ask(refund)
    clock.advance(minutes=16)
    as_role("approver")
    page = client.get(approval_url(approval_id, "approve"), follow=True)
    assert page.redirect_chain == [(approval_url(approval_id), 302)]
    [refusal] = shown_messages(page)
    assert refusal.startswith(f"Request {approval_id} expired at ") and refusal.endswith("the agent must ask again")
    assert "Yes, approve" not in text(page) and not has_id(page, "ctrlrun-approve")
    assert status(approval_id) == "pending"  # a GET writes nothing
    response = client.post(approval_url(approval_id, "approve"), {"note": "late"}, follow=True)
    [message] = shown_messages(response)
    assert message.startswith(f"approval {approval_id} expired at ") and message.endswith("the agent must ask again")
    assert status(approval_id) == "expired"
    assert answer_events(approval_id) == [] and log_entries(approval_id) == []
    assert Event.objects.filter(approval_id=approval_id, type="APPROVAL_EXPIRED").count() == 1
    assert "This request is expired" in text(response) and not has_id(response, "ctrlrun-approve")


def test_answered_request_cannot_be_answered_again(refund, as_role, client):
    """A second answer to a granted request is refused with a message; the first answer stands."""
    approval_id = ask(refund)
    as_role("approver")
    client.post(approval_url(approval_id, "approve"), follow=True)  # an empty form: no note
    response = client.post(approval_url(approval_id, "deny"), {"note": "changed my mind"}, follow=True)
    assert shown_messages(response) == [f"approval request {approval_id} is already granted"]
    assert status(approval_id) == "granted" and len(answer_events(approval_id)) == 1
    assert len(log_entries(approval_id)) == 1


def test_unknown_answer_or_request_is_404(refund, as_role, client):
    """Only approve and deny are answers, and only of an existing request."""
    approval_id = ask(refund)
    as_role("approver")
    assert client.get(approval_url(approval_id, "maybe")).status_code == 404
    assert client.post(approval_url("apr_" + "0" * 32, "approve")).status_code == 404
    assert status(approval_id) == "pending"


def test_approval_detail_shows_what_is_authorised(refund, as_role, client, clock):
    """The detail page shows the action, canonical arguments, principal, environment, hash and time left."""
    approval_id = ask(refund, user="alice")
    row = Approval.objects.get(pk=approval_id)
    as_role("auditor")
    shown = text(client.get(approval_url(approval_id)))
    assert "What the human is authorising" in shown
    assert "stripe.refund" in shown and "support-agent (user alice)" in shown
    assert '"amount": 60000' in shown and '"payment_id": "txn_1"' in shown
    assert row.action_hash in shown and "refund:txn_1" in shown and "rule[1]" in shown
    assert "in 15\xa0minutes" in shown and "This request is waiting for a person" in shown


# --------------------------------------------------------------------------- resolving


def resolve_form(page) -> dict[str, str]:
    """The hidden attempt the resolve form on this page is pinned to."""
    match = re.search(r'<input type="hidden" name="attempt" value="(\d+)"', page.content.decode())
    assert match is not None, "no pinned attempt on the page"
    return {"attempt": match.group(1)}


def resolutions(key: str) -> list[dict]:
    return [e.data for e in Event.objects.filter(effect_key=key, type="EFFECT_RESOLVED").order_by("id")]


def test_resolve_committed_records_resolver_and_reason(refund, remote, as_role, client):
    """Mark committed: the record moves, EFFECT_RESOLVED names the user and reason, an admin log entry, a retry is a duplicate."""
    key = make_ambiguous(refund, remote)
    user = as_role("resolver")
    page = client.get(effect_url(key))
    assert "Nobody knows whether this effect happened" in text(page)
    assert idempotency_token_for(key, 1) in text(page)
    assert "No reconcile hook for stripe.refund is registered" in text(page)
    assert not has_id(page, "ctrlrun-ask")
    response = client.post(effect_url(key, "resolve"),
                           {"outcome": "committed", "reason": "the dashboard shows re_txn_9", **resolve_form(page)},
                           follow=True)
    assert response.redirect_chain == [(effect_url(key), 302)]
    assert shown_messages(response) == [
        f"Effect {key} resolved committed by rita; a retry will be refused as a duplicate"]
    record = EffectRecord.objects.get(pk=key)
    assert (record.state, record.resolved_by, record.attempt) == ("committed", "rita", 1)
    assert resolutions(key) == [{"state": "committed", "resolver": "rita", "resolved_by": "human", "attempt": 1,
                                 "reason": "the dashboard shows re_txn_9"}]
    [entry] = log_entries(key)
    assert entry.user == user
    assert entry.get_change_message() == "resolved committed (attempt 1): the dashboard shows re_txn_9"
    assert "This effect is committed" in text(response) and not has_id(response, "ctrlrun-resolve-form")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.DuplicateEffect):
        refund(payment_id="txn_9", amount=100)
    assert remote.calls == [("txn_9", 100)]


def test_resolve_failed_lets_the_retry_run(refund, remote, as_role, client):
    """Mark failed: the next call of the same key runs as attempt 2."""
    key = make_ambiguous(refund, remote)
    as_role("superuser")
    response = client.post(effect_url(key, "resolve"), {"outcome": "failed", "reason": "no refund at Stripe",
                                                        "attempt": "1"}, follow=True)
    assert shown_messages(response) == [f"Effect {key} resolved failed by root; a retry is now permitted"]
    pay(refund, "txn_9")
    record = EffectRecord.objects.get(pk=key)
    assert (record.state, record.attempt) == ("committed", 2)
    assert remote.calls == [("txn_9", 100), ("txn_9", 100)]


@pytest.mark.parametrize("form", [
    {"outcome": "committed", "reason": "", "attempt": "1"},
    {"outcome": "committed", "reason": "   ", "attempt": "1"},
    {"outcome": "committed", "attempt": "1"},
])
def test_resolve_requires_a_reason(form, refund, remote, as_role, client):
    """Without a reason nothing changes and the page says the reason is required."""
    key = make_ambiguous(refund, remote)
    as_role("resolver")
    response = client.post(effect_url(key, "resolve"), form, follow=True)
    assert shown_messages(response) == ["not resolved: reason: This field is required."]
    assert EffectRecord.objects.get(pk=key).state == "ambiguous"
    assert resolutions(key) == [] and log_entries(key) == []


def test_resolve_without_outcome_or_attempt_changes_nothing(refund, remote, as_role, client):
    """The outcome and the pinned attempt are required as well."""
    key = make_ambiguous(refund, remote)
    as_role("resolver")
    response = client.post(effect_url(key, "resolve"), {"outcome": "maybe", "reason": "hm"}, follow=True)
    [message] = shown_messages(response)
    assert message.startswith("not resolved: ") and "outcome: " in message and "attempt: " in message
    assert EffectRecord.objects.get(pk=key).state == "ambiguous" and resolutions(key) == []


def test_resolve_is_pinned_to_the_attempt_on_screen(refund, remote, as_role, client):
    """A record that moved to another attempt after the page was shown is refused with a clear message."""
    key = make_ambiguous(refund, remote)
    as_role("resolver")
    page = client.get(effect_url(key))
    assert "Pinned to attempt 1" in text(page)
    # Meanwhile someone else resolves it failed and the agent's retry is lost again: attempt 2, ambiguous.
    store.resolve(key, "failed", by="bob", reason="checked")
    make_ambiguous(refund, remote)
    assert (EffectRecord.objects.get(pk=key).state, EffectRecord.objects.get(pk=key).attempt) == ("ambiguous", 2)

    response = client.post(effect_url(key, "resolve"),
                           {"outcome": "committed", "reason": "saw it", **resolve_form(page)}, follow=True)
    assert shown_messages(response) == [
        f"not resolved: effect '{key}' is at attempt 2, not 1: it moved since you looked. Check it again "
        f"before resolving"]
    record = EffectRecord.objects.get(pk=key)
    assert (record.state, record.attempt) == ("ambiguous", 2)
    assert [r["resolver"] for r in resolutions(key)] == ["bob"] and log_entries(key) == []
    assert "Pinned to attempt 2" in text(response)


def test_resolving_a_settled_record_is_refused(refund, as_role, client):
    """Only an ambiguous record can be resolved: a committed one is refused with the store's message."""
    pay(refund, "txn_1")
    as_role("resolver")
    response = client.post(effect_url("refund:txn_1", "resolve"),
                           {"outcome": "failed", "reason": "oops", "attempt": "1"}, follow=True)
    assert shown_messages(response) == [
        "not resolved: effect 'refund:txn_1' is committed, not ambiguous; only an effect with an unknown outcome "
        "is resolved by hand"]
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "committed"


@pytest.mark.parametrize("role", ROLES)
def test_resolve_and_ask_by_role(role, remote, as_role, client):
    """Only resolvers may post Resolve or Ask; others get 403 (or the login) and neither the record nor the hook moves."""
    hook = Hook("committed")
    key = make_ambiguous(protected_refund(remote, reconcile=hook), remote)
    as_role(role)
    resolve = client.post(effect_url(key, "resolve"), {"outcome": "committed", "reason": "seen", "attempt": "1"})
    if role in RESOLVERS:
        assert resolve.status_code == 302 and EffectRecord.objects.get(pk=key).state == "committed"
        return
    asked = client.post(effect_url(key, "ask"))
    for response, path in ((resolve, effect_url(key, "resolve")), (asked, effect_url(key, "ask"))):
        if role in LOGGED_OUT:
            assert login_redirect(response, path)
        else:
            assert response.status_code == 403
    assert EffectRecord.objects.get(pk=key).state == "ambiguous"
    assert hook.asked == [] and resolutions(key) == [] and log_entries(key) == []


# --------------------------------------------------------------------------- asking the remote


def test_ask_the_remote_moves_the_record_and_shows_the_answer(remote, as_role, client):
    """Ask the remote runs the registered hook once, as the deferred command does, and shows its answer."""
    hook = Hook("committed")
    refund = protected_refund(remote, reconcile=hook)
    key = make_ambiguous(refund, remote)
    user = as_role("resolver")
    page = client.get(effect_url(key))
    assert "Ask the remote now" in text(page) and "No reconcile hook" not in text(page)
    response = client.post(effect_url(key, "ask"), follow=True)
    assert hook.asked == [key]
    assert shown_messages(response) == [f"asked the remote about {key}: committed (the hook answered committed)"]
    record = EffectRecord.objects.get(pk=key)
    assert (record.state, record.resolved_by) == ("committed", "reconcile:stripe.refund")
    started = Event.objects.get(effect_key=key, type="RECONCILIATION_STARTED")
    # A person asked, not a reconcile pass: the event says so.
    assert started.data == {"effect_key": key, "trigger": "operator", "requested_by": "rita"}
    assert resolutions(key) == [{"state": "committed", "resolver": "reconcile:stripe.refund",
                                 "resolved_by": "reconcile"}]
    [entry] = log_entries(key)
    assert entry.user == user and entry.get_change_message() == "asked the remote: committed"
    assert "This effect is committed" in text(response)


def test_ask_the_remote_unknown_leaves_the_record(remote, as_role, client):
    """A hook answering unknown moves nothing; the page says so and the record waits for its backoff."""
    hook = Hook("unknown")
    key = make_ambiguous(protected_refund(remote, reconcile=hook), remote)
    as_role("resolver")
    response = client.post(effect_url(key, "ask"), follow=True)
    assert shown_messages(response) == [f"asked the remote about {key}: unknown (the hook answered unknown)"]
    record = EffectRecord.objects.get(pk=key)
    assert (record.state, record.reconcile_failures) == ("ambiguous", 1) and hook.asked == [key]
    assert has_id(response, "ctrlrun-resolve-form")


def test_ask_on_a_lapsed_lease_marks_it_ambiguous(as_role, client, clock):
    """A dead worker's lapsed lease without a hook: the button marks it ambiguous and says a human decides."""
    hold_key("refund:txn_5")
    clock.advance(minutes=6)
    as_role("resolver")
    page = client.get(effect_url("refund:txn_5"))
    assert "The worker holding this effect let its lease lapse" in text(page)
    assert "Mark ambiguous (the worker is gone)" in text(page) and not has_id(page, "ctrlrun-resolve-form")
    response = client.post(effect_url("refund:txn_5", "ask"), follow=True)
    assert shown_messages(response) == [  # for a person at the console, not a command line's --import
        "refund:txn_5 is ambiguous. No reconcile hook for stripe.refund is registered in this server: check the "
        "remote yourself and record what happened below."]
    assert EffectRecord.objects.get(pk="refund:txn_5").state == "ambiguous"
    assert has_id(response, "ctrlrun-resolve-form")


def test_ask_on_a_settled_record_is_refused(refund, as_role, client):
    """Asking about a committed record is refused with the reason; nothing is asked."""
    pay(refund, "txn_1")
    as_role("resolver")
    response = client.post(effect_url("refund:txn_1", "ask"), follow=True)
    assert shown_messages(response) == [
        "effect 'refund:txn_1' is committed; only an ambiguous effect is reconciled"]
    assert not Event.objects.filter(type="RECONCILIATION_STARTED").exists()


@pytest.mark.parametrize("action", ["ask", "resolve"])
def test_action_urls_refuse_get(action, remote, as_role, client):
    """The Ask and Resolve URLs act only on a POST: a GET is refused with 403 and changes nothing."""
    hook = Hook("committed")
    key = make_ambiguous(protected_refund(remote, reconcile=hook), remote)
    as_role("superuser")
    response = client.get(effect_url(key, action), {"outcome": "committed", "reason": "x", "attempt": "1"})
    assert response.status_code == 403
    assert EffectRecord.objects.get(pk=key).state == "ambiguous" and hook.asked == []
    assert not Event.objects.filter(effect_key=key, type="RECONCILIATION_STARTED").exists()


def test_unknown_effect_is_404(as_role, client):
    """Asking or resolving an effect key that does not exist is 404."""
    as_role("resolver")
    assert client.post(effect_url("refund:nope", "ask")).status_code == 404
    assert client.post(effect_url("refund:nope", "resolve"), {"outcome": "failed", "reason": "x",
                                                               "attempt": "1"}).status_code == 404


def test_effect_detail_shows_timeline_receipts_and_token(refund, remote, as_role, client):
    """The effect page shows its events in order, its receipts and the provider token of the attempt."""
    key = make_ambiguous(refund, remote)
    as_role("auditor")
    page = client.get(effect_url(key))
    shown = text(page)
    timeline = re.search(r'id="ctrlrun-events">(.*?)</table>', shown, re.S).group(1)
    types_shown = re.findall(r"<td>([A-Z_]+)</td>", timeline)
    assert types_shown == [e.type for e in Event.objects.filter(effect_key=key).order_by("id")]
    assert types_shown[-1] == "EXECUTION_AMBIGUOUS"
    [receipt] = Receipt.objects.filter(effect_key=key)
    assert receipt_url(receipt.receipt_id) in shown
    assert client.get(receipt_url(receipt.receipt_id)).status_code == 200
    assert idempotency_token_for(key, 1) in shown and "TimeoutError: read timed out" in shown


# --------------------------------------------------------------------------- evidence


EVIDENCE = ["receipt", "event", "policydocument", "approval", "effectrecord"]


def evidence_pk(name: str, world: World) -> str:
    return {"receipt": quote(world.receipt_id), "event": str(world.event_id),
            "policydocument": quote(world.policy_hash), "approval": quote(world.approval_id), "effectrecord": quote(world.ambiguous_key)}[name]


def counts() -> tuple[int, ...]:
    return tuple(m.objects.count() for m in (Receipt, Event, PolicyDocument, Approval, EffectRecord))


@pytest.mark.parametrize("role", ["superuser", "auditor", "approver", "resolver"])
@pytest.mark.parametrize("name", EVIDENCE)
def test_evidence_has_no_add_change_or_delete(name, role, world, as_role, client):
    """Add and delete URLs are 403 and a change POST is refused for everyone, superuser included; the rows stay."""
    as_role(role)
    before = counts()
    pk = evidence_pk(name, world)
    assert client.get(url(f"ctrlrun_{name}_add")).status_code == 403
    assert client.post(url(f"ctrlrun_{name}_add"), {}).status_code == 403
    assert client.get(url(f"ctrlrun_{name}_delete", pk)).status_code == 403
    assert client.post(url(f"ctrlrun_{name}_delete", pk), {"post": "yes"}).status_code == 403
    assert client.post(url(f"ctrlrun_{name}_change", pk), {}).status_code == 403
    detail = client.get(url(f"ctrlrun_{name}_change", pk))
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode() and "deletelink" not in detail.content.decode()
    bulk = client.post(url(f"ctrlrun_{name}_changelist"),
                       {"action": "delete_selected", "_selected_action": [pk], "post": "yes"}, follow=True)
    assert bulk.status_code == 200
    assert counts() == before


def test_receipt_detail_shows_its_json(world, as_role, client):
    """The receipt page shows the stored document as JSON, equal to the row's document."""
    as_role("auditor")
    page = client.get(receipt_url(world.receipt_id))
    document = json.loads(Receipt.objects.get(pk=world.receipt_id).document)
    assert pre_json(page) == document
    assert document["receipt_id"] == world.receipt_id and document["result"] == "committed"
    assert "Document (ctrlrun.receipt/v7)" in text(page)


def test_receipt_search_and_filters(refund, remote, as_role, client):
    """Receipts are searchable by effect key and filterable by result and action."""
    pay(refund, "txn_1")
    pay(refund, "txn_2")
    make_ambiguous(refund, remote, "txn_3")
    as_role("auditor")
    listing = url("ctrlrun_receipt_changelist")
    by_key = listing_effects(client.get(listing, {"q": "refund:txn_2"}))
    assert by_key == ["refund:txn_2"]
    assert listing_effects(client.get(listing, {"result": "ambiguous"})) == ["refund:txn_3"]
    assert listing_effects(client.get(listing, {"result": "committed"})) == ["refund:txn_2", "refund:txn_1"]  # newest first
    assert len(listing_effects(client.get(listing, {"action__exact": "stripe.refund"}))) == 3
    assert listing_effects(client.get(listing, {"agent__exact": "nobody"})) == []


def listing_effects(response) -> list[str]:
    return [r.effect_key for r in response.context["cl"].result_list]


def test_event_search_and_filters(refund, as_role, client):
    """Events are searchable by effect key or approval id and filterable by type."""
    pay(refund, "txn_1")
    approval_id = ask(refund, "txn_2")
    as_role("auditor")
    listing = url("ctrlrun_event_changelist")
    response = client.get(listing, {"type__exact": "APPROVAL_REQUESTED"})
    assert [e.approval_id for e in response.context["cl"].result_list] == [approval_id]
    response = client.get(listing, {"q": "refund:txn_1"})
    assert [e.type for e in response.context["cl"].result_list] == [  # newest first
        "EXECUTION_COMMITTED", "EXECUTION_STARTED", "EFFECT_RESERVED", "POLICY_EVALUATED", "ACTION_PROPOSED"]
    response = client.get(listing, {"q": approval_id})
    assert [e.type for e in response.context["cl"].result_list] == ["APPROVAL_REQUESTED"]


def test_approval_filters(refund, as_role, client):
    """The inbox filters by status, action and agent."""
    first = ask(refund, "txn_1")
    second = ask(refund, "txn_2")
    with ctrlrun.context(agent="billing-agent"), pytest.raises(ctrlrun.ApprovalRequired):
        refund(payment_id="txn_3", amount=APPROVED_AMOUNT)
    store.answer_approval(first, True, by="bob")
    as_role("approver")
    listing = url("ctrlrun_approval_changelist")
    assert listed(client.get(listing, {"status": "granted"})) == [first]
    assert listed(client.get(listing, {"status": "pending", "agent__exact": "support-agent"})) == [second]
    # A link from before the status filter keeps its meaning.
    old = client.get(listing, {"status__exact": "pending", "agent__exact": "support-agent"})
    assert old.status_code == 302 and parse_qs(urlsplit(old.url).query) == {
        "status": ["pending"], "agent__exact": ["support-agent"]}
    assert len(listed(client.get(listing, {"action__exact": "stripe.refund"}))) == 3
    assert len(listed(client.get(listing, {"agent__exact": "billing-agent"}))) == 1


def test_policy_documents_show_hash_source_and_where_in_force(refund, as_role, client, use_policy):
    """The policy list names each document's hash and source and says which one is in force here."""
    pay(refund, "txn_1")
    old = PolicyDocument.objects.get()
    path = use_policy(old.text.replace("amount_lte: 50000", "amount_lte: 40000"))
    pay(refund, "txn_2")
    current = PolicyDocument.objects.exclude(pk=old.hash).get()
    as_role("auditor")
    response = client.get(url("ctrlrun_policydocument_changelist"))
    shown = text(response)
    assert old.hash in shown and current.hash in shown and current.source in shown
    assert f"yes: {path}" in shown and "no (an earlier or other policy)" in shown
    detail = text(client.get(url("ctrlrun_policydocument_change", quote(current.hash))))
    assert "amount_lte: 40000" in detail and f"yes: {path}" in detail


# --------------------------------------------------------------------------- the chain


TABLE = Receipt._meta.db_table


def tamper(seq: int, document: str) -> None:
    """Edit a receipt row behind ctrlrun's back, as someone with database access could."""
    with evidence_unguarded(), connection.cursor() as cursor:  # drops the append-only triggers for this
        cursor.execute(f"UPDATE {connection.ops.quote_name(TABLE)} SET document = %s WHERE seq = %s", [document, seq])


def test_verify_page_intact_then_names_the_altered_row(refund, as_role, client):
    """The chain page's button runs a full check: intact; after a receipt's document is edited in SQL it names
    content_altered at that seq, and the front page shows each recorded result."""
    for n in range(3):
        pay(refund, f"txn_{n}")
    as_role("auditor")
    page = client.post(url("ctrlrun_receipt_verify"))
    assert "The chain is intact" in text(page) and "3 of 3 receipts verified" in text(page)
    assert not has_id(page, "ctrlrun-breaks")
    assert overview_tiles(client)["chain"].startswith("intact receipt chain intact, checked just now (full, up to "
                                                      "receipt 3); 0 receipts written since")

    row = Receipt.objects.get(seq=2)
    tamper(2, row.document.replace('"amount":100', '"amount":100000'))
    page = client.post(url("ctrlrun_receipt_verify"))
    shown = text(page)
    assert "The chain is broken: 2 breaks" in shown and has_id(page, "ctrlrun-breaks")
    breaks = re.findall(r'<tr><td><strong>(\w+)</strong></td><td><a href="([^"]+)"[^>]*>receipt (\d+)</a></td>',
                        re.search(r'id="ctrlrun-breaks">(.*?)</table>', shown, re.S).group(1))
    listing = url("ctrlrun_receipt_changelist")  # each break links to the receipt it names
    assert breaks == [("content_altered", f"{listing}?seq=2", "2"),
                      ("link_broken", f"{listing}?seq=3", "3")]  # seq 3 still names the old hash
    assert [r.seq for r in client.get(f"{listing}?seq=2").context["cl"].result_list] == [2]
    assert overview_tiles(client)["chain"].startswith("broken receipt chain broken, checked just now (full, up to "
                                                      "receipt 3): 2 breaks")
    detail = client.get(receipt_url(row.receipt_id))
    assert pre_json(detail)["arguments"]["amount"] == 100000


def test_receipt_that_is_not_json_is_shown_as_altered(refund, as_role, client):
    """A receipt row overwritten with text that is not JSON still opens and says it was altered."""
    pay(refund, "txn_1")
    row = Receipt.objects.get()
    tamper(1, "not json")
    as_role("auditor")
    page = client.get(receipt_url(row.receipt_id))
    assert page.status_code == 200 and "This document is not valid JSON: the row was altered" in text(page)
    assert "content_altered" in text(client.post(url("ctrlrun_receipt_verify")))


# --------------------------------------------------------------------------- the overview and the ordering


def overview_tiles(client) -> dict[str, str]:
    """The overview's tiles on the index page: {name: 'count label -> link'}."""
    page = client.get(url("index"))
    overview = re.search(r'id="ctrlrun-overview">(.*?)\n</div>', text(page), re.S).group(1)
    tiles = re.findall(r'<a class="tile[^"]*" href="([^"]+)">\s*<span class="count">([^<]*)</span>'
                       r'<span class="label">([^<]*)</span>', overview)
    assert len(tiles) == 4, overview
    return {name: f"{count} {label} -> {href}"
            for name, (href, count, label) in zip(("approvals", "ambiguous", "lapsed", "chain"), tiles)}


def test_index_overview_counts_and_links(refund, remote, as_role, client, clock):
    """The index shows pending approvals, ambiguous effects, lapsed leases and chain status, each linking to its list."""
    waiting = [ask(refund, "txn_1")]
    clock.advance(seconds=1)
    waiting.append(ask(refund, "txn_2"))
    answered = ask(refund, "txn_3")
    store.answer_approval(answered, False, by="bob")
    lost = make_ambiguous(refund, remote, "txn_4")
    pay(refund, "txn_5")
    hold_key("refund:txn_6")
    hold_key("refund:txn_7", minutes=30)
    clock.advance(minutes=6)
    as_role("auditor")

    tiles = overview_tiles(client)
    approvals_url = url("ctrlrun_approval_changelist")
    effects_url = url("ctrlrun_effectrecord_changelist")
    assert tiles == {
        "approvals": f"2 approvals waiting -> {approvals_url}?status=pending",
        "ambiguous": f"1 ambiguous effect -> {effects_url}?attention=ambiguous",
        "lapsed": f"1 lapsed lease -> {effects_url}?attention=lapsed",
        "chain": f"unchecked receipt chain never checked (2 receipts): run receipts --verify-chain -> "
                 f"{url('ctrlrun_receipt_verify')}",
    }
    assert listed(client.get(approvals_url, {"status": "pending"})) == waiting
    assert listed(client.get(effects_url, {"attention": "ambiguous"})) == [lost]
    assert listed(client.get(effects_url, {"attention": "lapsed"})) == ["refund:txn_6"]


def stats_table(client) -> tuple[str, list[tuple[str, str, str]]]:
    """The front page's last-24-hours table: its caption and its rows (class, label, count)."""
    page = text(client.get(url("index")))
    table = re.search(r'id="ctrlrun-stats">(.*?)</table>', page, re.S).group(1)
    caption = re.search(r"<caption>(.*?)</caption>", table, re.S).group(1)
    rows = re.findall(r'<tr class="([^"]*)"><th scope="row">([^<]*)</th><td>([^<]*)</td></tr>', table)
    return caption, rows


def test_index_shows_the_last_24_hours_as_stats_counts_them(refund, remote, as_role, client, clock):
    """The front page's table: actions, denials by reason and ambiguous outcomes of the last 24 hours (older
    receipts left out, a call waiting for a human not counted), the same numbers as 'manage.py stats'."""
    pay(refund, "txn_0")
    clock.advance(hours=25)  # out of the window from here on
    pay(refund, "txn_1")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_2", amount=10**9)
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_3", amount=-5)
    make_ambiguous(refund, remote, "txn_4")
    ask(refund, "txn_5")
    as_role("auditor")
    caption, rows = stats_table(client)
    assert caption == "The last 24 hours (enforce mode)"
    assert rows == [("", "actions", "4"), ("", "denied", "2"), ("reason", "rule[2]", "2"),
                    ("", "ambiguous outcomes", "1")]
    [line] = command_lines("stats", "--json")
    document = json.loads(line)
    assert (document["actions"], document["denied"], document["ambiguous_outcomes"]) == (4, 2, 1)
    assert "manage.py stats" in text(client.get(url("index")))


def test_index_stats_table_counts_a_bounded_number(refund, as_role, client, monkeypatch):
    """Each page load counts at most STATS_LIMIT of the window's most recent receipts, and says so."""
    from ctrlrun.admin import frontpage

    monkeypatch.setattr(frontpage, "STATS_LIMIT", 3)
    for n in range(5):
        pay(refund, f"txn_{n}")
    as_role("auditor")
    caption, rows = stats_table(client)
    assert caption == "The last 3 calls of the last 24 hours (enforce mode)"
    assert rows[0] == ("", "actions", "3")
    [line] = command_lines("stats", "--json")
    assert json.loads(line)["actions"] == 5  # the command counts them all


def test_index_stats_table_in_observe_mode(use_policy, remote, as_role, client):
    """When the policy observes, the table is observe mode's (from real observed receipts) and says nothing
    is enforced."""
    from tests.support import REFUND_POLICY
    from tests.support import protected_refund

    use_policy(REFUND_POLICY.replace("schema: ctrlrun.policy/v2", "schema: ctrlrun.policy/v3\nmode: observe"))
    refund = protected_refund(remote)
    pay(refund, "txn_1")
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_2", amount=10**9)  # runs; would have been denied
    as_role("auditor")
    caption, rows = stats_table(client)
    assert caption == "The last 24 hours: OBSERVE MODE, nothing is enforced"
    assert rows[:2] == [("", "actions", "2"), ("", "would have been denied", "1")]
    assert ("", "would have needed approval", "0") in rows and ("", "ambiguous outcomes", "0") in rows


def test_index_stats_table_with_a_policy_that_does_not_load(refund, as_role, client, settings, tmp_path):
    """A broken policy file does not break the front page: the table shows enforce mode's counts and says why."""
    from ctrlrun.protect import reset_runtime

    pay(refund, "txn_1")
    bad = tmp_path / "broken.yaml"
    bad.write_text("schema: nope\n")
    settings.CTRLRUN_POLICY = str(bad)
    reset_runtime()
    as_role("auditor")
    response = client.get(url("index"))
    assert response.status_code == 200
    caption, rows = stats_table(client)
    assert caption == "The last 24 hours (enforce mode)" and rows[0] == ("", "actions", "1")
    assert "the policy did not load" in text(response) and str(bad) in text(response)


def command_lines(*args: str) -> list[str]:
    from django.core.management import call_command

    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue().splitlines()


def test_approval_list_shows_pending_first_oldest_first(refund, as_role, client, clock):
    """The inbox lists pending requests oldest first, then the answered ones, with age and time to expiry."""
    first = ask(refund, "txn_1")
    clock.advance(minutes=1)
    second = ask(refund, "txn_2", amount=70000)
    clock.advance(minutes=1)
    third = ask(refund, "txn_3", amount=80000)
    clock.advance(minutes=1)
    store.answer_approval(first, True, by="bob")
    clock.advance(minutes=1)
    as_role("approver")
    response = client.get(url("ctrlrun_approval_changelist"))
    assert listed(response) == [second, third, first]
    shown = text(response)
    rows = re.findall(r'<tr>(.*?)</tr>', shown.split('id="result_list"')[1], re.S)[1:]
    assert [re.search(r'<span title="(apr_\w+)">', r).group(1) for r in rows] == [second, third, first]
    assert 'amount=70000, payment_id="txn_2"' in rows[0] and "support-agent" in rows[0]
    assert "3\xa0minutes" in rows[0] and "in 12\xa0minutes" in rows[0]
    assert "granted" in rows[2]


def test_effect_list_shows_ambiguous_then_lapsed_first(refund, remote, as_role, client, clock):
    """The effects list puts ambiguous records first, then lapsed leases, then the rest, with age, attempt, error and hook."""
    pay(refund, "txn_old")
    lost = make_ambiguous(refund, remote, "txn_lost")
    hold_key("refund:txn_dead")
    clock.advance(minutes=6)
    hold_key("refund:txn_live")
    pay(refund, "txn_new")
    as_role("resolver")
    response = client.get(url("ctrlrun_effectrecord_changelist"))
    assert listed(response)[:2] == [lost, "refund:txn_dead"]
    assert set(listed(response)[2:]) == {"refund:txn_old", "refund:txn_live", "refund:txn_new"}
    shown = text(response)
    assert "TimeoutError: read timed out" in shown and "none (a person decides)" in shown and "lapsed" in shown


# --------------------------------------------------------------------------- CSRF


def test_console_forms_carry_a_csrf_token(refund, remote, as_role, client):
    """The confirmation, Ask and Resolve forms each include Django's CSRF token."""
    approval_id = ask(refund)
    key = make_ambiguous(protected_refund(remote, reconcile=Hook("unknown")), remote)
    as_role("superuser")
    confirm = client.get(approval_url(approval_id, "approve")).content.decode()
    assert re.search(r'id="ctrlrun-decide-form">\s*<input type="hidden" name="csrfmiddlewaretoken"', confirm)
    effect = client.get(effect_url(key)).content.decode()
    assert effect.count('name="csrfmiddlewaretoken"') >= 2
    assert re.search(r'id="ctrlrun-resolve-form"><input type="hidden" name="csrfmiddlewaretoken"', effect)


class FormNesting(HTMLParser):
    """Records, for each <form> on a page, the id of the form it was opened inside (None: top level)."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[str | None] = []
        self.parents: dict[str | None, str | None] = {}

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "form":
            form_id = dict(attrs).get("id") or dict(attrs).get("action")
            self.parents[form_id] = self.open[-1] if self.open else None
            self.open.append(form_id)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form" and self.open:
            self.open.pop()


def form_parents(response) -> dict[str | None, str | None]:
    parser = FormNesting()
    parser.feed(response.content.decode())
    return parser.parents


def test_console_forms_are_not_nested(refund, remote, as_role, client):
    """No console form sits inside the admin's change form: a browser would drop it and post the outer one."""
    approval_id = ask(refund)
    key = make_ambiguous(protected_refund(remote, reconcile=Hook("unknown")), remote)
    as_role("superuser")
    effect = form_parents(client.get(effect_url(key)))
    assert effect["ctrlrun-resolve-form"] is None and effect[effect_url(key, "ask")] is None
    assert effect["effectrecord_form"] is None
    assert form_parents(client.get(approval_url(approval_id, "approve")))["ctrlrun-decide-form"] is None
    assert set(form_parents(client.get(approval_url(approval_id))).values()) == {None}


def test_posts_without_csrf_token_are_refused(refund, remote):
    """With CSRF checks on, a POST without the token is 403 for approve, ask and resolve; with the page's token it works."""
    approval_id = ask(refund)
    hook = Hook("committed")
    key = make_ambiguous(protected_refund(remote, reconcile=hook), remote)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(make_user("superuser"))
    assert browser.post(approval_url(approval_id, "approve"), {"note": "x"}).status_code == 403
    assert browser.post(effect_url(key, "ask")).status_code == 403
    assert browser.post(effect_url(key, "resolve"), {"outcome": "committed", "reason": "x",
                                                    "attempt": "1"}).status_code == 403
    assert status(approval_id) == "pending" and EffectRecord.objects.get(pk=key).state == "ambiguous"
    assert hook.asked == [] and answer_events(approval_id) == []

    page = browser.get(approval_url(approval_id, "approve")).content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = browser.post(approval_url(approval_id, "approve"), {"note": "x", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and status(approval_id) == "granted"


# --------------------------------------------------------------------------- the recorded chain check (issue 9)


def chain_tile_class(client) -> str:
    page = text(client.get(url("index")))
    return re.search(r'<a class="tile chain ?([^"]*)" href="' + re.escape(url("ctrlrun_receipt_verify")), page).group(1)


def test_front_page_never_rehashes_the_chain(refund, as_role, client, monkeypatch):
    """Loading the index runs no chain check at all (it shows the last recorded one): 'never checked', warning."""
    pay(refund, "txn_1")

    def refused(*args, **kwargs):
        raise AssertionError("the front page re-hashed the chain")

    for module in (store, store.evidence):  # the façade, and where run_check finds them
        monkeypatch.setattr(module, "verify", refused)
        monkeypatch.setattr(module, "verify_incremental", refused)
    monkeypatch.setattr(store.evidence, "_verify", refused)
    as_role("auditor")
    assert overview_tiles(client)["chain"].startswith("unchecked receipt chain never checked (1 receipt)")
    assert chain_tile_class(client) == "attention"


def test_chain_tile_shows_the_last_check_its_age_what_came_since_and_warns_when_old(refund, as_role, client, clock,
                                                                                   settings):
    """After an incremental check: intact, its age, mode and position, receipts written since; a warning once older
    than CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS; an alert when the last check failed."""
    from django.core.management import call_command

    pay(refund, "txn_1")
    pay(refund, "txn_2")
    call_command("receipts", "--verify-chain", "--incremental", stdout=StringIO())
    clock.advance(minutes=4)
    pay(refund, "txn_3")
    as_role("auditor")
    assert overview_tiles(client)["chain"] == (
        "intact receipt chain intact, checked 4\xa0minutes ago (incremental, up to receipt 2); 1 receipt written "
        f"since -> {url('ctrlrun_receipt_verify')}")
    assert chain_tile_class(client) == ""
    clock.advance(hours=25)
    assert "older than 1\xa0day: run receipts --verify-chain --incremental" in overview_tiles(client)["chain"]
    assert chain_tile_class(client) == "attention"
    settings.CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS = 7 * 86400
    assert chain_tile_class(client) == ""

    tamper(3, Receipt.objects.get(seq=3).document.replace('"amount":100', '"amount":7'))
    with pytest.raises(CommandError):
        call_command("receipts", "--verify-chain", "--incremental", stdout=StringIO(), stderr=StringIO())
    assert overview_tiles(client)["chain"].startswith(
        "broken receipt chain broken, checked just now (incremental, up to receipt 3): 2 breaks")
    assert chain_tile_class(client) == "alert"


def test_verify_page_shows_the_last_check_and_runs_a_full_one_only_on_post(refund, as_role, client):
    """GET shows the last recorded check and records nothing; the button (POST) runs a full check and records it."""
    pay(refund, "txn_1")
    user = as_role("auditor")
    page = client.get(url("ctrlrun_receipt_verify"))
    assert "The chain has never been checked" in text(page) and has_id(page, "ctrlrun-run-check")
    assert not has_id(page, "ctrlrun-chain") and not ChainCheck.objects.exists()
    page = client.post(url("ctrlrun_receipt_verify"))
    assert "The chain is intact" in text(page) and "Full check, just now, recorded" in text(page)
    [row] = ChainCheck.objects.all()
    assert (row.mode, row.ok, row.receipt_seq, row.ran_by) == ("full", True, 1, f"console: {user.username}")
    page = client.get(url("ctrlrun_receipt_verify"))
    assert "Last check: intact" in text(page) and f"console: {user.username}" in text(page)
    assert ChainCheck.objects.count() == 1


def test_verify_button_needs_the_csrf_token_and_the_view_permission(refund, as_role):
    """A POST without the CSRF token, or by staff who may not read receipts, runs and records nothing."""
    pay(refund, "txn_1")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(make_user("auditor"))
    assert strict.post(url("ctrlrun_receipt_verify")).status_code == 403
    staff = Client()
    staff.force_login(make_user("staff"))
    assert staff.post(url("ctrlrun_receipt_verify")).status_code == 403
    assert not ChainCheck.objects.exists()
    page = strict.get(url("ctrlrun_receipt_verify"))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    assert strict.post(url("ctrlrun_receipt_verify"), {"csrfmiddlewaretoken": token}).status_code == 200
    assert ChainCheck.objects.count() == 1


def test_policy_source_help_text_is_shown_not_read_as_a_tag(refund, as_role, client):
    """The policy document page shows the source's help text with <string> as text (it was an HTML tag)."""
    pay(refund, "txn_1")
    as_role("superuser")
    page = client.get(url("ctrlrun_policydocument_change", quote(PolicyDocument.objects.get().hash)))
    raw = page.content.decode()
    assert "<string>" not in raw
    assert "a file&#x27;s path, or &lt;string&gt; for text given directly" in raw or \
        "a file's path, or &lt;string&gt; for text given directly" in raw


def test_verify_page_incremental_button_checks_what_was_added(refund, as_role, client):
    """The second button runs an incremental check from the last intact one, and records it."""
    pay(refund, "txn_1")
    as_role("auditor")
    client.post(url("ctrlrun_receipt_verify"))
    pay(refund, "txn_2")
    page = client.post(url("ctrlrun_receipt_verify"), {"mode": "incremental"})
    assert "The chain is intact" in text(page) and "Incremental check (after receipt 1 and event" in text(page)
    assert "1 of 1 new receipts verified" in text(page)
    assert [(c.mode, c.from_receipt_seq, c.receipt_seq) for c in ChainCheck.objects.order_by("id")] == [
        ("full", 0, 1), ("incremental", 1, 2)]


def test_the_approval_page_links_the_effect_key_only_once_its_record_exists(refund, as_role, client):
    """A pending request's effect key is text (its record is made when the approved call runs): a link
    would open "doesn't exist. Perhaps it was deleted?". Once the call ran, the key links to its record."""
    approval_id = ask(refund)
    assert not EffectRecord.objects.filter(pk="refund:txn_1").exists()
    as_role("superuser")
    page = client.get(approval_url(approval_id))
    raw = page.content.decode()
    assert page.status_code == 200 and "refund:txn_1" in text(page)
    assert f'href="{effect_url("refund:txn_1")}"' not in raw
    assert "no effect record yet" in text(page)
    store.answer_approval(approval_id, True, by="ana")
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(approval_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    page = client.get(approval_url(approval_id))
    assert f'href="{effect_url("refund:txn_1")}"' in page.content.decode()
    assert "no effect record yet" not in text(page)
    assert client.get(effect_url("refund:txn_1")).status_code == 200


def test_the_approval_page_says_when_an_attempt_gave_the_approval_back(refund, remote, as_role, client):
    """A granted request whose call raised NotExecuted is granted again: the page says it was used by an
    attempt that did nothing and given back (once), where it would otherwise read as never used."""
    approval_id = ask(refund)
    store.answer_approval(approval_id, True, by="ana")
    as_role("superuser")
    assert "given back" not in text(client.get(approval_url(approval_id)))
    remote.fail_with = ctrlrun.NotExecuted("connection refused")
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(approval_id):
        with pytest.raises(ctrlrun.NotExecuted):
            refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    page = text(client.get(approval_url(approval_id)))
    assert "given back 1 time: an attempt that provably did nothing used it (APPROVAL_RETURNED)" in page, page
