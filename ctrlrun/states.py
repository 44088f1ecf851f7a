"""Effect states, decisions, results and event types, and the state table between them.

Pure: standard library only. The models take their choices from these enums, so a value can
never exist in the database that the code does not know.
"""
from __future__ import annotations

import datetime as dt
import enum
from typing import Literal

__all__ = [
    "Decision",
    "EffectState",
    "Result",
    "ApprovalStatus",
    "EventType",
    "ReconcileOutcome",
    "RECONCILE_ANSWERS",
    "TRANSITIONS",
    "RENEWALS",
    "INITIAL_STATE",
    "can_move",
    "APPROVAL_TRANSITIONS",
    "APPROVAL_GIVE_BACKS",
    "APPROVAL_INITIAL",
    "can_move_approval",
    "HOLDING_STATES",
    "lease_lapsed",
    "held_lapsed",
    "askable",
    "approval_lapsed",
    "effective_approval_status",
]


class _Str(str, enum.Enum):
    def __str__(self) -> str:  # render as the value everywhere ("allow", not "Decision.ALLOW")
        return self.value


class Decision(_Str):
    ALLOW = "allow"
    APPROVE = "approve"
    DENY = "deny"


class EffectState(_Str):
    NEW = "new"  # never stored: the state of a key nobody has reserved
    RESERVED = "reserved"
    EXECUTING = "executing"
    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


class ApprovalStatus(_Str):
    PENDING = "pending"
    GRANTED = "granted"
    DENIED = "denied"
    EXPIRED = "expired"
    CONSUMED = "consumed"


class Result(_Str):
    """The ``result`` of a receipt."""

    COMMITTED = "committed"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"
    DENIED = "denied"
    BLOCKED = "blocked"
    OBSERVED = "observed"


class EventType(_Str):
    ACTION_PROPOSED = "ACTION_PROPOSED"
    POLICY_EVALUATED = "POLICY_EVALUATED"
    ACTION_DENIED = "ACTION_DENIED"
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_GRANTED = "APPROVAL_GRANTED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    APPROVAL_INVALIDATED = "APPROVAL_INVALIDATED"
    APPROVAL_CONSUMED = "APPROVAL_CONSUMED"
    APPROVAL_RETURNED = "APPROVAL_RETURNED"
    EFFECT_RESERVED = "EFFECT_RESERVED"
    EFFECT_RESERVATION_REFUSED = "EFFECT_RESERVATION_REFUSED"
    EXECUTION_STARTED = "EXECUTION_STARTED"
    EXECUTION_COMMITTED = "EXECUTION_COMMITTED"
    EXECUTION_FAILED = "EXECUTION_FAILED"
    EXECUTION_AMBIGUOUS = "EXECUTION_AMBIGUOUS"
    EFFECT_RESOLVED = "EFFECT_RESOLVED"
    RECONCILIATION_STARTED = "RECONCILIATION_STARTED"
    RECONCILIATION_RESOLVED = "RECONCILIATION_RESOLVED"
    AUTHORITY_RESOLVED = "AUTHORITY_RESOLVED"
    AUTHORITY_DENIED = "AUTHORITY_DENIED"
    DELEGATION_CREATED = "DELEGATION_CREATED"
    DELEGATION_REVOKED = "DELEGATION_REVOKED"
    DELEGATION_REJECTED = "DELEGATION_REJECTED"
    EXECUTION_SUSPENDED = "EXECUTION_SUSPENDED"
    EXECUTION_RESUMED = "EXECUTION_RESUMED"
    CLOCK_SKEW_DETECTED = "CLOCK_SKEW_DETECTED"
    RETENTION_APPLIED = "RETENTION_APPLIED"
    RECEIPT_IMPORTED = "RECEIPT_IMPORTED"
    EFFECT_IMPORTED = "EFFECT_IMPORTED"
    STORE_IMPORTED = "STORE_IMPORTED"


