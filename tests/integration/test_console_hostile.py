"""Hostile input at the places a person reads an action to decide, and at the project's edges.

- Invisible and direction-changing characters (U+202E and the rest) in an action are shown
  escaped, highlighted, with a warning, on the approval page, its confirmation page, the effect
  record page and the lists, and by the ``approvals`` and ``inspect`` commands; never raw.
- The console recognises a request made for the viewer however the name is spelt (case,
  whitespace, invisible characters, Cyrillic/Greek look-alikes) and refuses the self-approval.
- Nonsense date-hierarchy values and NUL characters in admin URLs answer a redirect or a 404,
  never a 500, on SQLite and on PostgreSQL.
- ``--last`` beyond what the database can hold is a usage error; a 500 with DEBUG off is logged
  on stderr; a DATABASE_URL for another database is refused in one line.

Everything runs on the real test database, with the test client and real OS processes.
"""
from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from io import StringIO

import pytest
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

import ctrlrun
from ctrlrun.models import Approval, EffectRecord, Event, Receipt
from tests.support import REFUND_POLICY
from tests.support import REPO, make_ambiguous, make_user

APPROVED_AMOUNT = 60000  # in the approve band of the refund policy
RLO = "\u202e"
HOSTILE_ID = f"txn_1{RLO}0001"
SHOWN_RLO = '<span class="ctrlrun-hidden" title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</span>'
WARNING_ID = 'id="ctrlrun-hidden-warning"'

#: The refund policy, plus an approve-only action whose effect key and resource carry what its argument hides.
#: (The policy itself refuses hidden characters in action names; rows written before, or by another
#: writer, may still hold them: the name is tested on model instances below.)
HOSTILE_POLICY = REFUND_POLICY + """\
  ops.tag:
    effect: "tag:{target}"
    resource: "res:{target}"
    decision: approve
"""
PLANTED = ["\u202e", "\u2066", "\u200b", "\u2067", "\ufeff", "\x85"]


# --------------------------------------------------------------------------- helpers


def ask(refund, payment_id: str = HOSTILE_ID, user: str | None = None, agent: str = "support-agent") -> str:
    """A refund in the approve band; returns the id of the pending request it leaves."""
    with ctrlrun.context(agent=agent, user=user), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id=payment_id, amount=APPROVED_AMOUNT)
    return caught.value.request_id


