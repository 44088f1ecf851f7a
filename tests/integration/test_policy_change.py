"""The approved-policy flow (§D7): ``ctrlrun.policy.change``, ``require_approved_policy``, proposals.

Real policy files, the real store; a person's answer is ``store.answer_approval`` (what ``approve``
and the console call)."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control, default_control
from ctrlrun.models import EffectRecord
from ctrlrun.policy import parse_policy
from tests.support import GOVERNED_POLICY, WIDER_GOVERNED_POLICY, evidence_unguarded, receipts

pytestmark = pytest.mark.usefixtures("store_db")

GOVERNED, WIDER = GOVERNED_POLICY, WIDER_GOVERNED_POLICY


def refund(control: Control, payment_id: str, amount: int):
    return control.call("stripe.refund", {"payment_id": payment_id, "amount": amount}, lambda: "refunded",
                        principal="support-agent")


def approve_proposal(control: Control, candidate, person: str = "ana") -> dict:
    """Propose, have a person approve, re-propose with the approval: the proposal's result."""
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        control._propose_policy(candidate, principal=ctrlrun.Principal(agent="ops", user="olivia"))
    store.answer_approval(asked.value.request_id, True, by=person)
    return control._propose_policy(candidate, approval=asked.value.request_id,
                                   principal=ctrlrun.Principal(agent="ops", user="olivia"))


@pytest.fixture
def governed(use_policy, tmp_path):
    path = use_policy(GOVERNED)
    wider = tmp_path / "wider.yaml"
    wider.write_text(WIDER)
    return path, wider


def test_the_reserved_action_loads_at_v6_and_approving_actions_lists_it():
    policy = parse_policy(GOVERNED)
    assert policy.approving_actions() == frozenset({"ctrlrun.policy.change"})
    mixed = parse_policy(GOVERNED.replace("    decision: approve\n", "    rules:\n      - when: {to_eq: x}\n"
                                          "        decision: allow\n      - decision: approve\n", 1))
    assert "ctrlrun.policy.change" not in mixed.approving_actions()
    with pytest.raises(ctrlrun.PolicyError, match="ctrlrun.policy/v6"):
        parse_policy(GOVERNED.replace("/v6", "/v5"))


def test_the_reserved_name_cannot_be_called_or_protected_directly(governed):
    """A direct call or @protect of ctrlrun.policy.change, or a 'policy:' key, is InvalidArgument."""
    control = Control.from_file(governed[0])
    with pytest.raises(ctrlrun.InvalidArgument, match="reserved for ctrlrun's approved-policy flow"):
        control.call("ctrlrun.policy.change", {"from": "a", "to": "b"}, lambda: None, principal="ops")
    with pytest.raises(ctrlrun.InvalidArgument, match="reserved"):
        ctrlrun.protect("ctrlrun.policy.change")
    with pytest.raises(ctrlrun.InvalidArgument, match="'policy:' are reserved"):
        control.call("stripe.refund", {"payment_id": "p"}, lambda: None, principal="ops", effect="policy:{payment_id}")
    assert not EffectRecord.objects.filter(effect_key__startswith="policy:").exists()


def test_an_unapproved_policy_decides_nothing_and_says_to_propose_it(governed):
    """require_approved_policy: the first policy is itself unapproved until it is proposed."""
    control = Control.from_file(governed[0], require_approved_policy=True)
    with pytest.raises(ctrlrun.ActionDenied, match="propose it with") as denied:
        refund(control, "p1", 10)
    assert denied.value.reason == "policy_unapproved"
    last = receipts()[-1]
    assert (last["result"], last["decision"], last["decision_reason"]) == ("denied", "deny", "policy_unapproved")
    assert EffectRecord.objects.filter(effect_key="refund:p1").count() == 0
    # Approving the policy in force (from == to) lets it decide.
    result = approve_proposal(control, governed[0])
    assert result == {"approved": control.policy_hash}
    assert refund(control, "p1", 10) == "refunded"


def test_the_proposal_is_an_ordinary_protected_action(governed):
    control = Control.from_file(governed[0])
    current = control.policy_hash
    result = approve_proposal(control, governed[1])
    wider = Control.from_file(governed[1]).policy_hash
    assert result == {"approved": wider}
    last = receipts()[-1]
    assert last["action"] == "ctrlrun.policy.change"
    assert last["arguments"] == {"from": current, "to": wider}
    assert last["resource"] == "policy" and last["effect_key"] == f"policy:{wider}"
    assert (last["decision"], last["result"], last["principal"]["agent"]) == ("approve", "committed", "ops")
    assert last["approver"] == "ana"
    # The file was not installed: the Control still decides by the old policy.
    assert control.policy_hash == current
    # The candidate's text is stored (signed), for the console's page.
    assert store.policy_document(wider).text == WIDER
    # The same candidate again: the marker is COMMITTED, a duplicate.
    with pytest.raises(ctrlrun.ApprovalRequired):
        control._propose_policy(governed[1], principal="ops")


def test_an_approved_candidate_swapped_in_decides_and_an_unapproved_swap_is_refused(governed, settings,
                                                                                     monkeypatch):
    """The default Control re-reads a changed file: an approved candidate decides at once; a file
    swapped on disk that nobody approved is refused, however small the edit."""
    monkeypatch.setattr(ctrlrun.control, "_RECHECK_SECONDS", 0.0)  # every call looks at the file
    settings.CTRLRUN_REQUIRE_APPROVED_POLICY = True
    path, wider = governed
    control = default_control()
    approve_proposal(control, path)
    approve_proposal(control, wider)
    with pytest.raises(ctrlrun.ActionDenied):
        refund(control, "p1", 3000)  # the old policy is in force
    path.write_text(WIDER)  # the approved candidate installed
    assert refund(control, "p2", 3000) == "refunded"
    path.write_text(WIDER.replace("5000", "9000"))  # swapped in without a proposal
    with pytest.raises(ctrlrun.ActionDenied) as denied:
        refund(control, "p3", 10)
    assert denied.value.reason == "policy_unapproved"


