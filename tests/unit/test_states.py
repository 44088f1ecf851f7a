"""Unit tests for ctrlrun.states: the §5.2 state table, enums and closed sets.

Pure layer: no database, no Django setup.
"""
from __future__ import annotations

import pytest

from ctrlrun.states import (
    HOLDING_STATES,
    RECONCILE_ANSWERS,
    TRANSITIONS,
    Decision,
    EffectState,
    EventType,
    Result,
    can_move,
)

S = EffectState

#: §5.2, written out independently of the implementation's table.
SPEC_TRANSITIONS = [
    pytest.param(S.NEW, S.RESERVED, id="new->reserved: reservation won"),
    pytest.param(S.FAILED, S.RESERVED, id="failed->reserved: the only automatic retry"),
    pytest.param(S.RESERVED, S.EXECUTING, id="reserved->executing: holder begins"),
    pytest.param(S.EXECUTING, S.COMMITTED, id="executing->committed: executor returned"),
    pytest.param(S.EXECUTING, S.FAILED, id="executing->failed: NotExecuted"),
    pytest.param(S.RESERVED, S.AMBIGUOUS, id="reserved->ambiguous: exception or lapsed lease"),
    pytest.param(S.EXECUTING, S.AMBIGUOUS, id="executing->ambiguous: exception or lapsed lease"),
    pytest.param(S.AMBIGUOUS, S.AMBIGUOUS, id="ambiguous->ambiguous: idempotent"),
    pytest.param(S.AMBIGUOUS, S.COMMITTED, id="ambiguous->committed: resolve or reconcile"),
    pytest.param(S.AMBIGUOUS, S.FAILED, id="ambiguous->failed: resolve or reconcile"),
]


@pytest.mark.parametrize("source, target", SPEC_TRANSITIONS)
def test_spec_transition_is_allowed(source: EffectState, target: EffectState) -> None:
    """Every move in the §5.2 table is allowed by can_move."""
    assert can_move(source, target)


def test_table_allows_nothing_beyond_the_spec() -> None:
    """The transition table holds exactly the ten §5.2 moves, each with a stated cause."""
    expected = {tuple(p.values) for p in SPEC_TRANSITIONS}
    assert set(TRANSITIONS) == expected
    assert all(isinstance(cause, str) and cause for cause in TRANSITIONS.values())


@pytest.mark.parametrize("target", list(EffectState), ids=str)
def test_committed_is_final(target: EffectState) -> None:
    """A committed record never moves again."""
    assert not can_move(S.COMMITTED, target)


@pytest.mark.parametrize(
    "source, target",
    [
        pytest.param(S.FAILED, S.COMMITTED, id="failed->committed"),
        pytest.param(S.NEW, S.EXECUTING, id="new->executing"),
        pytest.param(S.NEW, S.COMMITTED, id="new->committed"),
        pytest.param(S.RESERVED, S.COMMITTED, id="reserved->committed"),
        pytest.param(S.RESERVED, S.FAILED, id="reserved->failed"),
        pytest.param(S.EXECUTING, S.RESERVED, id="executing->reserved"),
        pytest.param(S.AMBIGUOUS, S.RESERVED, id="ambiguous->reserved"),
        pytest.param(S.FAILED, S.FAILED, id="failed->failed"),
        pytest.param(S.FAILED, S.AMBIGUOUS, id="failed->ambiguous"),
        pytest.param(S.RESERVED, S.NEW, id="reserved->new"),
    ],
)
def test_forbidden_transition_is_refused(source: EffectState, target: EffectState) -> None:
    """Moves outside the §5.2 table are refused."""
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