def ask_tag() -> str:
    """An approve-only action whose argument keys and values, principal, effect key and resource all hide characters."""

    @ctrlrun.protect("ops.tag")
    def tag(target: str, labels: dict) -> None:
        raise AssertionError("an approve decision never runs the function")

    with ctrlrun.context(agent="tagger\u200b", user="dana\u2067"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        tag(target="t\ufeff1", labels={"k\u202ey": "v\x85"})
    return caught.value.request_id


def approval_url(approval_id: str, answer: str | None = None) -> str:
    if answer:
        return reverse("admin:ctrlrun_approval_decide", args=[quote(approval_id), answer])
    return reverse("admin:ctrlrun_approval_change", args=[quote(approval_id)])


def effect_url(key: str) -> str:
    return reverse("admin:ctrlrun_effectrecord_change", args=[quote(key)])


def page_text(response) -> str:
    assert response.status_code == 200, response.status_code
    return response.content.decode()


def assert_nothing_raw(content: str) -> None:
    """None of the planted invisible characters reaches the page as itself."""
    raw = [f"U+{ord(c):04X}" for c in PLANTED if c in content]
    assert raw == [], f"rendered raw: {raw}"


def shown_json_blocks(content: str) -> list[object]:
    """Every ``<pre class="ctrlrun-json">`` on the page, marks removed, decoded as JSON."""
    blocks = re.findall(r'<pre class="ctrlrun-json">(.*?)</pre>', content, re.S)
    return [json.loads(html.unescape(re.sub(r"<[^>]+>", "", block))) for block in blocks]


def warning_shown(content: str) -> bool:
    text = html.unescape(re.sub(r"<[^>]+>", "", content))
    return (WARNING_ID in content and "invisible or direction-changing characters" in text
            and "exactly what will run" in text)


@pytest.fixture
def hostile_policy(use_policy):
    use_policy(HOSTILE_POLICY)


@pytest.fixture
def approver(client, console_groups):
    client.force_login(make_user("approver", "ana"))


# --------------------------------------------------------------------------- A: the console shows hidden characters escaped


@pytest.mark.usefixtures("store_db", "hook_registry", "approver")
def test_approval_page_escapes_the_override_and_warns(refund, client):
    """The approval page shows txn_1\\u202e0001 escaped and highlighted, warns, and never renders U+202E raw."""
    approval_id = ask(refund)
    content = page_text(client.get(approval_url(approval_id)))
    assert_nothing_raw(content)
    assert f"txn_1{SHOWN_RLO}0001" in content
    assert warning_shown(content)
    assert {"amount": APPROVED_AMOUNT, "payment_id": HOSTILE_ID} in shown_json_blocks(content)


@pytest.mark.usefixtures("store_db", "hook_registry", "approver")
def test_decide_page_escapes_and_shows_exactly_what_will_run(refund, client):
    """The confirmation page warns, shows the escape, and its argument block decodes to exactly the stored arguments."""
    approval_id = ask(refund)
    content = page_text(client.get(approval_url(approval_id, "approve")))
    assert_nothing_raw(content)
    assert warning_shown(content) and SHOWN_RLO in content
    stored = json.loads(Approval.objects.get(pk=approval_id).action_json)["arguments"]
    assert stored == {"amount": APPROVED_AMOUNT, "payment_id": HOSTILE_ID}
    assert shown_json_blocks(content) == [stored]
    assert "refund:txn_1" + SHOWN_RLO + "0001" in content  # the effect key


@pytest.mark.usefixtures("store_db", "hook_registry", "approver")
def test_a_request_without_hidden_characters_has_no_warning(refund, client):
    """An ordinary request shows no warning and no highlighted escape."""
    approval_id = ask(refund, payment_id="txn_plain")
    for content in (page_text(client.get(approval_url(approval_id))),
                    page_text(client.get(approval_url(approval_id, "approve")))):
        assert WARNING_ID not in content and "ctrlrun-hidden" not in content.replace("ctrlrun-hidden-", "")


@pytest.mark.usefixtures("hostile_policy", "transactional_db", "hook_registry", "approver")
def test_every_field_of_the_action_is_escaped(client):
    """Argument keys and values, agent, user, effect key and resource: each is escaped on both pages."""
    approval_id = ask_tag()
    detail = page_text(client.get(approval_url(approval_id)))
    decide = page_text(client.get(approval_url(approval_id, "approve")))
    mark = '<span class="ctrlrun-hidden" title="U+{}">\\u{}</span>'
    for content in (detail, decide):
        assert_nothing_raw(content)
        assert warning_shown(content)
        assert "tagger" + mark.format("200B ZERO WIDTH SPACE", "200b") in content                 # agent
        assert "dana" + mark.format("2067 RIGHT-TO-LEFT ISOLATE", "2067") in content              # user
        assert "tag:t" + mark.format("FEFF ZERO WIDTH NO-BREAK SPACE", "feff") + "1" in content   # effect key
        assert "k" + mark.format("202E RIGHT-TO-LEFT OVERRIDE", "202e") + "y" in content          # argument key
        assert "v" + mark.format("0085 (a control character)", "0085") in content                 # argument value
    assert "res:t" + mark.format("FEFF ZERO WIDTH NO-BREAK SPACE", "feff") + "1" in detail          # resource
    stored = json.loads(Approval.objects.get(pk=approval_id).action_json)["arguments"]
    assert stored in shown_json_blocks(detail) and shown_json_blocks(decide) == [stored]


@pytest.mark.usefixtures("hostile_policy", "transactional_db", "hook_registry", "approver")
def test_lists_escape_arguments_effect_keys_and_principals(client):
    """The approval inbox and the effect and receipt lists show escapes, never the raw characters."""
    ask_tag()
    inbox = page_text(client.get(reverse("admin:ctrlrun_approval_changelist")))
    assert_nothing_raw(inbox)
    assert "\\u202e" in inbox and "\\u200b" in inbox and "\\u2067" in inbox
    assert 'class="ctrlrun-hidden"' in inbox


@pytest.mark.usefixtures("transactional_db")  # the approval's effect key is a link only if its record is stored
def test_action_names_in_stored_rows_are_escaped_in_every_column():
    """An action name holding U+2066 in a row (the policy refuses such names now; old rows may hold them) is
    escaped by the approval, effect, receipt and event columns and fields."""
    from django.contrib import admin as django_admin

    from ctrlrun.admin import ApprovalAdmin, EffectRecordAdmin, EventAdmin, ReceiptAdmin

    name = "ops.tag\u2066"
    shown = 'ops.tag<span class="ctrlrun-hidden" title="U+2066 LEFT-TO-RIGHT ISOLATE">\\u2066</span>'
    approval = Approval(approval_id="apr_" + "0" * 32, action=name, agent="a\u202e", user="u\u200b",
                        effect_key="k\ufeff", approver="x\u2067", note="n\u202e\nline",
                        action_json=json.dumps({"name": name, "arguments": {"k\u202e": "v"}, "resource": "r\u2066",
                                                "environment": "production", "principal": {"agent": "a\u202e"}}))
    approvals = ApprovalAdmin(Approval, django_admin.site)
    assert approvals.shown_action(approval) == shown
    assert "\\u202e" in approvals.principal(approval) and "\\u200b" in approvals.principal(approval)
    assert "\\ufeff" in approvals.shown_effect_key(approval) and "\\u2067" in approvals.shown_approver(approval)
    assert "\\u2066" in approvals.resource(approval) and "<br>" in approvals.shown_note(approval)
    assert "ctrlrun-hidden-badge" in approvals.key_arguments(approval)
    effects = EffectRecordAdmin(EffectRecord, django_admin.site)
    effect = EffectRecord(effect_key="k\u202e", action=name, error="boom\u2066", resolved_by="r\u200b")
    assert effects.shown_action(effect) == shown and "\\u202e" in effects.shown_key(effect)
    assert "\\u2066" in effects.shown_error(effect) and "\\u2066" in effects.last_error(effect)
    assert "\\u200b" in effects.shown_resolved_by(effect)
    receipts = ReceiptAdmin(Receipt, django_admin.site)
    receipt = Receipt(action=name, agent="a\u202e", effect_key="k\u200b")
    assert receipts.shown_action(receipt) == shown
    assert "\\u202e" in receipts.shown_agent(receipt) and "\\u200b" in receipts.shown_key(receipt)
    events = EventAdmin(Event, django_admin.site)
    event = Event(effect_key="k\u202e", data={"note": "x\u2066"})
    assert "\\u202e" in events.shown_key(event) and "\\u2066" in events.short_data(event)
    for value in (approvals.shown_action(approval), effects.shown_key(effect), events.short_data(event)):
        assert not any(c in value for c in PLANTED + ["\u2066"])


@pytest.mark.usefixtures("store_db", "hook_registry", "console_groups")
def test_effect_record_page_escapes_the_key_and_its_events(refund, remote, client):
    """An ambiguous effect whose key hides U+202E: the record page, its events and the lists show it escaped, with the warning."""
    client.force_login(make_user("resolver", "rita"))
    key = make_ambiguous(refund, remote, HOSTILE_ID)
    assert RLO in key
    content = page_text(client.get(effect_url(key)))
    assert_nothing_raw(content)
    assert warning_shown(content)
    assert "refund:txn_1" + SHOWN_RLO + "0001" in content
    timeline = re.search(r'id="ctrlrun-events">(.*?)</table>', content, re.S).group(1)
    assert "\\u202e" in timeline
    for listing in ("admin:ctrlrun_effectrecord_changelist", "admin:ctrlrun_receipt_changelist",
                    "admin:ctrlrun_event_changelist"):
        shown = page_text(client.get(reverse(listing)))
        assert_nothing_raw(shown)
        assert "\\u202e" in shown, listing
    receipt = Receipt.objects.get(effect_key=key)
    detail = page_text(client.get(reverse("admin:ctrlrun_receipt_change", args=[quote(receipt.receipt_id)])))
    assert_nothing_raw(detail)


@pytest.mark.usefixtures("store_db", "hook_registry", "console_groups")
def test_resolving_a_hidden_key_leaves_escaped_names_in_messages_history_and_recent_actions(refund, remote, client):
    """After resolving that effect, the message, its history page and the front page's recent actions show the key escaped."""
    client.force_login(make_user("resolver", "rita"))
    key = make_ambiguous(refund, remote, HOSTILE_ID)
    done = client.post(reverse("admin:ctrlrun_effectrecord_resolve", args=[quote(key)]),
                       {"outcome": "committed", "reason": f"seen at the remote{RLO}", "attempt": "1"}, follow=True)
    assert EffectRecord.objects.get(pk=key).state == "committed"
    [message] = [str(m) for m in done.context["messages"]]
    assert RLO not in message and "refund:txn_1\\u202e0001 resolved committed" in message
    assert_nothing_raw(done.content.decode())
    history = page_text(client.get(reverse("admin:ctrlrun_effectrecord_history", args=[quote(key)])))
    assert_nothing_raw(history)
    assert "refund:txn_1\\u202e0001" in history
    front = page_text(client.get(reverse("admin:index")))
    assert_nothing_raw(front)
    assert "refund:txn_1\\u202e0001" in front  # the recent-actions list names the object


@pytest.mark.usefixtures("store_db", "hook_registry", "approver")
def test_a_note_with_hidden_characters_is_escaped_once_answered(refund, client):
    """The approver's note is shown escaped on the answered request's page (its line breaks kept)."""
    approval_id = ask(refund, payment_id="txn_note")
    client.post(approval_url(approval_id, "deny"), {"note": f"looks odd{RLO}\nsecond line"})
    assert Approval.objects.get(pk=approval_id).status == "denied"
    content = page_text(client.get(approval_url(approval_id)))
    assert_nothing_raw(content)
    assert f"looks odd{SHOWN_RLO}" in content


# --------------------------------------------------------------------------- A: the commands


@pytest.mark.usefixtures("store_db", "hook_registry")
def test_approvals_command_escapes_and_warns(refund):
    """'approvals' prints the argument escaped on its line and a warning naming the request on stderr."""
    approval_id = ask(refund)
    out, err = StringIO(), StringIO()
    call_command("approvals", stdout=out, stderr=err)
    [line] = out.getvalue().splitlines()
    assert RLO not in out.getvalue() + err.getvalue()
    assert line.startswith(f"{approval_id}  pending  stripe.refund  ")
    assert '"payment_id":"txn_1\\u202e0001"' in line
    assert approval_id in err.getvalue()
    assert "invisible or direction-changing characters" in err.getvalue()
    assert "exactly what will run" in err.getvalue()


@pytest.mark.usefixtures("hostile_policy", "transactional_db", "hook_registry")
def test_approvals_command_escapes_name_and_principal():
    """'approvals' escapes argument names, the agent and the user too."""
    ask_tag()
    out, err = StringIO(), StringIO()
    call_command("approvals", stdout=out, stderr=err)
    printed = out.getvalue()
    assert not any(c in printed for c in PLANTED)
    assert "tagger\\u200b (user dana\\u2067)" in printed
    assert '"k\\u202ey":"v\\u0085"' in printed


@pytest.mark.usefixtures("store_db", "hook_registry")
def test_approvals_command_without_hidden_characters_is_quiet(refund):
    """An ordinary request prints its line and no warning."""
    ask(refund, payment_id="txn_plain")
    out, err = StringIO(), StringIO()
    call_command("approvals", stdout=out, stderr=err)
    assert '"payment_id":"txn_plain"' in out.getvalue() and err.getvalue() == ""


@pytest.mark.usefixtures("store_db", "hook_registry")
def test_inspect_escapes_and_warns(refund, remote):
    """'inspect' prints the arguments and effect key escaped, with the warning, and no raw U+202E anywhere."""
    key = make_ambiguous(refund, remote, HOSTILE_ID)
    action_id = EffectRecord.objects.get(pk=key).action_id
    out = StringIO()
    call_command("inspect", action_id, stdout=out)
    printed = out.getvalue()
    assert RLO not in printed
    lines = printed.splitlines()
    assert any(line.startswith("arguments") and '"payment_id": "txn_1\\u202e0001"' in line for line in lines)
    assert any(line.startswith("effect") and "refund:txn_1\\u202e0001  ambiguous" in line for line in lines)
    assert "invisible or direction-changing characters" in printed and "exactly what will run" in printed


@pytest.mark.usefixtures("store_db", "hook_registry")
def test_inspect_json_stays_valid_and_exact(refund, remote):
    """'inspect --json' escapes the characters as JSON escapes: valid JSON that decodes to the exact arguments."""
    key = make_ambiguous(refund, remote, HOSTILE_ID)
    action_id = EffectRecord.objects.get(pk=key).action_id
    out = StringIO()
    call_command("inspect", action_id, "--json", stdout=out)
    assert RLO not in out.getvalue() and "\\u202e" in out.getvalue()
    document = json.loads(out.getvalue())
    assert document["arguments"] == {"amount": 100, "payment_id": HOSTILE_ID}
    assert document["effect"]["effect_key"] == key


@pytest.mark.usefixtures("hostile_policy", "transactional_db", "hook_registry")
def test_inspect_escapes_name_principal_resource():
    """'inspect' of the hostile request escapes the agent, user, resource and argument names."""
    approval_id = ask_tag()
    action_id = Approval.objects.get(pk=approval_id).action_id
    out = StringIO()
    call_command("inspect", action_id, stdout=out)
    printed = out.getvalue()
    assert not any(c in printed for c in PLANTED)
    assert f"{action_id}  ops.tag" in printed
    assert "tagger\\u200b (user dana\\u2067)" in printed and "res:t\\ufeff1" in printed
    assert '"k\\u202ey": "v\\u0085"' in printed


# --------------------------------------------------------------------------- B: self-approval by another spelling


SPELLINGS = [" alice", "Alice", "alice\u200b", "\u0430lice", "ALICE ", "\u202ealice"]


@pytest.mark.parametrize("requested_for", SPELLINGS, ids=ascii)
@pytest.mark.usefixtures("store_db", "hook_registry", "console_groups")
def test_self_approval_by_another_spelling_is_refused(requested_for, refund, client):
    """alice sees no buttons on a request made for her under another spelling; GET and POST of the answer are refused."""
    approval_id = ask(refund, payment_id="txn_self", user=requested_for)
    client.force_login(make_user("approver", "alice"))
    detail = page_text(client.get(approval_url(approval_id)))
    assert 'id="ctrlrun-approve"' not in detail and 'id="ctrlrun-deny"' not in detail
    assert "so another person must answer it" in html.unescape(detail)
    for answer in ("approve", "deny"):
        shown = client.get(approval_url(approval_id, answer), follow=True)  # no confirmation form
        posted = client.post(approval_url(approval_id, answer), {"note": "mine"}, follow=True)
        for response in (shown, posted):
            assert response.redirect_chain == [(approval_url(approval_id), 302)]
            [message] = [str(m) for m in response.context["messages"]]
            assert "who cannot answer it; another person must" in message
    row = Approval.objects.get(pk=approval_id)
    assert (row.status, row.approver) == ("pending", None)
    assert not Event.objects.filter(approval_id=approval_id, type__in=["APPROVAL_GRANTED", "APPROVAL_DENIED"]).exists()


@pytest.mark.usefixtures("store_db", "hook_registry", "console_groups")
def test_another_person_may_still_answer(refund, client):
    """A request made for alicia is answered by alice as before: the normalisation refuses only the same person."""
    approval_id = ask(refund, payment_id="txn_other", user="alicia")
    client.force_login(make_user("approver", "alice"))
    assert 'id="ctrlrun-approve"' in page_text(client.get(approval_url(approval_id)))
    assert client.get(approval_url(approval_id, "approve")).status_code == 200
    client.post(approval_url(approval_id, "approve"), {"note": "checked"})
    assert Approval.objects.get(pk=approval_id).status == "granted"


# --------------------------------------------------------------------------- C1: --last beyond the database


def manage_py(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run manage.py in a real process with the project's settings (not the test settings)."""
    base = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    base.update(env)
    return subprocess.run([sys.executable, str(REPO / "manage.py"), *args], cwd=REPO, env=base,
                          capture_output=True, text=True, timeout=120)


def database_url() -> str:
    """The test database as a DATABASE_URL, for a manage.py process."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings['NAME']}"
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    return (f"postgresql://{settings.get('USER') or 'postgres'}{password}@{settings.get('HOST') or '127.0.0.1'}:"
            f"{settings.get('PORT') or 5432}/{settings['NAME']}")


@pytest.mark.usefixtures("store_db", "hook_registry")
def test_last_beyond_the_database_is_a_usage_error(refund):
    """'receipts --last 99999999999999999999999' exits 2 with a one-line usage error, not a database error."""
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_small", amount=100)
    done = manage_py("receipts", "--last", "99999999999999999999999", DATABASE_URL=database_url())
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line == ("Error: argument --last: must be at most 9223372036854775807 (2**63 - 1), got "
                    "99999999999999999999999 ('manage.py receipts --help' lists the options)")


def test_every_usage_error_is_one_line():
    """Other usage errors of a ctrlrun command (--last 0, an unknown option) are one 'Error:' line too, exit 2."""
    for args in (["receipts", "--last", "0"], ["receipts", "--lats", "3"], ["approvals", "--status", "maybe"]):
        done = manage_py(*args)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert line.startswith("Error: ") and line.endswith("--help' lists the options)"), line


@pytest.mark.usefixtures("store_db", "hook_registry")
def test_last_at_the_cap_is_accepted(refund):
    """The largest accepted --last (2**63 - 1) reaches the database and lists the receipts."""
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_small", amount=100)
    done = manage_py("receipts", "--last", str(2**63 - 1), DATABASE_URL=database_url())
    assert done.returncode == 0, done.stderr
    assert "refund:txn_small" in done.stdout


def test_positive_int_bounds():
    """positive_int accepts 1 and 2**63 - 1 and refuses 0 and 2**63 with a message saying the bound."""
    import argparse

    from ctrlrun.management.base import positive_int

    assert positive_int("1") == 1 and positive_int(str(2**63 - 1)) == 2**63 - 1
    for bad, words in (("0", "at least 1"), (str(2**63), "at most 9223372036854775807"), ("x", "whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            positive_int(bad)


# --------------------------------------------------------------------------- C2: nonsense lookups and NUL characters


DATE_NONSENSE = [
    "ts__year=99999999999", "ts__year=9999", "ts__year=99999", "ts__year=-1", "ts__year=%00",
    "ts__year=2026&ts__month=99999999999", "ts__year=2026&ts__month=13", "ts__year=2026&ts__month=0",
    "ts__year=2026&ts__month=2&ts__day=31", "ts__year=2026&ts__month=2&ts__day=99999999999",
    "ts__year=9999&ts__month=12", "ts__year=9999&ts__month=12&ts__day=31",
    "ts__month=99999999999", "ts__day=abc", "ts__year=1e3",
]
NUL_QUERIES = ["q=%00", "q=a%00b", "action=%00", "agent=x%00"]


@pytest.fixture
def superuser_client(console_groups) -> Client:
    user = make_user("superuser", "root")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.mark.parametrize("query", DATE_NONSENSE)
@pytest.mark.parametrize("listing", ["event", "receipt"])
@pytest.mark.usefixtures("store_db")
def test_date_hierarchy_nonsense_is_the_invalid_lookup_redirect(listing, query, superuser_client):
    """A date-hierarchy value no calendar holds answers the admin's 'invalid lookup' redirect (?e=1), never a 500."""
    page = f"/admin/ctrlrun/{listing}/"
    response = superuser_client.get(f"{page}?{query}")
    assert response.status_code == 302, f"{query}: {response.status_code}"
    assert response["Location"] == f"{page}?e=1"
    assert superuser_client.get(response["Location"]).status_code == 200


@pytest.mark.parametrize("listing", ["event", "receipt"])
@pytest.mark.usefixtures("store_db")
def test_a_real_date_still_filters(listing, superuser_client):
    """A real year, month and day still show the list (the bounds change nothing that worked)."""
    for query in ("ts__year=2026", "ts__year=2026&ts__month=11", "ts__year=2026&ts__month=11&ts__day=29",
                  "ts__year=9998&ts__month=12&ts__day=31"):
        assert superuser_client.get(f"/admin/ctrlrun/{listing}/?{query}").status_code == 200, query


@pytest.mark.parametrize("query", NUL_QUERIES)
@pytest.mark.parametrize("listing", ["event", "receipt", "approval", "effectrecord", "policydocument"])
@pytest.mark.usefixtures("store_db")
def test_nul_in_a_list_query_is_the_invalid_lookup_redirect(listing, query, superuser_client):
    """A NUL character in a search or filter (PostgreSQL cannot be sent one) answers ?e=1, never a 500."""
    page = f"/admin/ctrlrun/{listing}/"
    response = superuser_client.get(f"{page}?{query}")
    assert response.status_code == 302, f"{query}: {response.status_code}"
    assert response["Location"] == f"{page}?e=1"


NUL_PAGES = [
    ("get", "/admin/ctrlrun/effectrecord/refund%3Atxn%00x/change/"),
    ("get", "/admin/ctrlrun/effectrecord/refund%3Atxn%00x/history/"),
    ("get", "/admin/ctrlrun/effectrecord/refund%3Atxn%00x/delete/"),
    ("post", "/admin/ctrlrun/effectrecord/refund%3Atxn%00x/ask/"),
    ("post", "/admin/ctrlrun/effectrecord/refund%3Atxn%00x/resolve/"),
    ("get", "/admin/ctrlrun/approval/apr_%00/change/"),
    ("get", "/admin/ctrlrun/approval/apr_%00/decide/approve/"),
    ("post", "/admin/ctrlrun/approval/apr_%00/decide/deny/"),
    ("get", "/admin/ctrlrun/receipt/ctr_%00/change/"),
    ("get", "/admin/ctrlrun/event/1%00/change/"),
    ("get", "/admin/ctrlrun/event/99999999999999999999/change/"),
    ("get", "/admin/ctrlrun/policydocument/sha256%3A%00/change/"),
]


@pytest.mark.parametrize("method, path", NUL_PAGES)
@pytest.mark.usefixtures("store_db")
def test_nul_in_an_object_url_is_not_found(method, path, superuser_client):
    """An object URL holding a NUL (or an id no column can hold) answers 404, the admin's not-found redirect, or
    (delete, refused to everyone) 403: never a 500."""
    data = {"outcome": "failed", "reason": "x", "attempt": "1"} if method == "post" else None
    response = getattr(superuser_client, method)(path, data)
    assert response.status_code in ((403,) if path.endswith("/delete/") else (302, 404)), \
        f"{path}: {response.status_code}"
    if response.status_code == 302:
        assert response["Location"] == "/admin/", response["Location"]


# --------------------------------------------------------------------------- C3: 500s are logged on stderr


BOOM_SCRIPT = """\
import os, sys
sys.path.insert(0, {repo!r})
os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
import django
django.setup()
from django.conf import settings
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import path


def boom(request):
    raise RuntimeError("boom: the view failed")


urlpatterns = [path("boom/", boom)]
assert settings.DEBUG is False
with override_settings(ROOT_URLCONF=__name__):
    response = Client(raise_request_exception=False).get("/boom/")
print("status", response.status_code)
"""


def test_a_500_with_debug_off_is_logged_on_stderr(tmp_path):
    """With DEBUG off, a view that raises is logged on the process's stderr, with its traceback."""
    script = tmp_path / "boom.py"
    script.write_text(BOOM_SCRIPT.format(repo=str(REPO)))
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(DEBUG="0", SECRET_KEY="x" * 50, ALLOWED_HOSTS="testserver",
               DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "status 500", done.stderr
    assert "Internal Server Error: /boom/" in done.stderr
    assert "RuntimeError: boom: the view failed" in done.stderr and "Traceback" in done.stderr


def test_request_errors_route_to_a_stderr_handler_whatever_debug():
    """The project's LOGGING sends django.request ERROR records to a StreamHandler on stderr with no DEBUG filter."""
    from project import settings as project_settings

    config = project_settings.LOGGING
    logger = config["loggers"]["django.request"]
    handlers = [config["handlers"][name] for name in logger["handlers"]]
    streams = [h for h in handlers if h["class"] == "logging.StreamHandler" and h.get("stream") == "ext://sys.stderr"]
    assert streams and all(not h.get("filters") for h in streams)
    assert logger["level"] in ("ERROR", "WARNING") and logger.get("propagate") is False


# --------------------------------------------------------------------------- C4: only SQLite or PostgreSQL


@pytest.mark.parametrize("url, named", [
    ("mysql://u:secret@db.internal/app", "mysql://u:***@db.internal/app"),
    ("oracle://u:secret@db.internal/app", "oracle://u:***@db.internal/app"),
    ("nonsense", "nonsense"),
    ("foo://db.internal/app", "foo://db.internal/app"),
])
def test_another_database_is_refused_in_one_line(url, named, tmp_path):
    """'manage.py check' with a DATABASE_URL for another database prints one 'Error: ...' line and exits 1."""
    done = manage_py("check", DATABASE_URL=url, CTRLRUN_POLICY=str(REPO / "tests" / "policies" / "default.yaml"))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "secret" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: ctrlrun's store must be SQLite or PostgreSQL"), line
    assert named in line and "DATABASE_URL" in line
    assert "sqlite:///" in line and "postgresql://" in line  # what to do instead


@pytest.mark.parametrize("scheme", ["sqlite", "postgresql", "postgres"])
def test_sqlite_and_postgresql_urls_still_pass_the_check(scheme, tmp_path):
    """SQLite and PostgreSQL DATABASE_URLs pass 'manage.py check' (the refusal is only for other databases)."""
    url = (f"sqlite:///{tmp_path / 'db.sqlite3'}" if scheme == "sqlite"
           else f"{scheme}://postgres@127.0.0.1:5432/helper_console_unused")
    done = manage_py("check", DATABASE_URL=url, CTRLRUN_POLICY=str(REPO / "tests" / "policies" / "default.yaml"))
    assert done.returncode == 0, done.stderr
    # No error: at most the warning that ctrlrun's migrations are not applied (ctrlrun.W003), or that
    # the database, which does not exist, cannot be read (ctrlrun.W004).
    assert "ERRORS" not in done.stderr and "ctrlrun.E004" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
