"""Delegation and revocation (§C3) on the real store, through both drivers: a call under a
delegation, a revoke above it, each creation refusal, the depth limit, rows the database refuses to
change, an unreadable row, and a revoke racing a call from two real OS processes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from django.db import DatabaseError, transaction

import ctrlrun
from ctrlrun import store
from ctrlrun.canonical import Principal
from ctrlrun.control import Control
from ctrlrun.models import Delegation, EffectRecord, Event
from ctrlrun.policy import parse_policy
from tests.support import CHILD, DELEGABLE_CHILD, GRANDCHILD, policy_text, receipts, script_environment

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = policy_text("delegation")
ORCHESTRATOR = Principal(agent="orchestrator")


@pytest.fixture
def control():
    return Control(policy=parse_policy(POLICY))




def test_a_call_under_a_delegation_passes_with_its_id_on_the_receipt(control, drive):
    made = control.delegate("support", CHILD, by=ORCHESTRATOR)
    assert made.id.startswith("dlg_") and len(made.id) == 36 and made.depth == 1
    assert drive(control, "stripe.refund", {"payment_id": "p1", "amount": 500}, "worker") == "done"
    [receipt] = receipts()
    assert (receipt["result"], receipt["authority_grant_id"]) == ("committed", made.id)
    resolved = Event.objects.get(type="AUTHORITY_RESOLVED")
    assert resolved.data == {"reason": "authority_grant", "grant_id": made.id, "delegation_id": made.id, "depth": 1}
    created = Event.objects.get(type="DELEGATION_CREATED")
    assert created.action_id is None and created.data == {
        "delegation_id": made.id, "parent_id": "support", "depth": 1, "created_by_agent": "orchestrator",
        "created_by_user": None, "created_via": "api"}
    row = Delegation.objects.get(pk=made.id)
    assert json.loads(row.grant_json)["constraints"] == {"amount_lte": {"argument": "amount", "op": "lte",
                                                                         "operand": 1000}}
    with pytest.raises(ctrlrun.AuthorityDenied) as refused:  # the delegation is narrower than its root
        drive(control, "stripe.refund", {"payment_id": "p2", "amount": 5000}, "worker")
    assert (refused.value.reason, refused.value.delegation_id) == ("authority_constraint", made.id)
    assert store.verify().ok


def test_revoking_the_parent_refuses_the_child(control, drive):
    parent = control.delegate("support", DELEGABLE_CHILD, by=ORCHESTRATOR)
    child = control.delegate(parent.id, GRANDCHILD, by="worker")
    assert child.depth == 2
    assert drive(control, "stripe.refund", {"payment_id": "p1", "amount": 1}, "helper") == "done"
    done = control.revoke(parent.id, by="ops")
    assert done.changed and done.delegation.revoked_by == "ops"
    again = control.revoke(parent.id, by="someone-else")  # idempotent: nothing changes, no second event
    assert not again.changed and again.delegation.revoked_by == "ops"
    assert Event.objects.filter(type="DELEGATION_REVOKED").count() == 1
    assert Event.objects.get(type="DELEGATION_REVOKED").data == {"delegation_id": parent.id, "revoked_by": "ops"}
    with pytest.raises(ctrlrun.AuthorityDenied) as refused:
        drive(control, "stripe.refund", {"payment_id": "p2", "amount": 1}, "helper")
    assert (refused.value.reason, refused.value.delegation_id) == ("authority_revoked", child.id)
    denied = Event.objects.get(type="AUTHORITY_DENIED")
    assert denied.data == {"reason": "authority_revoked", "grant_id": child.id, "delegation_id": child.id,
                           "depth": 2, "revoked_id": parent.id}
    with pytest.raises(ctrlrun.AuthorityEscalation) as escalation:  # nothing more under a revoked parent
        control.delegate(parent.id, GRANDCHILD, by="worker")
    assert escalation.value.reason == "parent_not_valid"
    with pytest.raises(ctrlrun.InvalidArgument, match="no delegation"):
        control.revoke("dlg_" + "0" * 32)
    assert store.verify().ok


@pytest.mark.parametrize(("parent", "text", "by", "reason", "dimension"), [
    ("nope", CHILD, "orchestrator", "unknown_parent", None),
    ("mailer", CHILD, "mailer", "parent_not_delegable", None),
    ("support", CHILD, "mallory", "not_the_subject", None),
    ("support", CHILD.replace('resources: ["payment:*"]\n', ""), "orchestrator", "containment", "resources"),
    ("support", CHILD.replace("amount_lte: 1000", "amount_lte: 90000"), "orchestrator", "containment", "constraints"),
    ("support", CHILD.replace("2098-12-31", "2099-06-01"), "orchestrator", "containment", "expires_at"),
])
def test_each_creation_refusal_is_recorded(control, parent, text, by, reason, dimension):
    with pytest.raises(ctrlrun.AuthorityEscalation) as refused:
        control.delegate(parent, text, by=by)
    assert (refused.value.reason, refused.value.parent_id, refused.value.dimension) == (reason, parent, dimension)
    assert isinstance(refused.value, ctrlrun.ActionDenied)
    assert "\n" not in str(refused.value)
    rejected = Event.objects.get(type="DELEGATION_REJECTED")
    expected = {"reason": reason, "parent_id": parent, **({"dimension": dimension} if dimension else {})}
    assert rejected.action_id is None and rejected.data == expected
    assert not Delegation.objects.exists()


def test_parent_not_valid_once_the_parent_expired(control, clock):
    clock.advance(days=365 * 73)  # the clock starts 2026-11-29: past 'support''s expiry (2099-01-01)
    with pytest.raises(ctrlrun.AuthorityEscalation) as refused:
        control.delegate("support", CHILD, by=ORCHESTRATOR)
    assert refused.value.reason == "parent_not_valid"


def test_a_child_id_and_a_wrong_grant_are_invalid_arguments(control):
    with pytest.raises(ctrlrun.InvalidArgument, match="has no 'id'"):
        control.delegate("support", "id: mine\n" + CHILD, by=ORCHESTRATOR)
    with pytest.raises(ctrlrun.InvalidArgument):
        control.delegate("support", 42, by=ORCHESTRATOR)
    assert not Event.objects.filter(type__startswith="DELEGATION").exists()


def test_the_depth_limit(control, drive):
    one = control.delegate("support", DELEGABLE_CHILD, by=ORCHESTRATOR)
    two = control.delegate(one.id, DELEGABLE_CHILD.replace("worker", "helper"), by="worker")
    with pytest.raises(ctrlrun.AuthorityEscalation) as refused:
        control.delegate(two.id, CHILD.replace("worker", "third"), by="helper")
    assert (refused.value.reason, two.depth) == ("max_depth", 2)
    # a policy lowered to depth 1 afterwards: the depth-2 delegation escalates, the depth-1 one passes
    lowered = Control(policy=parse_policy(POLICY.replace("max_delegation_depth: 2", "max_delegation_depth: 1")))
    with pytest.raises(ctrlrun.AuthorityDenied) as denied:
        drive(lowered, "stripe.refund", {"payment_id": "p1", "amount": 1}, "helper")
    assert denied.value.reason == "authority_escalation"
    assert drive(lowered, "stripe.refund", {"payment_id": "p2", "amount": 1}, "worker") == "done"


def test_a_narrowed_root_makes_its_delegations_escalate(control, drive):
    control.delegate("support", CHILD, by=ORCHESTRATOR)
    narrowed = Control(policy=parse_policy(POLICY.replace("amount_lte: 50000", "amount_lte: 100")))
    with pytest.raises(ctrlrun.AuthorityDenied) as denied:
        drive(narrowed, "stripe.refund", {"payment_id": "p1", "amount": 1}, "worker")
    assert denied.value.reason == "authority_escalation"
    assert Event.objects.get(type="AUTHORITY_DENIED").data["dimension"] == "constraints"


def test_the_database_refuses_to_unrevoke_edit_or_delete(control):
    made = control.delegate("support", CHILD, by=ORCHESTRATOR)
    with pytest.raises(DatabaseError), transaction.atomic():
        Delegation.objects.filter(pk=made.id).update(grant_json="{}")
    with pytest.raises(DatabaseError), transaction.atomic():
        Delegation.objects.filter(pk=made.id).delete()
    control.revoke(made.id, by="ops")
    with pytest.raises(DatabaseError), transaction.atomic():
        Delegation.objects.filter(pk=made.id).update(revoked_at=None, revoked_by=None)
    with pytest.raises(DatabaseError), transaction.atomic():
        Delegation.objects.filter(pk=made.id).update(revoked_by="someone else")
    assert Delegation.objects.get(pk=made.id).revoked_by == "ops"


def test_an_unreadable_row_refuses_what_rests_on_it(control, drive):
    """A row that cannot be read (or is not signed) refuses every action of its agent, and of every
    delegation beneath it: a call reads only the delegations that can apply to it (a departure from
    the reference, which refuses every action of every agent: docs/reference-differences.md)."""
    from tests.support import evidence_unguarded

    made = control.delegate("support", CHILD, by=ORCHESTRATOR)
    with evidence_unguarded():
        Delegation.objects.filter(pk=made.id).update(created_via="fax")
    with pytest.raises(ctrlrun.AuthorityDenied) as denied:
        drive(control, "email.send", {"to": "a"}, "worker")  # not even about the delegation
    assert (denied.value.reason, denied.value.delegation_id) == ("authority_unreadable", made.id)
    assert drive(control, "email.send", {"to": "a"}, "mailer") == "done"  # another agent reads none of it
    with evidence_unguarded():
        Delegation.objects.filter(pk=made.id).update(created_via="api", grant_json="{not json")
    with pytest.raises(ctrlrun.AuthorityDenied, match="authority_unreadable"):
        drive(control, "email.send", {"to": "a"}, "worker")


RACER = """\
import json, os, sys, time
import ctrlrun
from ctrlrun.control import Control

