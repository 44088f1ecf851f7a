"""Unit tests for ctrlrun.states: the §5.2 state table, enums and closed sets.

Pure layer: no database, no Django setup.
"""
from __future__ import annotations

import pytest

from ctrlrun.states import (
    HOLDING_STATES,
    INITIAL_STATE,
    RECONCILE_ANSWERS,
    RENEWALS,
    TRANSITIONS,
    Decision,
    EffectState,
    EventType,
    Result,
    can_move,
)

S = EffectState

#: §5.2 as this store walks it, written out independently of the implementation's table: a
#: reservation takes the key and starts the run in one transaction (new/failed -> executing), and a
#: live holder renews its lease while its function runs (executing -> executing).
CODE_TRANSITIONS = [
    pytest.param(S.NEW, S.EXECUTING, id="new->executing: reservation won, run started"),
    pytest.param(S.FAILED, S.EXECUTING, id="failed->executing: the only automatic retry"),
    pytest.param(S.EXECUTING, S.EXECUTING, id="executing->executing: lease renewed"),
    pytest.param(S.EXECUTING, S.COMMITTED, id="executing->committed: executor returned"),
    pytest.param(S.EXECUTING, S.FAILED, id="executing->failed: NotExecuted"),
    pytest.param(S.EXECUTING, S.AMBIGUOUS, id="executing->ambiguous: exception or lapsed lease"),
    pytest.param(S.AMBIGUOUS, S.AMBIGUOUS, id="ambiguous->ambiguous: idempotent"),
    pytest.param(S.AMBIGUOUS, S.COMMITTED, id="ambiguous->committed: resolve or reconcile"),
    pytest.param(S.AMBIGUOUS, S.FAILED, id="ambiguous->failed: resolve or reconcile"),
]


@pytest.mark.parametrize("source, target", CODE_TRANSITIONS)
def test_code_transition_is_allowed(source: EffectState, target: EffectState) -> None:
    """Every move the store makes is allowed by can_move."""
    assert can_move(source, target)


def test_table_allows_nothing_beyond_what_the_store_does() -> None:
    """The transition table holds exactly the nine moves the store makes, each with a stated cause."""
    expected = {tuple(p.values) for p in CODE_TRANSITIONS}
    assert set(TRANSITIONS) == expected
    assert all(isinstance(cause, str) and cause for cause in TRANSITIONS.values())


def test_only_a_retry_after_failure_renews_the_attempt() -> None:
    """failed -> executing is the one edge that hands the key to a new attempt."""
    assert RENEWALS == {(S.FAILED, S.EXECUTING)} and RENEWALS <= set(TRANSITIONS)
    assert INITIAL_STATE is S.EXECUTING and (S.NEW, INITIAL_STATE) in TRANSITIONS


@pytest.mark.parametrize("target", list(EffectState), ids=str)
def test_committed_is_final(target: EffectState) -> None:
    """A committed record never moves again."""
    assert not can_move(S.COMMITTED, target)


@pytest.mark.parametrize(
    "source, target",
    [
        pytest.param(S.FAILED, S.COMMITTED, id="failed->committed"),
        pytest.param(S.NEW, S.RESERVED, id="new->reserved (the store never leaves a record reserved)"),
        pytest.param(S.NEW, S.COMMITTED, id="new->committed"),
        pytest.param(S.RESERVED, S.COMMITTED, id="reserved->committed"),
        pytest.param(S.RESERVED, S.FAILED, id="reserved->failed"),
        pytest.param(S.EXECUTING, S.RESERVED, id="executing->reserved"),
        pytest.param(S.AMBIGUOUS, S.RESERVED, id="ambiguous->reserved"),
        pytest.param(S.AMBIGUOUS, S.EXECUTING, id="ambiguous->executing (a retry needs failed first)"),
        pytest.param(S.FAILED, S.FAILED, id="failed->failed"),
        pytest.param(S.FAILED, S.AMBIGUOUS, id="failed->ambiguous"),
        pytest.param(S.RESERVED, S.NEW, id="reserved->new"),
    ],
)
def test_forbidden_transition_is_refused(source: EffectState, target: EffectState) -> None:
    """Moves outside the table are refused."""
    assert not can_move(source, target)


@pytest.mark.parametrize("source", list(EffectState), ids=str)
def test_nothing_moves_back_to_new(source: EffectState) -> None:
    """`new` is never a target: it is the state of an unreserved key."""
    assert not can_move(source, S.NEW)


def test_effect_state_values() -> None:
    """The effect states are exactly new, reserved, executing, committed, failed, ambiguous."""
    assert {s.value for s in EffectState} == {
        "new", "reserved", "executing", "committed", "failed", "ambiguous",
    }


def test_holding_states_are_reserved_and_executing() -> None:
    """Only reserved and executing records are held by a lease."""
    assert HOLDING_STATES == {S.RESERVED, S.EXECUTING}


@pytest.mark.parametrize(
    "member",
    [*Decision, *EffectState, *Result, EventType.ACTION_PROPOSED],
    ids=lambda m: f"{type(m).__name__}.{m.name}",
)
def test_enum_renders_as_its_value(member: Decision | EffectState | Result | EventType) -> None:
    """str(), format() and equality all use the bare value ("allow", not "Decision.ALLOW")."""
    assert str(member) == member.value
    assert f"{member}" == member.value
    assert member == member.value


