"""The console tells one story an operator can follow (issue 9): expired is expired everywhere, every
record links to the next (approval -> call -> effect -> receipts -> policy), the rule that decided is
shown as written, times have one format with the zone, lists are newest first, the wording is what
is true, and the pages work on any admin site (URLs from ``admin_site.name``), with bulk actions.

Django's test client on a real database (SQLite or PostgreSQL); data is made through
``ctrlrun.protect`` and the store."""
from __future__ import annotations

import re

import pytest
from django.contrib import admin as django_admin
from django.contrib.admin.utils import quote
from django.urls import path, reverse

import ctrlrun
from ctrlrun import store
from ctrlrun.models import Approval, EffectRecord, Event, PolicyDocument, Receipt
from tests.support import APPROVED_AMOUNT, ask, has_id, pay, shown_messages, status, text
from tests.support import Hook, make_ambiguous, make_user, protected_refund

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")


def url(name: str, *args, site: str = "admin") -> str:
    return reverse(f"{site}:{name}", args=[quote(a) for a in args])


def hrefs(response) -> list[str]:
    import html

    return [html.unescape(h) for h in re.findall(r'href="([^"]+)"', response.content.decode())]


# --------------------------------------------------------------------------- expired is expired everywhere


def test_an_expired_request_is_expired_in_the_list_the_filters_the_page_and_the_decide_urls(refund, client, clock):
    """A pending row past its expiry: shown expired, outside 'waiting', inside 'expired', no buttons, and both
    decide URLs refuse on GET (a redirect saying why), writing nothing."""
    late = ask(refund, "txn_1")
    clock.advance(minutes=10)
    fresh = ask(refund, "txn_2")
    clock.advance(minutes=6)  # late is past its 15 minutes, fresh is not
    client.force_login(make_user("approver", "ana"))
    listing = url("ctrlrun_approval_changelist")
    assert [a.pk for a in client.get(listing, {"status": "pending"}).context["cl"].result_list] == [fresh]
    assert [a.pk for a in client.get(listing, {"status": "expired"}).context["cl"].result_list] == [late]
    rows = re.findall(r"<tr>(.*?)</tr>", text(client.get(listing)).split('id="result_list"')[1], re.S)[1:]
    assert "pending" in rows[0] and fresh[:12] in rows[0]  # still waiting first
    assert late[:12] in rows[1] and re.search(r'ctrlrun-badge muted"[^>]*>expired<', rows[1]) and "pending" not in rows[1]

    page = client.get(url("ctrlrun_approval_change", late))
    assert "This request is expired" in text(page) and "waiting for a person" not in text(page)
    assert not has_id(page, "ctrlrun-approve") and not has_id(page, "ctrlrun-deny")
    for answer in ("approve", "deny"):
        response = client.get(url("ctrlrun_approval_decide", late, answer), follow=True)
        assert response.redirect_chain == [(url("ctrlrun_approval_change", late), 302)]
        [message] = shown_messages(response)
        assert message.startswith(f"Request {late} expired at ") and "Yes, approve" not in text(response)
    assert status(late) == "pending" and not Event.objects.filter(approval_id=late, type="APPROVAL_EXPIRED").exists()
    assert client.get(url("ctrlrun_approval_decide", fresh, "approve")).status_code == 200


def test_an_answered_request_offers_no_confirmation(refund, client):
    """Granted, denied or used: the decide page refuses on GET with what happened, not only on submit."""
    granted, denied = ask(refund, "txn_1"), ask(refund, "txn_2")
    store.answer_approval(granted, True, by="bob")
    store.answer_approval(denied, False, by="bob")
    client.force_login(make_user("approver", "ana"))
    for approval_id, word in ((granted, "granted"), (denied, "denied")):
        response = client.get(url("ctrlrun_approval_decide", approval_id, "approve"), follow=True)
        assert response.redirect_chain == [(url("ctrlrun_approval_change", approval_id), 302)]
        assert shown_messages(response) == [
            f"Request {approval_id} is already {word} (answered by bob); only a pending request can be answered"]
        assert "Yes, approve" not in text(response)


# --------------------------------------------------------------------------- the story, linked


