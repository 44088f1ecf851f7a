"""Verified approvers, approver_role and M-of-N (spec §D4, §D5), attacked through the console, the
store, the command line and the database: each approval counts once per person, only from a person
the console authenticated who holds every pinned role now and is not the requester; a forged
approvers column is refused by the row's signature; the count is exact with people answering at once
from several OS processes."""
from __future__ import annotations

import json
import os
import time

import pytest
from django.contrib.auth.models import Group
from django.db import connection

import ctrlrun
from ctrlrun import store
from ctrlrun.errors import ApprovalMismatch, InvalidArgument
from ctrlrun.models import Approval, Event, Receipt
from tests.support import (
    TWO_OF_FINANCE_POLICY, approval_url, ask, make_user, run_command, url, run_together, shown_messages, store_environment, text,
)

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db", "console_groups")

#: Two people of the finance group approve a refund above 1000.
TWO_OF_FINANCE = TWO_OF_FINANCE_POLICY
#: One person of finance.
ONE_OF_FINANCE = TWO_OF_FINANCE.replace("    approvals_required: 2\n", "")
#: Two people, no role.
TWO_PEOPLE = TWO_OF_FINANCE.replace("        controls: [four-eyes]\n", "")
#: The same action with no role and one approval (schema v2's meaning).
PLAIN = TWO_PEOPLE.replace("    approvals_required: 2\n", "")


def finance(*names: str):
    group, _ = Group.objects.get_or_create(name="finance")
    users = []
    for name in names:
        user = make_user("approver", name)
        user.groups.add(group)
        users.append(user)
    return users


def approve_in_console(client, user, approval_id: str) -> list[str]:
    client.force_login(user)
    response = client.post(approval_url(approval_id, "approve"), {"note": ""}, follow=True)
    client.logout()
    return shown_messages(response)


def row(approval_id: str) -> Approval:
    return Approval.objects.get(pk=approval_id)


def run_under(refund, approval_id: str, user: str | None = None):
    with ctrlrun.context(agent="support-agent", user=user), ctrlrun.with_approval(approval_id):
        return refund(payment_id="txn_1", amount=60000)


# --------------------------------------------------------------------------- the whole way


def test_two_people_of_finance_in_the_console_let_the_call_run_and_the_receipt_names_both(use_policy, refund,
                                                                                         client):
    use_policy(TWO_OF_FINANCE)
    ana, ben = finance("ana", "ben")
    approval_id = ask(refund, user="rita")
    pinned = row(approval_id)
    assert (json.loads(pinned.required_roles), pinned.approvals_required) == (
        [{"control": "four-eyes", "role": "finance"}], 2)

    said = approve_in_console(client, ana, approval_id)
    assert any("recorded: 1 of 2 approvals" in m for m in said), said
    assert row(approval_id).status == "pending"
    with pytest.raises(ApprovalMismatch) as early:  # still pending: not usable yet
        run_under(refund, approval_id, "rita")
    assert early.value.reason == "pending"
    client.force_login(ben)
    page = text(client.get(approval_url(approval_id)))
    assert "1 of 2 approvals" in page and "ana" in page and "the role finance (control four-eyes)" in page
    assert "Still needed: 1 more person" in page
    client.logout()

    approve_in_console(client, ben, approval_id)
    granted = store.get_approval(approval_id)
    assert (granted.status, granted.tally, granted.approver) == ("granted", "2 of 2 approvals", "ben")
    assert [a.user for a in granted.approvers] == ["ana", "ben"]
    assert all(a.entitled == ("four-eyes",) and a.issuer == "django" for a in granted.approvers)

    assert run_under(refund, approval_id, "rita")["amount"] == 60000
    [receipt] = [d for d in map(json.loads, Receipt.objects.values_list("document", flat=True))
                 if d["approval_id"] == approval_id and d["result"] == "committed"]
    assert [(a["agent"], a["user"], a["issuer"], a["entitled"]) for a in receipt["approvers"]] == [
        ("console", "ana", "django", ["four-eyes"]), ("console", "ben", "django", ["four-eyes"])]
    assert Event.objects.get(approval_id=approval_id, type="APPROVAL_GRANTED").data["approvers"] == receipt["approvers"]
    assert store.verify().ok


def test_the_list_and_the_approvals_command_say_how_far_a_request_is(use_policy, refund, client):
    use_policy(TWO_OF_FINANCE)
    ana, ben = finance("ana", "ben")
    approval_id = ask(refund, user="rita")
    approve_in_console(client, ana, approval_id)
    [line] = [line for line in run_command("approvals") if line.startswith(approval_id)]
    assert "1 of 2 approvals (roles finance), expires in" in line
    client.force_login(ben)
    listing = text(client.get(url("ctrlrun_approval_changelist")))
    assert '<span class="ctrlrun-tally">1 of 2 approvals</span>' in listing
    client.logout()