control = Control.from_file()
role, ident = sys.argv[1], sys.argv[2]
out = []
deadline = time.time() + 90
if role == "revoke":
    while not os.path.exists("calling") and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # the caller is mid-stream
    control.revoke(ident, by="racer")
    out.append(["revoked", time.time()])
else:
    n = refusals = 0
    while refusals < 20 and time.time() < deadline:
        n += 1
        started = time.time()
        try:
            control.call("stripe.refund", {"payment_id": f"p{n}", "amount": 1}, lambda: "done", principal="worker")
            out.append(["ran", started, time.time()])
            if n == 1:
                open("calling", "w").close()
        except ctrlrun.AuthorityDenied as exc:
            refusals += 1
            out.append([exc.reason, started, time.time()])
print(json.dumps(out))
"""


def test_a_revoke_racing_a_call_from_two_processes(control, tmp_path):
    """A call that starts after the revoke has committed is refused; one that ran started before
    the revoke committed: never a run starting after it. Two real OS processes on the one store."""
    made = control.delegate("support", CHILD, by=ORCHESTRATOR)
    env = script_environment(tmp_path, POLICY)
    script = tmp_path / "racer.py"
    script.write_text(textwrap.dedent(RACER))
    processes = [subprocess.Popen([sys.executable, str(script), role, made.id], cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for role in ("call", "revoke")]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=150)
        assert process.returncode == 0, err
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    calls, [[_, revoked_at]] = outputs
    assert {reason for reason, *_ in calls} <= {"ran", "authority_revoked"}
    ran = [c for c in calls if c[0] == "ran"]
    refused = [c for c in calls if c[0] == "authority_revoked"]
    assert ran and len(refused) == 20, calls[:3]
    assert all(started < revoked_at for _, started, _ in ran)  # never a call that started after the revoke
    # a refusal read the revoke, so it ended after the revoke committed (revoked_at is read just after)
    assert all(finished > revoked_at - 0.5 for _, _, finished in refused)
    # and once one call was refused, every later one was too
    first = next(index for index, c in enumerate(calls) if c[0] == "authority_revoked")
    assert all(c[0] == "authority_revoked" for c in calls[first:])
    assert store.verify().ok


def test_a_revoke_between_the_judgement_and_the_reservation_refuses_the_call(control, drive):
    """The revocation commits after authority judged the call but before its key is taken (here, from the
    scope provider, which runs in between): the reservation reads the chain again and refuses."""
    made = control.delegate("support", CHILD, by=ORCHESTRATOR)
    ran = []

    def revoking_scope(action):
        control.revoke(made.id, by="ops-alice")
        return {"resources": ["payment:*"]}

    with pytest.raises(ctrlrun.AuthorityDenied) as refused:
        drive(control, "stripe.refund", {"payment_id": "p1", "amount": 500}, "worker", lambda: ran.append(1),
              scope=revoking_scope)
    assert (refused.value.reason, refused.value.delegation_id) == ("authority_revoked", made.id)
    assert ran == [] and not EffectRecord.objects.filter(pk="refund:p1").exists()
    [receipt] = receipts()
    assert (receipt["result"], receipt["decision_reason"]) == ("denied", "authority_revoked")
    assert store.verify().ok


@pytest.mark.parametrize("via", ["hop", "break-glass", "", None])
def test_a_delegation_cannot_claim_to_be_a_hop_or_a_break_glass(control, via):
    with pytest.raises(ctrlrun.InvalidArgument, match="via"):
        control.delegate("support", CHILD, by=ORCHESTRATOR, via=via)
    assert not Delegation.objects.exists()


def test_a_delegation_with_a_long_budget_window_does_not_make_every_row_unreadable(control):
    """A window of 12000 days is a valid window (under a hundred years); stored as seconds it must read back."""
    made = control.delegate("support", CHILD + "budgets: [{metric: count, limit: 5, window: P12000D}]\n",
                            by=ORCHESTRATOR)
    assert control.call("email.send", {"msg_id": "m1"}, lambda: "sent", principal="mailer") == "sent"
    assert control.call("stripe.refund", {"payment_id": "p1", "amount": 1}, lambda: "ok", principal="worker") == "ok"
    assert store.get_delegation(made.id).problem is None