def test_approval_call_receipts_effect_and_policy_link_to_each_other(refund, remote, client):
    """approve -> the call it unblocked (its page: action, decision with the rule's text, effect, approvals,
    receipts, events) -> its receipt (links back to call, effect, approval, policy) -> the effect page."""
    approval_id = ask(refund, "txn_1")
    asked_by = Approval.objects.get(pk=approval_id).action_id
    store.answer_approval(approval_id, True, by="bob", note="ok")
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(approval_id):
        refund(payment_id="txn_1", amount=APPROVED_AMOUNT)
    used_by = Approval.objects.get(pk=approval_id).consumed_by
    client.force_login(make_user("auditor", "otto"))

    approval_page = client.get(url("ctrlrun_approval_change", approval_id))
    links = hrefs(approval_page)
    assert url("ctrlrun_call", asked_by) in links and url("ctrlrun_call", used_by) in links
    assert url("ctrlrun_effectrecord_change", "refund:txn_1") in links
    policy_hash = Approval.objects.get(pk=approval_id).policy_hash
    assert url("ctrlrun_policydocument_change", policy_hash) in links
    receipt = Receipt.objects.get(action_id=used_by)
    assert url("ctrlrun_receipt_change", receipt.receipt_id) in links  # "used by the call ..., its receipts"
    # The rule that asked for a person, as the policy author wrote it.
    assert "rule[1]" in text(approval_page) and "when amount_gte: 0, amount_lte: 1000000 → approve" in text(approval_page)

    call = client.get(url("ctrlrun_call", used_by))
    assert call.status_code == 200
    shown = text(call)
    assert "stripe.refund" in shown and '"payment_id": "txn_1"' in shown
    assert "when amount_gte: 0, amount_lte: 1000000 → approve" in shown
    assert url("ctrlrun_effectrecord_change", "refund:txn_1") in hrefs(call)
    assert url("ctrlrun_approval_change", approval_id) in hrefs(call)
    assert url("ctrlrun_receipt_change", receipt.receipt_id) in hrefs(call)
    assert "EXECUTION_COMMITTED" in shown and 'class="ctrlrun-kv"' in shown  # events as key/value rows

    receipt_page = client.get(url("ctrlrun_receipt_change", receipt.receipt_id))
    links = hrefs(receipt_page)
    for expected in (url("ctrlrun_call", used_by), url("ctrlrun_effectrecord_change", "refund:txn_1"),
                     url("ctrlrun_approval_change", approval_id), url("ctrlrun_policydocument_change", policy_hash)):
        assert expected in links, expected
    assert "approved by bob" in text(receipt_page)

    effect_page = client.get(url("ctrlrun_effectrecord_change", "refund:txn_1"))
    top = text(effect_page).split('id="ctrlrun-proposed"')[1].split("</fieldset>")[0]
    assert "stripe.refund" in top and '"amount": 60000' in top and "support-agent" in top
    assert url("ctrlrun_call", used_by) in hrefs(effect_page)
    assert url("ctrlrun_receipt_change", receipt.receipt_id) in hrefs(effect_page)

    events = client.get(url("ctrlrun_event_changelist"), {"q": approval_id})
    assert url("ctrlrun_approval_change", approval_id) in hrefs(events)
    assert client.get(url("ctrlrun_call", "act_nope")).status_code == 404


def test_the_receipt_chain_links_back_and_a_bare_decision_and_the_default_deny_are_explained(refund, client):
    """A receipt links to the one before it; `decision` and `no_matching_rule` reasons are explained too."""
    email = ctrlrun.protect("email.send")(lambda msg_id: "sent")
    with ctrlrun.context(agent="mailer"):
        email(msg_id="m1")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_2", amount=-5)
    first, second = Receipt.objects.order_by("seq")
    client.force_login(make_user("auditor", "otto"))
    page = client.get(url("ctrlrun_receipt_change", second.receipt_id))
    assert url("ctrlrun_receipt_change", first.receipt_id) in hrefs(page)
    assert "no rule of this action matched, so it is denied" in text(page) or "always → deny" in text(page)
    assert "decision: allow" in text(client.get(url("ctrlrun_receipt_change", first.receipt_id)))
    assert "none: the first receipt" in text(client.get(url("ctrlrun_receipt_change", first.receipt_id)))