# --------------------------------------------------------------------------- attacks


def test_the_same_human_twice_counts_once_however_the_name_is_written(use_policy, refund, client):
    use_policy(TWO_OF_FINANCE)
    ana, ana_capital, ana_cyrillic = finance("ana", "Ana", "\u0430na")  # Cyrillic a: a look-alike
    approval_id = ask(refund, user="rita")
    approve_in_console(client, ana, approval_id)
    for other in (ana_capital, ana_cyrillic):
        said = approve_in_console(client, other, approval_id)
        assert any("You already approved request" in m for m in said), said
        view = store.answer_approval(approval_id, True, by=other.username, person=other)  # the store alone too
        assert (view.status, view.tally) == ("pending", "1 of 2 approvals")
    assert len(json.loads(row(approval_id).approvers)) == 1


def test_the_requester_cannot_approve_their_own_request_through_any_name(use_policy, refund, client):
    use_policy(TWO_OF_FINANCE)
    [bob] = finance("bob")
    [bob_spaced] = finance("BOB")
    approval_id = ask(refund, user="bob")
    for person in (bob, bob_spaced):
        said = approve_in_console(client, person, approval_id)
        assert any("made on behalf of user" in m for m in said), said
        with pytest.raises(InvalidArgument, match="cannot answer it"):
            store.answer_approval(approval_id, True, by="someone-else", person=person)  # by= is not who signed in
    assert json.loads(row(approval_id).approvers) == []


def test_an_approver_without_the_role_is_refused_and_their_answer_not_recorded(use_policy, refund, client):
    use_policy(ONE_OF_FINANCE)
    outsider = make_user("approver", "olaf")  # can decide approvals, not in finance
    approval_id = ask(refund, user="rita")
    said = approve_in_console(client, outsider, approval_id)
    assert any("You do not hold the role 'finance' that control 'four-eyes' requires" in m for m in said), said
    with pytest.raises(InvalidArgument, match="does not hold the role 'finance'"):
        store.answer_approval(approval_id, True, by="olaf", person=outsider)
    assert (row(approval_id).status, row(approval_id).approvers) == ("pending", "[]")
    client.force_login(outsider)
    assert "You do not hold finance" in text(client.get(approval_url(approval_id)))


def test_an_approver_removed_from_the_group_before_answering_is_refused(use_policy, refund, client):
    use_policy(ONE_OF_FINANCE)
    [ana] = finance("ana")
    approval_id = ask(refund, user="rita")
    ana.groups.remove(Group.objects.get(name="finance"))
    said = approve_in_console(client, ana, approval_id)
    assert any("do not hold the role 'finance'" in m for m in said), said
    with pytest.raises(InvalidArgument, match="does not hold the role 'finance'"):
        store.answer_approval(approval_id, True, by="ana", person=ana)
    assert row(approval_id).status == "pending"


def test_a_forged_approvers_column_is_refused_by_the_signature(use_policy, refund, client):
    use_policy(TWO_OF_FINANCE)
    ana, _ben = finance("ana", "ben")
    approval_id = ask(refund, user="rita")
    approve_in_console(client, ana, approval_id)
    forged = json.loads(row(approval_id).approvers)
    forged.append({**forged[0], "user": "ben"})
    with connection.cursor() as cursor:  # the application's role may write the column; it cannot sign it
        cursor.execute("UPDATE ctrlrun_approval SET approvers = %s, status = 'granted', approver = 'ben' "
                       "WHERE approval_id = %s", [json.dumps(forged), approval_id])
    view = store.get_approval(approval_id)
    assert view.signature_ok is False and view.approvers == ()
    with pytest.raises(ApprovalMismatch) as refused:
        run_under(refund, approval_id, "rita")
    assert refused.value.reason == "tampered"
    assert any(b.kind == "approval" for b in store.verify().breaks)


def test_the_pinned_count_cannot_be_lowered_in_the_database(use_policy, refund):
    use_policy(TWO_OF_FINANCE)
    approval_id = ask(refund, user="rita")
    with pytest.raises(Exception, match="keep what the human read"):
        with connection.cursor() as cursor:
            cursor.execute("UPDATE ctrlrun_approval SET approvals_required = 1, required_roles = '[]' "
                           "WHERE approval_id = %s", [approval_id])


# --------------------------------------------------------------------------- what verifies nobody