def test_a_policy_that_cannot_approve_changes_refuses_everything_the_change_included(use_policy, tmp_path):
    """Condition (a): without an all-approve ctrlrun.policy.change entry, every action is unapproved."""
    path = use_policy(GOVERNED.replace("    decision: approve\n", "    decision: allow\n", 1))
    control = Control.from_file(path, require_approved_policy=True)
    with pytest.raises(ctrlrun.ActionDenied, match="cannot be approved") as denied:
        refund(control, "p1", 10)
    assert denied.value.reason == "policy_unapproved"
    with pytest.raises(ctrlrun.ActionDenied) as denied:
        control._propose_policy(path, principal="ops")
    assert denied.value.reason == "policy_unapproved"


def test_a_forged_marker_is_not_an_approval(governed):
    """A COMMITTED 'policy:<hash>' row written around ctrlrun (guard lifted, as an attacker with DDL
    rights could) carries no signature: it approves nothing."""
    from django.utils import timezone

    control = Control.from_file(governed[0], require_approved_policy=True)
    with evidence_unguarded():
        EffectRecord.objects.create(effect_key=f"policy:{control.policy_hash}", action="ctrlrun.policy.change",
                                    state="committed", action_id="act_forged", attempt=1, created_at=timezone.now(),
                                    updated_at=timezone.now())
    with pytest.raises(ctrlrun.ActionDenied) as denied:
        refund(control, "p1", 10)
    assert denied.value.reason == "policy_unapproved"


def test_observe_mode_skips_the_gate_and_refuses_proposals(use_policy):
    path = use_policy(GOVERNED.replace("schema: ctrlrun.policy/v6\n", "schema: ctrlrun.policy/v6\nmode: observe\n"))
    control = Control.from_file(path, require_approved_policy=True)
    assert refund(control, "p1", 10) == "refunded"
    with pytest.raises(ctrlrun.InvalidArgument, match="observe mode"):
        control._propose_policy(path, principal="ops")


def test_a_proposal_needs_a_proposer(governed):
    control = Control.from_file(governed[0])
    with pytest.raises(ctrlrun.InvalidArgument, match="has a proposer"):
        control._propose_policy(governed[1])


def test_the_setting_must_be_a_bool(governed, settings):
    settings.CTRLRUN_REQUIRE_APPROVED_POLICY = "yes"
    with pytest.raises(ctrlrun.InvalidArgument, match="True or False"):
        refund(Control.from_file(governed[0]), "p1", 10)
    with pytest.raises(ctrlrun.InvalidArgument, match="True or False"):
        Control.from_file(governed[0], require_approved_policy="yes")


def test_both_drivers_meet_the_gate(governed, drive):
    """Sync and async calls are refused alike, and run alike once the policy is approved."""
    control = Control.from_file(governed[0], require_approved_policy=True)
    with pytest.raises(ctrlrun.ActionDenied) as denied:
        drive(control, "stripe.refund", {"payment_id": "p1", "amount": 10}, "support-agent")
    assert denied.value.reason == "policy_unapproved"
    approve_proposal(control, governed[0])
    assert drive(control, "stripe.refund", {"payment_id": "p2", "amount": 10}, "support-agent") == "done"


def test_the_application_role_cannot_plant_a_marker_or_a_candidate(governed):
    """The application's role may INSERT: a COMMITTED marker is refused by the guard (a record starts
    executing), and a candidate text planted under the candidate's hash before its proposal makes the
    proposal refuse (EvidenceTampered), so no page shows that text as the candidate."""
    from django.db import DatabaseError, transaction
    from django.utils import timezone

    from ctrlrun.models import PolicyDocument

    control = Control.from_file(governed[0], require_approved_policy=True)
    with pytest.raises(DatabaseError, match="starts executing"), transaction.atomic():  # (each dialect's error)
        EffectRecord.objects.create(effect_key=f"policy:{control.policy_hash}", action="ctrlrun.policy.change",
                                    state="committed", action_id="act_forged", attempt=1, created_at=timezone.now(),
                                    updated_at=timezone.now())
    wider = Control.from_file(governed[1]).policy_hash
    PolicyDocument.objects.create(hash=wider, schema="ctrlrun.policy/v6", source="candidate x",
                                  text=GOVERNED.replace("deny", "allow"), environment="production",
                                  first_seen=timezone.now(), mac="0" * 64)
    with pytest.raises(ctrlrun.EvidenceTampered):
        control._propose_policy(governed[1], principal="ops")
    assert store.policy_document(wider) is None


def test_manage_py_check_says_when_no_call_can_run(use_policy, settings):
    """W006: approved policies are required and the policy cannot be approved; E006: not a bool."""
    from ctrlrun.checks import check_approved_policy

    use_policy(GOVERNED.replace("    decision: approve\n", "    decision: allow\n", 1))
    assert check_approved_policy() == []
    settings.CTRLRUN_REQUIRE_APPROVED_POLICY = True
    assert [m.id for m in check_approved_policy()] == ["ctrlrun.W006"]
    use_policy(GOVERNED)
    assert check_approved_policy() == []
    settings.CTRLRUN_REQUIRE_APPROVED_POLICY = 1
    assert [m.id for m in check_approved_policy()] == ["ctrlrun.E006"]