def test_an_ambiguous_receipt_says_its_effect_was_resolved_since(refund, remote, client):
    """The receipt stays `ambiguous` (evidence is never changed) but the list and the page say what happened since."""
    key = make_ambiguous(refund, remote, "txn_1")
    store.resolve(key, "committed", by="rita", reason="dashboard shows the refund")
    [receipt] = Receipt.objects.filter(effect_key=key)
    client.force_login(make_user("auditor", "otto"))
    listing = text(client.get(url("ctrlrun_receipt_changelist")))
    assert "resolved since:" in listing and 'ctrlrun-badge ok">committed<' in listing
    page = client.get(url("ctrlrun_receipt_change", receipt.receipt_id))
    assert has_id(page, "ctrlrun-resolved-since") and "resolved committed since" in text(page)
    assert Receipt.objects.get(pk=receipt.pk).result == "ambiguous"


# --------------------------------------------------------------------------- times, order, labels, wording


def test_one_time_format_with_the_zone_and_named_labels(refund, remote, client):
    """Detail pages show times as lists do (UTC to the second, with the zone); no raw `Ts` or `By ts` labels."""
    approval_id = ask(refund, "txn_1")
    key = make_ambiguous(refund, remote, "txn_2")
    client.force_login(make_user("auditor", "otto"))
    event = Event.objects.order_by("id").first()
    pages = [url("ctrlrun_approval_change", approval_id), url("ctrlrun_effectrecord_change", key),
             url("ctrlrun_receipt_change", Receipt.objects.first().pk), url("ctrlrun_event_change", event.pk),
             url("ctrlrun_policydocument_change", PolicyDocument.objects.first().pk),
             url("ctrlrun_receipt_changelist"), url("ctrlrun_event_changelist"), url("ctrlrun_approval_changelist")]
    for page in pages:
        shown = text(client.get(page))
        assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown), page
        assert not re.search(r"\b(a\.m\.|p\.m\.|noon|midnight)", shown), page
        assert ">Ts:<" not in shown and "By ts" not in shown and ">By ts<" not in shown, page


def test_lists_are_newest_first(refund, client):
    for n in range(3):
        pay(refund, f"txn_{n}")
    client.force_login(make_user("auditor", "otto"))
    receipts = [r.seq for r in client.get(url("ctrlrun_receipt_changelist")).context["cl"].result_list]
    assert receipts == sorted(receipts, reverse=True) and len(receipts) == 3
    events = [e.id for e in client.get(url("ctrlrun_event_changelist")).context["cl"].result_list]
    assert events == sorted(events, reverse=True)


def test_the_event_type_filter_lists_only_types_ctrlrun_writes(refund, client):
    pay(refund, "txn_1")
    client.force_login(make_user("auditor", "otto"))
    shown = text(client.get(url("ctrlrun_event_changelist")))
    filters = shown.split('id="changelist-filter"')[1]
    assert "EXECUTION_COMMITTED" in filters and "APPROVAL_REQUESTED" in filters
    assert "CLOCK_SKEW_DETECTED" in filters  # written on PostgreSQL (store/clock.py), so offered
    assert "EXECUTION_SUSPENDED" in filters and "EXECUTION_RESUMED" in filters  # ctrlrun.Suspended writes them
    for never in ("AUTHORITY_DENIED", "DELEGATION_CREATED"):
        assert never not in filters


def test_every_written_event_type_is_offered_by_the_filter(refund, remote):
    """EMITTED_EVENT_TYPES covers what the scenarios write: a type added to the code is added there."""
    from ctrlrun.states import EMITTED_EVENT_TYPES

    pay(refund, "txn_1")
    ask(refund, "txn_2")
    make_ambiguous(refund, remote, "txn_3")
    store.resolve("refund:txn_3", "failed", by="rita", reason="not at the remote")
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_4", amount=-1)
    written = set(Event.objects.values_list("type", flat=True))
    assert written <= EMITTED_EVENT_TYPES and len(written) >= 9


def test_a_resolved_failed_effect_is_not_shown_as_a_success(refund, remote, client):
    key = make_ambiguous(refund, remote, "txn_1")
    store.resolve(key, "failed", by="rita", reason="no refund at the remote")
    client.force_login(make_user("auditor", "otto"))
    page = text(client.get(url("ctrlrun_effectrecord_change", key)))
    box = re.search(r'<div class="ctrlrun-box ([a-z]+)" id="ctrlrun-resolution">', page).group(1)
    assert box != "ok" and "the remote did not act" in page and "A retry may run" in page