#: The event types this version writes (CLOCK_SKEW_DETECTED on PostgreSQL: store/clock.py). The rest of
#: the vocabulary (authority, delegation) belongs to capabilities not built yet; the console offers only these.
EMITTED_EVENT_TYPES: frozenset[str] = frozenset({
    EventType.ACTION_PROPOSED, EventType.POLICY_EVALUATED, EventType.ACTION_DENIED, EventType.APPROVAL_REQUESTED,
    EventType.APPROVAL_GRANTED, EventType.APPROVAL_DENIED, EventType.APPROVAL_EXPIRED,
    EventType.APPROVAL_INVALIDATED, EventType.APPROVAL_CONSUMED, EventType.APPROVAL_RETURNED, EventType.EFFECT_RESERVED,
    EventType.EFFECT_RESERVATION_REFUSED, EventType.EXECUTION_STARTED, EventType.EXECUTION_COMMITTED,
    EventType.EXECUTION_FAILED, EventType.EXECUTION_AMBIGUOUS, EventType.EFFECT_RESOLVED,
    EventType.RECONCILIATION_STARTED, EventType.RECONCILIATION_RESOLVED, EventType.CLOCK_SKEW_DETECTED,
    EventType.RETENTION_APPLIED,
    EventType.RECEIPT_IMPORTED, EventType.EFFECT_IMPORTED, EventType.STORE_IMPORTED,  # import (§F10)
    EventType.EXECUTION_SUSPENDED, EventType.EXECUTION_RESUMED,  # ctrlrun.Suspended / Control.resume (spec A5)
})

#: What a reconcile hook may answer. Anything else is recorded as ``invalid_return``.
ReconcileOutcome = Literal["committed", "not_executed", "unknown"]
RECONCILE_ANSWERS: frozenset[str] = frozenset({"committed", "not_executed", "unknown"})

#: States in which a record is held by one attempt (its lease decides whether it is alive).
HOLDING_STATES: frozenset[EffectState] = frozenset({EffectState.RESERVED, EffectState.EXECUTING})

_S = EffectState
#: Every move the store makes on an effect record, and what causes it; nothing else is possible:
#: every state write of the store goes through ``store.effects.move_effect``, which checks this table
#: first, and ``tests/integration/test_transitions.py`` drives each edge.
#: A reservation takes the key and starts the run in one transaction, so the store never leaves
#: a record ``reserved`` (the state exists in the vocabulary, for the reference's readers).
#: Database triggers installed by the migrations (``ctrlrun.guard``) refuse every other edge,
#: whoever connects, and ``committed`` is final: no write of any kind touches it again.
TRANSITIONS: dict[tuple[EffectState, EffectState], str] = {
    (_S.NEW, _S.EXECUTING): "a first reservation won; the function starts",
    (_S.FAILED, _S.EXECUTING): "a retry after a failure won (the only automatic retry; attempt + 1)",
    (_S.EXECUTING, _S.EXECUTING): "the live holder renewed its lease while the function runs",
    (_S.EXECUTING, _S.COMMITTED): "the function returned",
    (_S.EXECUTING, _S.FAILED): "the function raised NotExecuted",
    (_S.EXECUTING, _S.AMBIGUOUS): "the holder saw another exception, or its lease lapsed",
    (_S.AMBIGUOUS, _S.AMBIGUOUS): "the holder saw another exception after its lease lapsed, or a hook could not say "
                                  "(the next deferred attempt waits longer)",
    (_S.AMBIGUOUS, _S.COMMITTED): "a reconcile hook or a human said it happened",
    (_S.AMBIGUOUS, _S.FAILED): "a reconcile hook or a human said it did not happen",
}
#: The edges that hand the key to a new attempt (attempt + 1, a new holder); on every other edge
#: the holder and the attempt stay as they are.
RENEWALS: frozenset[tuple[EffectState, EffectState]] = frozenset({(_S.FAILED, _S.EXECUTING)})
#: The state a record is created in (the edge from ``new``).
INITIAL_STATE = _S.EXECUTING


def can_move(source: EffectState, target: EffectState) -> bool:
    """Whether the state table allows ``source -> target``."""
    return (source, target) in TRANSITIONS