def test_the_command_line_records_nothing_under_m_of_n_and_says_it_verifies_nobody(use_policy, refund):
    use_policy(TWO_PEOPLE)
    approval_id = ask(refund, user="rita")
    lines = run_command("approve", approval_id, "--by", "cli:ops")
    assert lines[0] == f"recorded {approval_id}: 0 of 2 approvals"
    assert "carries no verified approver" in lines[1]
    assert (row(approval_id).status, row(approval_id).approvers) == ("pending", "[]")


def test_a_command_line_grant_of_a_role_request_is_refused_at_use_and_left_granted(use_policy, refund):
    use_policy(ONE_OF_FINANCE)
    approval_id = ask(refund, user="rita")
    lines = run_command("approve", approval_id, "--by", "cli:ops")
    assert lines[0].startswith(f"granted {approval_id}") and "carries no verified approver" in lines[-1]
    with pytest.raises(ApprovalMismatch) as refused:
        run_under(refund, approval_id, "rita")
    assert refused.value.reason == "approver_unverified"
    assert row(approval_id).status == "granted"  # left granted
    assert Event.objects.filter(approval_id=approval_id, type="APPROVAL_INVALIDATED").get().data["reason"] == (
        "approver_unverified")


def test_a_grant_made_under_a_policy_without_the_role_is_unrecorded_for_one_with_it(use_policy, refund):
    use_policy(PLAIN)
    approval_id = ask(refund, user="rita")
    run_command("approve", approval_id, "--by", "cli:ops")
    use_policy(ONE_OF_FINANCE)  # the same action hash; the control now asks for finance
    with pytest.raises(ApprovalMismatch) as refused:
        run_under(refund, approval_id, "rita")
    assert refused.value.reason == "approval_unrecorded"
    assert row(approval_id).status == "granted"


def test_a_plain_request_granted_on_the_command_line_still_runs(use_policy, refund):
    use_policy(PLAIN)
    approval_id = ask(refund, user="rita")
    run_command("approve", approval_id, "--by", "cli:ops")
    assert run_under(refund, approval_id, "rita")["amount"] == 60000
    [receipt] = [d for d in map(json.loads, Receipt.objects.values_list("document", flat=True))
                 if d["approval_id"] == approval_id]
    assert receipt["result"] == "committed" and receipt["approvers"] == []


#: A plain script on the embedded store (no Django admin): M-of-N has nothing to verify approvers.
SCRIPT = """
import json, ctrlrun
from ctrlrun.errors import ActionDenied

@ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
def refund(payment_id, amount):
    return {"amount": amount}

with ctrlrun.context(agent="support-agent", user="rita"):
    try:
        refund(payment_id="txn_1", amount=60000)
    except ActionDenied as exc:
        print(json.dumps({"reason": exc.reason, "text": str(exc)}))
"""


def test_m_of_n_without_a_verifying_surface_is_denied_at_request_time(tmp_path):
    (tmp_path / "ctrlrun.yaml").write_text(TWO_PEOPLE)
    (tmp_path / "agent.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE")}
    env.update(CTRLRUN_CONFIG=str(tmp_path / "ctrlrun.yaml"), CTRLRUN_STATE=str(tmp_path / "store.db"),
               PYTHONPATH=str(os.getcwd()))
    [out] = run_together(tmp_path, "agent.py", [[]], env)
    said = json.loads(out)
    assert said["reason"] == "approvals_unverifiable" and "verified approvers" in said["text"]
    import sqlite3

    with sqlite3.connect(tmp_path / "store.db") as db:
        assert db.execute("SELECT count(*) FROM ctrlrun_approval").fetchone() == (0,)
        [document] = db.execute("SELECT document FROM ctrlrun_receipt").fetchone()
        types = [t for (t,) in db.execute("SELECT type FROM ctrlrun_event ORDER BY id")]
    receipt = json.loads(document)
    assert (receipt["result"], receipt["decision_reason"]) == ("denied", "approvals_unverifiable")
    assert "ACTION_DENIED" in types and "APPROVAL_REQUESTED" not in types


#: The same agent under a Control told that its approvers are verified elsewhere (an mcp-operator).
SCRIPT_WITH_APPROVER_IDENTITY = """
import json, ctrlrun
from ctrlrun.approvers import ApproverIdentity
from ctrlrun.identity import HeaderIdentityProvider

control = ctrlrun.Control.from_file(
    "ctrlrun.yaml", approver_identity=ApproverIdentity(HeaderIdentityProvider("x-approver"), roles_claim=None))
with ctrlrun.context(agent="support-agent", user="rita"):
    try:
        control.call("stripe.refund", {"payment_id": "txn_1", "amount": 60000}, lambda: "refunded",
                     effect="refund:{payment_id}")
    except ctrlrun.ApprovalRequired as asked:
        print(json.dumps({"asked": asked.request_id}))
"""