def test_the_policy_source_help_text_is_not_lost_as_html(client):
    """A help text with angle brackets is shown as text, not swallowed as an HTML tag."""
    with ctrlrun.context(agent="mailer"):
        ctrlrun.protect("email.send")(lambda msg_id: "sent")(msg_id="m1")
    client.force_login(make_user("auditor", "otto"))
    raw = client.get(url("ctrlrun_policydocument_change", PolicyDocument.objects.first().pk)).content.decode()
    assert "<string>" not in raw and "&lt;string&gt;" in raw


# --------------------------------------------------------------------------- bulk actions and any admin site


def test_bulk_ask_the_remote_reports_counts(remote, client):
    """Resolvers select ambiguous effects and ask the remote for each; what was not askable is counted."""
    hook = Hook("committed")
    refund = protected_refund(remote, reconcile=hook)
    lost = [make_ambiguous(refund, remote, f"txn_{n}") for n in (1, 2)]
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_3", amount=100)
    client.force_login(make_user("resolver", "rita"))
    response = client.post(url("ctrlrun_effectrecord_changelist"), {
        "action": "ask_selected", "_selected_action": [*lost, "refund:txn_3"], "index": 0}, follow=True)
    assert shown_messages(response) == [
        "Asked the remote about 2 effects: 2 committed. 1 skipped (not ambiguous, or no reconcile hook: a person "
        "decides on its page)."]
    assert sorted(hook.asked) == sorted(lost)
    assert set(EffectRecord.objects.filter(pk__in=lost).values_list("state", flat=True)) == {"committed"}
    started = Event.objects.filter(type="RECONCILIATION_STARTED").values_list("data", flat=True)
    assert [d["trigger"] for d in started] == ["operator", "operator"]


def test_auditors_get_no_bulk_action(remote, client):
    refund = protected_refund(remote, reconcile=Hook("committed"))
    key = make_ambiguous(refund, remote, "txn_1")
    client.force_login(make_user("auditor", "otto"))
    assert "ask_selected" not in text(client.get(url("ctrlrun_effectrecord_changelist")))
    response = client.post(url("ctrlrun_effectrecord_changelist"),
                           {"action": "ask_selected", "_selected_action": [key], "index": 0}, follow=True)
    assert EffectRecord.objects.get(pk=key).state == "ambiguous"
    assert response.status_code == 200


ops_site = django_admin.AdminSite(name="ops")
for _model, _model_admin in list(django_admin.site._registry.items()):
    if _model._meta.app_label == "ctrlrun":
        ops_site.register(_model, type(_model_admin))
# Both sites at once: a link built with a hard-coded "admin:" would lead from /ops/ back to /admin/.
urlpatterns = [path("admin/", django_admin.site.urls), path("ops/", ops_site.urls)]


@pytest.mark.urls(__name__)
def test_the_console_works_on_another_admin_site(refund, remote, client):
    """Registered on an AdminSite named "ops" at /ops/: every ctrlrun link and action stays on that site."""
    approval_id = ask(refund, "txn_1")
    key = make_ambiguous(refund, remote, "txn_2")
    client.force_login(make_user("approver", "ana"))
    page = client.get(f"/ops/ctrlrun/approval/{quote(approval_id)}/change/")
    assert page.status_code == 200
    ctrlrun_links = [h for h in hrefs(page) if "/ctrlrun/" in h and not h.startswith("/static/")]
    assert ctrlrun_links and all(h.startswith("/ops/") for h in ctrlrun_links), ctrlrun_links
    approve = f"/ops/ctrlrun/approval/{quote(approval_id)}/decide/approve/"
    assert approve in ctrlrun_links
    assert client.get(approve).status_code == 200
    response = client.post(approve, {"note": "ok"}, follow=True)
    assert response.redirect_chain == [(f"/ops/ctrlrun/approval/{quote(approval_id)}/change/", 302)]
    assert status(approval_id) == "granted"
    client.force_login(make_user("resolver", "rita"))
    effect = client.get(f"/ops/ctrlrun/effectrecord/{quote(key)}/change/")
    assert all(h.startswith("/ops/") for h in hrefs(effect) if "/ctrlrun/" in h and not h.startswith("/static/"))
    response = client.post(f"/ops/ctrlrun/effectrecord/{quote(key)}/resolve/",
                           {"outcome": "failed", "reason": "not there", "attempt": 1}, follow=True)
    assert response.redirect_chain == [(f"/ops/ctrlrun/effectrecord/{quote(key)}/change/", 302)]
    assert EffectRecord.objects.get(pk=key).state == "failed"


