"""ctrlrun.approvers: who counts, and why a granted row may not be used (pure; the store calls these)."""
from __future__ import annotations

from ctrlrun.approvers import VerifiedApprover, distinct, dump_approvers, load_approvers, problem, tally
from ctrlrun.roles import RequiredRole

FINANCE = (RequiredRole("four-eyes", "finance"),)


def person(user: str, entitled: tuple[str, ...] = ("four-eyes",)) -> VerifiedApprover:
    return VerifiedApprover("console", user, "django", entitled, "2026-12-03T10:00:00.000Z")


def check(approvers, *, roles=FINANCE, count=2, required_roles=FINANCE, required_count=2, requester="rita"):
    return problem(pinned_roles=roles, pinned_count=count, approvers=tuple(approvers), required_roles=required_roles,
                   required_count=required_count, requester=requester)


def test_two_distinct_entitled_people_pass():
    assert check([person("ana"), person("ben")]) is None


def test_one_person_under_several_spellings_counts_once():
    spellings = [person("ana"), person("Ana"), person("\u0430na"), person(" ana\u200b")]
    assert len(distinct(tuple(spellings))) == 1
    assert check(spellings)[0] == "approver_unverified"


def test_each_approver_must_hold_every_role():
    both = (*FINANCE, RequiredRole("risk", "risk-officers"))
    found = check([person("ana", ("four-eyes", "risk")), person("ben")], roles=both, required_roles=both)
    assert found[0] == "approver_unentitled" and "'ben'" in found[1] and "risk-officers" in found[1]


def test_the_requester_among_the_approvers_is_refused_whatever_agent_they_used():
    found = check([person("ana"), VerifiedApprover("mcp-operator", "Rita", "idp", ("four-eyes",), "t")])
    assert found[0] == "approver_is_requester"


def test_a_row_pinning_less_than_the_call_requires_is_unrecorded():
    assert check([person("ana")], roles=(), count=1)[0] == "approval_unrecorded"
    assert check([person("ana")], count=1, required_count=2)[0] == "approval_unrecorded"


def test_a_row_that_needs_no_verification_passes_with_nobody():
    assert check([], roles=(), count=1, required_roles=(), required_count=1) is None


def test_no_verified_approver_for_a_role():
    assert check([], count=1, required_count=1)[0] == "approver_unverified"


def test_the_column_round_trips_and_the_tally_reads():
    approvers = (person("ana"), person("ben"))
    assert load_approvers(dump_approvers(approvers)) == approvers
    assert (tally(1, 2), tally(0, 1)) == ("1 of 2 approvals", "0 of 1 approval")
