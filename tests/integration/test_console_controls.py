"""Controls (policy v4) and observe mode (v3) in the console, the receipts command and the system
check, on a real database: ``receipts --control ID`` (matched exactly, in the database), the
OBSERVE MODE banner on every console page, the receipt list's filter by control, and the cited
controls' titles on the receipt and approval pages. Receipts come from real protected calls under
v4 policies written to files the settings point at."""
from __future__ import annotations

import html
import json
import re
import os
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.db import connection
from django.urls import reverse

import ctrlrun
from ctrlrun import store
from ctrlrun.admin.console import controls_html
from ctrlrun.models import PolicyDocument, Receipt
from tests.support import (BANNER, CONTROLS_POLICY, LONG_TITLE, OBSERVE_POLICY, REPO, evidence_unguarded, make_user,
                           note, receipts, run_command, send_email, store_environment)

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")

#: Two of the control ids of tests/policies/controls.yaml (CONTROLS_POLICY), as the console must show them.
QUOTED = "it's \"100%\"_done"
UNICODE = "ünï-çødé-§3"


@pytest.fixture
def policy(use_policy):
    return use_policy(CONTROLS_POLICY)


@pytest.fixture
def calls(policy, refund):
    """One receipt of each kind: a refund citing two controls, an email citing three, an audit note
    citing ``pci`` (which ``pci-3.4`` must not match), a refund denied (one control), and a request
    waiting for a person. Returns the approval's id."""
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_1", amount=100)
        send_email(msg_id="m1")
        note(text="looked at the card")
        with pytest.raises(ctrlrun.ActionDenied):
            refund(payment_id="txn_2", amount=2_000_000)
        with pytest.raises(ctrlrun.ApprovalRequired) as caught:
            refund(payment_id="txn_3", amount=60_000)
    return caught.value.request_id


def by_action() -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for doc in receipts():
        found.setdefault(doc["action"], []).append(doc)
    return found


def text(response) -> str:
    return html.unescape(response.content.decode())