def test_a_reason_of_invisible_characters_is_no_reason(refund, remote, client):
    """As the resolve command: a reason made only of spaces and invisible characters is refused; nothing moves."""
    key = make_ambiguous(refund, remote, "txn_1")
    client.force_login(make_user("resolver", "rita"))
    for blank in ("\u200b", " \u2066\u2069 ", "\ufeff\n"):
        response = client.post(url("ctrlrun_effectrecord_resolve", key),
                               {"outcome": "failed", "reason": blank, "attempt": 1}, follow=True)
        [message] = shown_messages(response)
        assert message.startswith("not resolved: reason: a reason is required"), message
    assert EffectRecord.objects.get(pk=key).state == "ambiguous"


# --------------------------------------------------------------------------- found by an operator's review


def owner_sql(statement: str, *params) -> None:
    """As the database's owner could: the guard's triggers off for one statement."""
    from django.db import connection

    from tests.support import evidence_unguarded

    with evidence_unguarded(), connection.cursor() as cursor:
        cursor.execute(statement, list(params))


def test_a_granted_request_past_its_expiry_is_expired_not_granted(refund, client, clock):
    approval_id = ask(refund, "txn_1")
    store.answer_approval(approval_id, True, by="bob")
    clock.advance(minutes=16)
    client.force_login(make_user("auditor", "otto"))
    listing = url("ctrlrun_approval_changelist")
    assert [a.pk for a in client.get(listing, {"status": "granted"}).context["cl"].result_list] == []
    assert [a.pk for a in client.get(listing, {"status": "expired"}).context["cl"].result_list] == [approval_id]
    assert re.search(r'ctrlrun-badge muted"[^>]*>expired<', text(client.get(listing)))
    page = text(client.get(url("ctrlrun_approval_change", approval_id)))
    assert "This request is expired (answered by bob)" in page and "may run once" not in page
    assert "It was not used before" in page


def test_a_nul_in_a_bulk_selection_selects_nothing(remote, client):
    refund = protected_refund(remote, reconcile=Hook("committed"))
    key = make_ambiguous(refund, remote, "txn_1")
    client.force_login(make_user("resolver", "rita"))
    for value in ("hex:00", "a\x00b", "hex:" + "a\x00".encode().hex()):
        response = client.post(url("ctrlrun_effectrecord_changelist"),
                               {"action": "ask_selected", "_selected_action": [value], "index": 0}, follow=True)
        assert response.status_code == 200
    assert EffectRecord.objects.get(pk=key).state == "ambiguous"


def test_rows_changed_outside_ctrlrun_are_marked_in_the_lists_and_the_front_page(refund, remote, client):
    """A receipt whose columns no longer match its hashed document, an approval and an effect record without
    ctrlrun's signature: marked in their lists (not shown as normal), the receipt's page says so, the front
    page does not count the request as one a person can answer."""
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_big", amount=5_000_000)
    denied = Receipt.objects.get(effect_key="refund:txn_big")
    owner_sql('UPDATE "ctrlrun_receipt" SET "result" = %s, "decision" = %s WHERE "receipt_id" = %s',
              "committed", "allow", denied.receipt_id)
    approval_id = ask(refund, "txn_2")
    owner_sql('UPDATE "ctrlrun_approval" SET "agent" = %s WHERE "approval_id" = %s', "trusted-agent", approval_id)
    key = make_ambiguous(refund, remote, "txn_3")
    owner_sql('UPDATE "ctrlrun_effectrecord" SET "state" = %s WHERE "effect_key" = %s', "failed", key)
    client.force_login(make_user("auditor", "otto"))

    receipts = text(client.get(url("ctrlrun_receipt_changelist")))
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", receipts, re.S) if denied.receipt_id[:12] in r)
    assert "changed outside ctrlrun" in row and "allow → " not in row
    page = client.get(url("ctrlrun_receipt_change", denied.receipt_id))
    assert has_id(page, "ctrlrun-tampered") and "disagree with its hashed document" in text(page)
    approvals = text(client.get(url("ctrlrun_approval_changelist")))
    assert "changed outside ctrlrun" in approvals.split('id="result_list"')[1]
    effects = text(client.get(url("ctrlrun_effectrecord_changelist")))
    assert "changed outside ctrlrun" in effects.split('id="result_list"')[1]
    effect_page = text(client.get(url("ctrlrun_effectrecord_change", key)))
    assert "A retry may run" not in effect_page and "cannot be trusted" in effect_page
    approval_page = text(client.get(url("ctrlrun_approval_change", approval_id)))
    assert "Approving authorises exactly the action below" not in approval_page
    front = text(client.get(url("index")))
    assert "0 approvals waiting" in " ".join(re.sub(r"<[^>]+>", " ", front).split())
    assert "1 more changed outside ctrlrun" in front