def test_m_of_n_is_asked_where_the_control_is_told_who_verifies_approvers(tmp_path):
    (tmp_path / "ctrlrun.yaml").write_text(TWO_PEOPLE)
    (tmp_path / "agent.py").write_text(SCRIPT_WITH_APPROVER_IDENTITY)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_STATE")}
    env.update(CTRLRUN_CONFIG=str(tmp_path / "ctrlrun.yaml"), CTRLRUN_STATE=str(tmp_path / "store.db"),
               PYTHONPATH=str(os.getcwd()))
    [out] = run_together(tmp_path, "agent.py", [[]], env)
    assert json.loads(out)["asked"].startswith("apr_")


def test_an_approver_identity_is_checked_when_given():
    from ctrlrun.approvers import ApproverIdentity
    from ctrlrun.control import Control
    from ctrlrun.identity import StaticIdentityProvider

    with pytest.raises(InvalidArgument, match="not an identity provider"):
        ApproverIdentity(object())
    with pytest.raises(InvalidArgument, match="takes a ctrlrun.approvers.ApproverIdentity"):
        Control(approver_identity="ops")
    agents = StaticIdentityProvider("bot")
    with pytest.raises(InvalidArgument, match="must not use the agents' identity provider"):
        Control(identity=agents, approver_identity=ApproverIdentity(agents))


def test_in_this_project_the_console_verifies_so_m_of_n_asks(use_policy, refund):
    use_policy(TWO_PEOPLE)
    approval_id = ask(refund, user="rita")
    assert row(approval_id).approvals_required == 2


# --------------------------------------------------------------------------- people at the same moment

#: One person answering every request at a set moment, as a Django user of the test database.
PERSON = """
import json, os, sys, time
import django
from django.conf import settings
from ctrlrun.standalone import sqlite_options

database = json.loads(os.environ["TEST_DATABASE"])
if database["ENGINE"].endswith("sqlite3"):
    database["OPTIONS"] = sqlite_options()
settings.configure(INSTALLED_APPS=["django.contrib.auth", "django.contrib.contenttypes", "ctrlrun"],
                   DATABASES={"default": database}, USE_TZ=True, TIME_ZONE="UTC", LOGGING_CONFIG=None,
                   CTRLRUN_SIGNING_KEY=os.environ["CTRLRUN_SIGNING_KEY"])
django.setup()
from django.contrib.auth import get_user_model
from ctrlrun import store
from ctrlrun.errors import CTRLRunError

start_at, who, ids = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
person = get_user_model().objects.get(username=who)
store.now()
while time.time() < start_at:
    time.sleep(0.001)
out = {}
for item in ids:
    try:
        out[item] = store.answer_approval(item, True, by=who, person=person).status
    except CTRLRunError as exc:
        out[item] = "refused: " + str(exc)
print(json.dumps(out))
"""


@pytest.mark.slow
def test_three_people_answering_at_once_give_each_request_exactly_two_approvals(use_policy, refund, tmp_path):
    use_policy(TWO_OF_FINANCE)
    finance("ana", "ben", "cleo")
    requests = [ask(refund, f"txn_{n}", user="rita") for n in range(8)]
    (tmp_path / "person.py").write_text(PERSON)
    env = store_environment()
    settings = connection.settings_dict
    env["TEST_DATABASE"] = json.dumps({key: settings[key] for key in ("ENGINE", "NAME", "USER", "PASSWORD", "HOST",
                                                                     "PORT")})
    start_at = str(time.time() + 5.0)
    outs = [json.loads(out) for out in run_together(tmp_path, "person.py", [
        [start_at, "ana", *requests], [start_at, "ben", *requests[::-1]], [start_at, "cleo", *requests]], env)]
    for request_id in requests:
        said = sorted(out[request_id][:9] for out in outs)
        assert said == ["granted", "pending", "refused: "], (request_id, said)
        loser = next(out[request_id] for out in outs if out[request_id].startswith("refused"))
        assert "already granted" in loser, loser
        final = store.get_approval(request_id)
        assert final.signature_ok and final.status == "granted" and final.tally == "2 of 2 approvals"
        assert len({a.user for a in final.approvers}) == 2
        [granted] = Event.objects.filter(approval_id=request_id, type="APPROVAL_GRANTED")
        assert [a["user"] for a in granted.data["approvers"]] == [a.user for a in final.approvers]
    assert store.verify().ok