def words(response) -> str:
    """The page's text as a person reads it: tags dropped, entities read, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


@pytest.fixture
def auditor(client):
    client.force_login(make_user("auditor"))
    return client


def receipt_page(client, receipt_id: str):
    response = client.get(reverse("admin:ctrlrun_receipt_change", args=[quote(receipt_id)]))
    assert response.status_code == 200
    return response


# --------------------------------------------------------------------------- receipts --control


def test_receipts_carry_the_controls_in_registry_order(calls):
    found = by_action()
    assert found["stripe.refund"][0]["controls"] == ["pci-3.4", "soc2-cc6.1"]
    assert found["email.send"][0]["controls"] == [QUOTED, UNICODE, "long-one"]
    assert found["audit.note"][0]["controls"] == ["pci"]
    assert found["stripe.refund"][0]["policy_version"] == "2026-12-a"


def test_store_lists_receipts_citing_a_control_exactly(calls):
    def actions(control, last=None):
        return [(r.action, r.result) for r in store.list_receipts(last, control=control)]

    assert actions("pci") == [("audit.note", "committed")]  # not pci-3.4
    assert actions("pci-3.4") == [("stripe.refund", "committed"), ("stripe.refund", "denied")]
    assert actions("soc2-cc6.1") == [("stripe.refund", "committed")]  # the allow rule's citation only
    assert actions(QUOTED) == [("email.send", "committed")]
    assert actions(UNICODE) == [("email.send", "committed")]
    assert actions("pci-3.4", last=1) == [("stripe.refund", "denied")]
    for nothing in ("pc", "pci-3", "%", "_", "pci%", "p_i", "it's", "'", '"', "ünï", "PCI", " pci", "controls"):
        assert actions(nothing) == [], nothing
    assert len(store.list_receipts()) == len(receipts())  # without a control: every receipt


def test_receipts_command_by_control(calls):
    lines = run_command("receipts", "--control", "pci-3.4")
    assert len(lines) == 2 and all("stripe.refund" in line for line in lines)
    [line] = run_command("receipts", "--control", "pci-3.4", "--last", "1")
    assert "denied" in line
    [doc] = [json.loads(line) for line in run_command("receipts", "--control", UNICODE, "--json")]
    assert doc["action"] == "email.send" and UNICODE in doc["controls"]
    [doc] = [json.loads(line) for line in run_command("receipts", "--json", "--last", "5", "--control", QUOTED)]
    assert doc["controls"] == [QUOTED, UNICODE, "long-one"]


def test_receipts_command_none_cite(calls):
    assert run_command("receipts", "--control", "phi-access") == ["no receipts cite 'phi-access'"]
    assert run_command("receipts", "--control", "100%") == ["no receipts cite '100%'"]
    assert run_command("receipts", "--control", "it's") == ["no receipts cite 'it's'"]


def test_receipts_command_refuses_bad_control_arguments(calls):
    count = Receipt.objects.count()
    with pytest.raises(CommandError) as caught:
        run_command("receipts", "--control", "")
    assert str(caught.value) == "a control id is needed: --control ID (e.g. --control pci-3.4)"
    with pytest.raises(CommandError) as caught:
        run_command("receipts", "--control", "a\x00b")
    assert str(caught.value) == "a control id never holds a NUL character"
    with pytest.raises(CommandError) as caught:
        run_command("receipts", "--verify-chain", "--control", "pci")
    assert "--control" in str(caught.value) and "\n" not in str(caught.value)
    assert Receipt.objects.count() == count


def test_ctrlrun_script_receipts_by_control(calls, policy, tmp_path):
    """The console script ``ctrlrun receipts --control ID``, as an OS process on the same store."""
    env = {**store_environment(), "CTRLRUN_CONFIG": str(policy)}
    script = Path(sys.executable).parent / "ctrlrun"

    def run(*args):
        return subprocess.run([str(script), "receipts", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)

    found = run("--control", "pci")
    assert found.returncode == 0, found.stderr
    [line] = found.stdout.splitlines()
    assert "audit.note" in line
    none = run("--control", "phi-access")
    assert none.returncode == 0 and none.stdout.splitlines() == ["no receipts cite 'phi-access'"], none.stderr
    [doc] = run("--control", UNICODE, "--json").stdout.splitlines()
    assert json.loads(doc)["action"] == "email.send"


def test_a_document_altered_into_not_json(calls, auditor):
    """A receipt row altered outside ctrlrun into text that is not JSON: SQLite skips it (it cites
    nothing); PostgreSQL cannot read it as JSON, which is one line, never a traceback."""
    table = connection.ops.quote_name(Receipt._meta.db_table)
    seq = Receipt.objects.get(action="audit.note").seq
    with evidence_unguarded(), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET document = %s WHERE seq = %s", ["{not json", seq])
    changelist = reverse("admin:ctrlrun_receipt_changelist")
    if connection.vendor == "sqlite":
        assert run_command("receipts", "--control", "pci") == ["no receipts cite 'pci'"]
        assert len(run_command("receipts", "--control", "pci-3.4")) == 2
        assert len(auditor.get(changelist, {"control": "pci-3.4"}).context["cl"].result_list) == 2
        return
    with pytest.raises(CommandError) as caught:
        run_command("receipts", "--control", "pci")
    message = str(caught.value)
    assert "\n" not in message and "could not be read as JSON" in message and "--verify-chain" in message
    response = auditor.get(changelist, {"control": "pci"}, follow=True)  # said on the page, never a 500
    assert response.status_code == 200
    assert any("could not be read as JSON" in str(m) for m in response.context["messages"])
    assert auditor.get(changelist).status_code == 200  # the list without the filter still reads


# --------------------------------------------------------------------------- manage.py check


def check_errors(settings, tmp_path, text_: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text_)
    settings.CTRLRUN_POLICY = str(path)
    with pytest.raises(SystemCheckError) as caught:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    message = str(caught.value)
    assert "ctrlrun.E002" in message and str(path) in message and "Traceback" not in message
    return message


@pytest.mark.parametrize("body, fragments", [
    ("schema: ctrlrun.policy/v2\nmode: observe\nactions: {}\n", ("line 2", "'mode'", "ctrlrun.policy/v3")),
    ("schema: ctrlrun.policy/v3\ncontrols: {c: {title: T}}\nactions: {}\n", ("line 2", "'controls'", "ctrlrun.policy/v4")),
    ("schema: ctrlrun.policy/v4\nactions:\n  a:\n    decision: allow\n    max_attempts: 2\n",
     ("line 5", "'max_attempts'", "ctrlrun.policy/v5")),
    ("schema: ctrlrun.policy/v4\ncontrols: {pci: {title: T}}\nactions:\n  a:\n    decision: allow\n"
     "    controls: [pci, phi]\n", ("line 6", "'phi'", "pci")),
    ("schema: ctrlrun.policy/v3\nmode: off\nactions: {}\n", ("line 2", "'mode' must be 'enforce' or 'observe'")),
    ("schema: ctrlrun.policy/v4\nactions:\n  a: {decision: allow, mode: observe}\n", ("line 3", "'mode'", "top level")),
    ("schema: ctrlrun.policy/v3\nauthority:\n  grants: []\n  break_glass: {}\nactions: {}\n",
     ("line 4", "'break_glass'", "not enforce it yet")),
    ("schema: ctrlrun.policy/v3\nauthority:\n  grants: [{id: g, subject: {agent: a}, actions: ['x.**.y']}]\n"
     "actions: {}\n", ("line 3", "'**' may only be the last")),
])
def test_check_reports_v3_to_v8_errors_with_file_line_and_key(settings, tmp_path, body, fragments):
    message = check_errors(settings, tmp_path, body)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_check_warns_about_observe_mode(settings, use_policy):
    use_policy(OBSERVE_POLICY)
    err = StringIO()
    call_command("check", stdout=StringIO(), stderr=err)  # a warning: the check passes
    assert "(ctrlrun.W002)" in err.getvalue()
    assert "nothing is enforced" in err.getvalue() and "observe mode" in err.getvalue()
    use_policy(CONTROLS_POLICY)
    err = StringIO()
    call_command("check", stdout=StringIO(), stderr=err)
    assert "ctrlrun.W002" not in err.getvalue()


def test_manage_py_check_as_a_process(tmp_path):
    """As an operator runs it: the observe warning exits 0, a not-built feature exits 1; no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_") and k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="project.settings", DATABASE_URL=f"sqlite:///{tmp_path / 'check.db'}",
               SECRET_KEY="tests-only-secret-key", CTRLRUN_SIGNING_KEY=os.environ["CTRLRUN_SIGNING_KEY"])
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(OBSERVE_POLICY)
    env["CTRLRUN_POLICY"] = str(path)
    result = subprocess.run([sys.executable, str(REPO / "manage.py"), "check"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(ctrlrun.W002)" in result.stderr and "Traceback" not in result.stderr
    path.write_text("schema: ctrlrun.policy/v3\nauthority:\n  grants: []\n  break_glass: {}\nactions: {}\n")
    result = subprocess.run([sys.executable, str(REPO / "manage.py"), "check"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if "(ctrlrun.E002)" in line]
    assert f"{path}, line 4" in line and "'break_glass'" in line


# --------------------------------------------------------------------------- the observe banner


def console_pages(approval_id: str) -> list[str]:
    receipt = Receipt.objects.order_by("seq").first()
    return [
        reverse("admin:index"),
        reverse("admin:ctrlrun_receipt_changelist"),
        reverse("admin:ctrlrun_receipt_change", args=[quote(receipt.receipt_id)]),
        reverse("admin:ctrlrun_approval_changelist"),
        reverse("admin:ctrlrun_approval_change", args=[quote(approval_id)]),
        reverse("admin:ctrlrun_call", args=[quote(receipt.action_id)]),  # quoted, as the console links it
        reverse("admin:ctrlrun_receipt_verify"),
        reverse("admin:ctrlrun_policydocument_changelist"),
        reverse("admin:ctrlrun_effectrecord_changelist"),
        reverse("admin:ctrlrun_event_changelist"),
    ]


@pytest.fixture
def ids_like_quoted_characters(monkeypatch):
    """Every new id's hex starts with ``25``: ``act_25…`` is how the admin quotes ``act%…`` in a URL, so
    a page linked with an unquoted id reads another id. Random ids start so about once in 40 runs."""
    from ctrlrun import canonical
    from ctrlrun.store import approvals, chain

    made = canonical.new_id
    for module in (canonical, approvals, chain):  # actions, approvals, receipts
        monkeypatch.setattr(module, "new_id", lambda prefix: prefix + "25" + made("")[2:])


def test_every_console_page_opens_for_ids_that_read_as_quoted_characters(ids_like_quoted_characters, calls,
                                                                         auditor):
    """The pages of a call, a receipt and an approval whose ids start ``_25`` (the admin's ``%``) all open."""
    first = Receipt.objects.order_by("seq").first()
    assert (calls[:6], first.action_id[:6], first.receipt_id[:6]) == ("apr_25", "act_25", "ctr_25")
    for page in console_pages(calls):
        assert auditor.get(page).status_code == 200, page


def has_banner(response) -> bool:
    return 'id="ctrlrun-observe-banner"' in response.content.decode()


def test_the_observe_banner_on_every_console_page(calls, auditor, use_policy):
    pages = console_pages(calls)
    for page in pages:  # enforce mode: no banner
        response = auditor.get(page)
        assert response.status_code == 200, page
        assert not has_banner(response), page
    path = use_policy(OBSERVE_POLICY)
    for page in pages:
        response = auditor.get(page)
        assert response.status_code == 200, page
        assert has_banner(response), page
        assert BANNER in words(response).replace(" : ", ": ").replace(" .", "."), page
        assert 'role="alert"' in response.content.decode()
    response = auditor.get(pages[0])
    assert "docs/console.md" in text(response)
    # No call decided under it yet, so the store does not hold it: the banner names the file.
    assert f'<code id="ctrlrun-observe-file">{path}</code>' in response.content.decode()
    assert 'id="ctrlrun-observe-policy"' not in response.content.decode()
    with ctrlrun.context(agent="support-agent"):
        note(text="under the observe policy")
    body = auditor.get(pages[0]).content.decode()
    [observe_hash] = PolicyDocument.objects.filter(text=OBSERVE_POLICY).values_list("hash", flat=True)
    policy_url = reverse("admin:ctrlrun_policydocument_change", args=[quote(observe_hash)])
    assert f'href="{policy_url}" id="ctrlrun-observe-policy"' in body  # a link to the policy in force
    # Back to enforce, the file changed in place: the next page reads it again, without a restart.
    time.sleep(0.01)
    path.write_text(CONTROLS_POLICY)
    assert not has_banner(auditor.get(pages[1]))


def test_the_banner_links_to_the_docs_when_their_address_is_set(calls, auditor, use_policy, settings):
    use_policy(OBSERVE_POLICY)
    settings.CTRLRUN_DOCS_URL = "https://docs.example.com/ctrlrun"
    body = auditor.get(reverse("admin:index")).content.decode()
    assert 'href="https://docs.example.com/ctrlrun/console.md#observe-mode"' in body


def test_a_broken_or_missing_policy_breaks_no_page(calls, auditor, use_policy, settings, tmp_path):
    pages = console_pages(calls)
    path = use_policy(OBSERVE_POLICY)
    path.write_text("schema: ctrlrun.policy/v4\nmode: observe\nactions: [\n")
    for page in pages:
        response = auditor.get(page)
        assert response.status_code == 200 and not has_banner(response), page
    settings.CTRLRUN_POLICY = str(tmp_path / "absent.yaml")
    for page in pages:
        response = auditor.get(page)
        assert response.status_code == 200 and not has_banner(response), page


# --------------------------------------------------------------------------- the receipt list's filter


def listed(response) -> list[str]:
    return [r.action for r in response.context["cl"].result_list]


def test_receipt_list_filter_by_control(calls, auditor):
    changelist = reverse("admin:ctrlrun_receipt_changelist")
    response = auditor.get(changelist)
    body = text(response)
    # The sidebar: the current registry's ids with their titles, escaped.
    for expected in ("pci — Card data, in general", "pci-3.4 — Render PAN unreadable", f"{UNICODE} — Ünïcødé control",
                     f"{QUOTED} — Quotes, percent and underscore"):
        assert expected in body, expected
    assert "<script>alert(1)</script>" not in response.content.decode()
    assert "&lt;script&gt;" in response.content.decode()
    assert listed(auditor.get(changelist, {"control": "pci"})) == ["audit.note"]
    assert sorted(listed(auditor.get(changelist, {"control": "pci-3.4"}))) == ["stripe.refund", "stripe.refund"]
    assert listed(auditor.get(changelist, {"control": QUOTED})) == ["email.send"]
    assert listed(auditor.get(changelist, {"control": UNICODE, "result": "committed"})) == ["email.send"]
    assert listed(auditor.get(changelist, {"control": "%"})) == []
    faceted = auditor.get(changelist, {"_facets": "True", "control": "pci-3.4"})  # "Show counts"
    assert faceted.status_code == 200 and "pci — Card data, in general (1)" in words(faceted)
    assert "pci-3.4 — Render PAN unreadable (2)" in words(faceted)


def test_receipt_list_filter_by_an_id_not_in_the_registry(calls, auditor, use_policy):
    """A control dropped from the policy since: the URL still finds the receipts that cite it."""
    use_policy(CONTROLS_POLICY.replace("  pci: {title: \"Card data, in general\", source: \"PCI DSS v4.0\"}\n", "")
               .replace("controls: [pci]", "controls: []"))
    changelist = reverse("admin:ctrlrun_receipt_changelist")
    response = auditor.get(changelist, {"control": "pci"})
    assert response.status_code == 200
    assert listed(response) == ["audit.note"]
    assert "pci (not in the policy’s registry)" in text(response)
    assert "pci — Card data" not in text(response)
    response = auditor.get(changelist, {"control": "never-cited"})
    assert response.status_code == 200 and listed(response) == []


def test_receipt_list_filter_refuses_an_empty_id(calls, auditor):
    response = auditor.get(reverse("admin:ctrlrun_receipt_changelist"), {"control": ""})
    assert response.status_code == 302 and "e=1" in response["Location"]


# --------------------------------------------------------------------------- titles on the pages


def test_receipt_page_shows_the_cited_controls(calls, auditor):
    refund = by_action()["stripe.refund"][0]
    response = receipt_page(auditor, refund["receipt_id"])
    body = response.content.decode()
    shown_text = words(response)
    assert "Render PAN unreadable" in shown_text and "(PCI DSS v4.0 §3.4)" in shown_text
    assert "<b>Logical</b> access & <script>alert(1)</script>" in shown_text  # as text
    assert "<script>alert(1)</script>" not in body and "<b>Logical</b>" not in body  # never as markup
    assert body.index('data-control="pci-3.4"') < body.index('data-control="soc2-cc6.1"')  # registry order
    assert "2026-12-a" in shown_text  # the policy version
    email = by_action()["email.send"][0]
    shown_text = words(receipt_page(auditor, email["receipt_id"]))
    assert QUOTED in shown_text and UNICODE in shown_text and "Ünïcødé control (ISO 27001 A.8)" in shown_text
    assert LONG_TITLE.strip() in shown_text
    note_ = by_action()["audit.note"][0]
    assert "Card data, in general" in text(receipt_page(auditor, note_["receipt_id"]))


def test_receipt_titles_come_from_the_receipts_own_policy(calls, auditor, use_policy):
    """Titles are looked up in the registry of the policy the receipt names, not the one in force now."""
    use_policy(CONTROLS_POLICY.replace("Render PAN unreadable", "Retitled since"))
    refund = by_action()["stripe.refund"][0]
    shown_text = text(receipt_page(auditor, refund["receipt_id"]))
    assert "Render PAN unreadable" in shown_text and "Retitled since" not in shown_text


def test_an_id_not_in_the_registry_says_so(calls):
    document = PolicyDocument.objects.get(pk=by_action()["audit.note"][0]["policy_hash"])
    shown_html = controls_html(["pci", "gone-since", "<i>x</i>"], document)
    assert "Card data, in general" in shown_html
    assert shown_html.count("not in the policy’s registry") == 2
    assert "<i>x</i>" not in shown_html and "&lt;i&gt;x&lt;/i&gt;" in shown_html
    assert "not in the policy’s registry" in controls_html(["pci"], None)
    assert "none cited" in controls_html([], document)


def test_approval_page_shows_the_controls_the_call_would_cite(calls, auditor):
    response = auditor.get(reverse("admin:ctrlrun_approval_change", args=[quote(calls)]))
    assert response.status_code == 200
    body = response.content.decode()
    assert 'data-control="pci-3.4"' in body and "Render PAN unreadable" in text(response)
    assert 'data-control="soc2-cc6.1"' not in body  # the approve band's rule cites nothing of its own


def test_observed_receipt_page(calls, auditor, use_policy, refund):
    """A real observe-mode receipt (the call ran although the policy denies it): its page has the
    observe-mode section with the execution and what enforcement would have done, escaped."""
    from django.contrib import admin as django_admin

    use_policy(OBSERVE_POLICY)
    with ctrlrun.context(agent="support-agent"):
        refund(payment_id="txn_obs", amount=10**9)  # denied by the rules: runs anyway
    row = Receipt.objects.order_by("-seq").first()
    assert json.loads(row.document)["result"] == "observed"
    response = receipt_page(auditor, row.receipt_id)
    assert response.status_code == 200
    page = text(response)
    assert "Observe mode" in page and "committed" in page and "deny" in page
    model_admin = django_admin.site._registry[Receipt]
    would = model_admin.observed_would_have(row)
    assert "deny" in would and "blocked" in would
    assert "committed" in model_admin.observed_execution(row)
    # An enforce-mode receipt has no such section.
    enforced = Receipt.objects.filter(action="audit.note").first()
    titles = [title for title, _options in model_admin.get_fieldsets(None, enforced)]
    assert not any("Observe mode" in str(t) for t in titles if t)