def test_decision_values() -> None:
    """Decisions are allow, approve, deny."""
    assert {d.value for d in Decision} == {"allow", "approve", "deny"}


def test_result_values() -> None:
    """Receipt results are committed, failed, ambiguous, denied, blocked, observed (§9.2)."""
    assert {r.value for r in Result} == {
        "committed", "failed", "ambiguous", "denied", "blocked", "observed",
    }


def test_reconcile_answers_are_exactly_three() -> None:
    """A reconcile hook may answer committed, not_executed or unknown, nothing else."""
    assert RECONCILE_ANSWERS == frozenset({"committed", "not_executed", "unknown"})


#: Every event type named in spec §10.
SPEC_EVENT_TYPES = {
    "ACTION_PROPOSED", "POLICY_EVALUATED", "APPROVAL_REQUESTED", "APPROVAL_GRANTED",
    "APPROVAL_DENIED", "APPROVAL_EXPIRED", "APPROVAL_INVALIDATED", "APPROVAL_CONSUMED",
    "EFFECT_RESERVED", "EFFECT_RESERVATION_REFUSED", "EXECUTION_STARTED", "EXECUTION_COMMITTED",
    "EXECUTION_FAILED", "EXECUTION_AMBIGUOUS", "EFFECT_RESOLVED", "ACTION_DENIED",
    "RECONCILIATION_STARTED", "RECONCILIATION_RESOLVED", "AUTHORITY_RESOLVED", "AUTHORITY_DENIED",
    "DELEGATION_CREATED", "DELEGATION_REVOKED", "DELEGATION_REJECTED", "EXECUTION_SUSPENDED",
    "EXECUTION_RESUMED", "CLOCK_SKEW_DETECTED",
}


def test_event_type_contains_every_spec_type() -> None:
    """EventType holds every event type named in spec §10."""
    assert SPEC_EVENT_TYPES <= {e.value for e in EventType}


def test_event_type_value_is_its_name() -> None:
    """Each event type's value is its own upper-case name."""
    assert all(e.value == e.name for e in EventType)


# --------------------------------------------------------------------------- the time rules, written once

import datetime as _dt  # noqa: E402

from ctrlrun import states as _states  # noqa: E402

_NOW = _dt.datetime(2026, 11, 29, 12, 0, tzinfo=_dt.timezone.utc)
_PAST, _LATER = _NOW - _dt.timedelta(seconds=1), _NOW + _dt.timedelta(seconds=1)


def test_a_lease_lapses_at_its_expiry_and_no_lease_never_does():
    """lease_lapsed: at or past the expiry; None (no lease) is never lapsed."""
    assert _states.lease_lapsed(_NOW, _NOW) and _states.lease_lapsed(_PAST, _NOW)
    assert not _states.lease_lapsed(_LATER, _NOW) and not _states.lease_lapsed(None, _NOW)


def test_only_a_held_record_has_a_lapsed_holder_and_only_then_or_ambiguous_is_askable():
    """held_lapsed needs reserved/executing; askable is ambiguous, or a held record whose lease lapsed."""
    assert _states.held_lapsed("executing", _PAST, _NOW) and not _states.held_lapsed("failed", _PAST, _NOW)
    assert _states.askable("ambiguous", None, _NOW) and _states.askable("executing", _PAST, _NOW)
    assert not _states.askable("executing", _LATER, _NOW) and not _states.askable("committed", _PAST, _NOW)


def test_a_waiting_or_granted_request_past_its_expiry_is_expired_in_effect():
    """effective_approval_status: pending/granted past expiry read as expired; answered ones keep their status."""
    assert _states.effective_approval_status("pending", _PAST, _NOW) == "expired"
    assert _states.effective_approval_status("granted", _NOW, _NOW) == "expired"
    assert _states.effective_approval_status("granted", _LATER, _NOW) == "granted"
    assert _states.effective_approval_status("consumed", _PAST, _NOW) == "consumed"
    assert _states.effective_approval_status("denied", _PAST, _NOW) == "denied"


def test_the_approval_table_is_the_six_moves_the_store_makes() -> None:
    """pending -> granted | denied | expired, granted -> consumed | expired, and the one give-back
    (consumed -> granted); a request starts pending; expired, denied are final."""
    from ctrlrun.states import (APPROVAL_GIVE_BACKS, APPROVAL_INITIAL, APPROVAL_TRANSITIONS, ApprovalStatus as A,
                                can_move_approval)

    assert set(APPROVAL_TRANSITIONS) == {(A.PENDING, A.GRANTED), (A.PENDING, A.DENIED), (A.PENDING, A.EXPIRED),
                                         (A.GRANTED, A.CONSUMED), (A.GRANTED, A.EXPIRED), (A.CONSUMED, A.GRANTED)}
    assert all(isinstance(cause, str) and cause for cause in APPROVAL_TRANSITIONS.values())
    assert APPROVAL_GIVE_BACKS == {(A.CONSUMED, A.GRANTED)} and APPROVAL_INITIAL is A.PENDING
    assert not any(can_move_approval(final, target) for final in (A.DENIED, A.EXPIRED) for target in A)