def test_the_page_of_the_call_that_asked_shows_the_rule_and_policy(refund, client):
    approval_id = ask(refund, "txn_1")
    asked_by = Approval.objects.get(pk=approval_id).action_id
    client.force_login(make_user("auditor", "otto"))
    page = text(client.get(url("ctrlrun_call", asked_by)))
    assert "when amount_gte: 0, amount_lte: 1000000 → approve" in page
    assert url("ctrlrun_policydocument_change", Approval.objects.get(pk=approval_id).policy_hash) in page


def test_a_key_no_record_was_made_for_is_not_a_link_to_nothing(refund, client):
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_big", amount=5_000_000)
    receipt = Receipt.objects.get(effect_key="refund:txn_big")
    client.force_login(make_user("auditor", "otto"))
    for page in (url("ctrlrun_receipt_changelist"), url("ctrlrun_receipt_change", receipt.receipt_id),
                 url("ctrlrun_call", receipt.action_id)):
        assert url("ctrlrun_effectrecord_change", "refund:txn_big") not in text(client.get(page)), page


def test_the_history_page_uses_the_console_time_format(refund, client):
    approval_id = ask(refund, "txn_1")
    client.force_login(make_user("approver", "ana"))
    client.post(url("ctrlrun_approval_decide", approval_id, "deny"), {"note": "no"})
    page = text(client.get(url("ctrlrun_approval_history", approval_id)))
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page) and not re.search(r"\b(a\.m\.|p\.m\.)", page)


def test_an_unknown_filter_value_is_said_and_dropped(refund, client):
    pay(refund, "txn_1")
    client.force_login(make_user("auditor", "otto"))
    for model, query in (("approval", "status=bogus"), ("effectrecord", "attention=bogus"),
                         ("receipt", "result=bogus")):
        response = client.get(f"{url(f'ctrlrun_{model}_changelist')}?{query}", follow=True)
        assert response.redirect_chain[0][0] == url(f"ctrlrun_{model}_changelist")
        [message] = shown_messages(response)
        assert message.startswith("Unknown filter value") and "bogus" in message


def test_the_policy_list_does_not_repeat_the_help_text_and_notes_are_bounded(refund, client):
    pay(refund, "txn_1")
    client.force_login(make_user("approver", "ana"))
    assert "Where the text was read from" not in text(client.get(url("ctrlrun_policydocument_changelist")))
    approval_id = ask(refund, "txn_2")
    response = client.post(url("ctrlrun_approval_decide", approval_id, "approve"), {"note": "x" * 200_000})
    assert response.status_code == 200 and status(approval_id) == "pending"  # the form says it is too long
    assert "Ensure this value has at most 4000 characters" in text(response)


def test_a_bad_chain_check_age_setting_is_named_not_a_500(client, settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS = "a day"
    client.force_login(make_user("auditor", "otto"))
    page = client.get(url("index"))
    assert page.status_code == 200
    assert "CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS must be a positive number of seconds" in text(page)
    with pytest.raises(SystemCheckError, match="CTRLRUN_CHAIN_CHECK_MAX_AGE_SECONDS"):
        call_command("check")