_A = ApprovalStatus
#: Every move of an approval's status, and what causes it; nothing else is possible: the store
#: writes a status only through ``store.approvals._move_approval``, which checks this table first,
#: and the guard's approval trigger (``ctrlrun.guard``) is built from it.
APPROVAL_TRANSITIONS: dict[tuple[ApprovalStatus, ApprovalStatus], str] = {
    (_A.PENDING, _A.GRANTED): "a person granted it",
    (_A.PENDING, _A.DENIED): "a person denied it",
    (_A.PENDING, _A.EXPIRED): "it lapsed unanswered",
    (_A.GRANTED, _A.CONSUMED): "the call it names took its effect key",
    (_A.GRANTED, _A.EXPIRED): "it lapsed unused",
    (_A.CONSUMED, _A.GRANTED): "the attempt that used it provably did nothing: given back (returned + 1)",
}
#: The edges that give an approval back: its signed ``returned`` count goes up by exactly one (every
#: other edge keeps it).
APPROVAL_GIVE_BACKS: frozenset[tuple[ApprovalStatus, ApprovalStatus]] = frozenset({(_A.CONSUMED, _A.GRANTED)})
#: The status a request is created in.
APPROVAL_INITIAL = _A.PENDING


def can_move_approval(source: ApprovalStatus, target: ApprovalStatus) -> bool:
    """Whether the approval table allows ``source -> target``."""
    return (source, target) in APPROVAL_TRANSITIONS


# The rules that read a row's times against the store's clock, written once for the store and the
# console alike. ``now`` is always the store's clock (``store.now()``), never this host's.


def lease_lapsed(lease_expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    """A lease that ran out: its holder stopped renewing it (no lease at all has nothing to lapse)."""
    return lease_expires_at is not None and lease_expires_at <= now


def held_lapsed(state: str, lease_expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    """A record held by an attempt whose lease ran out: its worker died, hung or froze, and a sweep
    moves it to ``ambiguous``."""
    return state in HOLDING_STATES and lease_lapsed(lease_expires_at, now)


def askable(state: str, lease_expires_at: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether a reconcile hook may be asked about a record now: its outcome is unknown, or its
    holder's lease lapsed (it is swept to ``ambiguous`` first)."""
    return state == EffectState.AMBIGUOUS or held_lapsed(state, lease_expires_at, now)


def approval_lapsed(status: str, expires_at: dt.datetime, now: dt.datetime) -> bool:
    """A request still waiting, or granted and unused, past its expiry: it is expired in effect,
    whether or not its row has been moved to ``expired`` yet."""
    return status in (ApprovalStatus.PENDING, ApprovalStatus.GRANTED) and expires_at <= now


def effective_approval_status(status: str, expires_at: dt.datetime, now: dt.datetime) -> str:
    """What a request is now: its status, or ``expired`` when :func:`approval_lapsed`."""
    return ApprovalStatus.EXPIRED.value if approval_lapsed(status, expires_at, now) else str(status)


def blocked_reason(decision: Decision, reason: str, *, presented: bool, ceiling: bool = False,
                   budget: bool = False, budget_problem: str | None = None, scope_problem: str | None = None,
                   approval_problem: str | None = None, reservation_problem: str | None = None) -> str | None:
    """Observe mode's ``blocked_reason``: what enforcement would have refused a call with first, by
    decision point - the policy (its own reason), the attempt ceiling, a budget (one that cannot be
    measured, ``budget_problem``, or one exhausted), the approval gate (no approval presented), the
    scope, the presented approval, the reservation - or None when nothing would have."""
    if decision is Decision.DENY:
        return reason
    if ceiling:
        return "attempt_ceiling"
    if budget_problem is not None:
        return budget_problem
    if budget:
        return "budget_exhausted"
    if decision is Decision.APPROVE and not presented:
        return "approval_required"
    return scope_problem or approval_problem or reservation_problem


def would_have(decision: Decision, reason: str, blocked: str | None) -> dict[str, str | None]:
    """The ``would_have`` of an observe-mode receipt."""
    return {"decision": decision.value, "reason": reason, "blocked_reason": blocked}
