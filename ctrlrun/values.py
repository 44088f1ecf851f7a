"""The store's value types: what goes into a phase and what comes out of one.

Pure: standard library and ctrlrun's pure layer only, no Django (a unit test proves it), so the
decorator's steps and anything that only reads results can hold these without a database. The
store (``ctrlrun.store``) builds and returns them and re-exports every name.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

from .canonical import Action
from .errors import AmbiguousEffect, CTRLRunError
from .states import Decision, blocked_reason, lease_lapsed, would_have

__all__ = [
    "EventRow",
    "Pending",
    "Charge",
    "Call",
    "Reserved",
    "Refused",
    "OutcomeWrite",
    "HookAnswer",
    "EffectView",
    "EventView",
    "ReceiptView",
    "ApprovalView",
    "PausedRunView",
    "ChainCheckView",
    "PolicyDocumentView",
    "Overview",
]

@dataclass(frozen=True, slots=True)
class EventRow:
    """One event as a phase appends it to the event chain (or keeps it on a running attempt's record).

    ``text`` is ``data`` already encoded as the JSON that joins the chain (a stashed event, or one whose
    text was built with its action's hash), else None and the seal encodes ``data``."""

    ts: dt.datetime
    type: str
    action_id: str | None
    effect_key: str | None
    approval_id: str | None
    data: dict[str, Any]
    text: str | None = None


@dataclass(frozen=True)
class Pending:
    """A running attempt's opening events, kept on its record until they join the event chain."""

    text: str  # the record's ``pending`` column, exactly
    events: tuple[EventRow, ...]


@dataclass(frozen=True)
class Charge:
    """What one call would spend of one budget on one grant (the kernel computes it; the store
    charges it, in the reservation's transaction, and refuses the call when it does not fit).

    ``grant_id`` is the deciding grant or one of its ancestors: one Charge per budget per grant.
    ``metric`` is ``count`` or an argument's name; ``amount`` (>= 0) is what this call costs;
    ``limit`` (>= 0) is the most the un-released charges inside the last ``window_seconds`` (> 0)
    may add up to, this call's included."""

    grant_id: str
    metric: str
    amount: int
    limit: int
    window_seconds: int

    def __post_init__(self) -> None:
        for name in ("amount", "limit", "window_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"Charge.{name} must be an int, got {type(value).__name__} {value!r}")
        if not isinstance(self.grant_id, str) or not self.grant_id:
            raise ValueError(f"Charge.grant_id must be a non-empty string, got {self.grant_id!r}")
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"Charge.metric must be a non-empty string, got {self.metric!r}")
        if self.amount < 0 or self.limit < 0:
            raise ValueError(f"a budget charge's amount and limit are >= 0 (got amount {self.amount}, limit "
                             f"{self.limit}) for budget {self.metric!r} on grant {self.grant_id!r}")
        if self.window_seconds <= 0:
            raise ValueError(f"a budget's window is at least 1 second (got {self.window_seconds}) for budget "
                             f"{self.metric!r} on grant {self.grant_id!r}")

    def evidence(self) -> dict[str, Any]:
        """As a receipt's ``budget_charges`` lists it."""
        return {"grant_id": self.grant_id, "metric": self.metric, "amount": self.amount}


@dataclass(frozen=True)
class Call:
    """What the store needs to know about one protected call.

    ``started_at`` is filled in by the call's first phase (from the store's clock) when None.
    ``pending`` is set on the call a reservation hands back.
    """

    action: Action
    decision: Decision
    reason: str
    policy_hash: str | None
    effect_key: str | None
    started_at: dt.datetime | None = None
    approval_id: str | None = None
    approver: str | None = None
    pending: Pending | None = field(default=None, compare=False, repr=False)
    #: The controls the verdict cites (policy v4), in registry order, and the policy's ``version:``.
    controls: tuple[str, ...] = ()
    policy_version: str | None = None
    #: Observe mode: what enforcing would have done (kept with a running attempt, so a sweeper that
    #: writes its receipt writes an ``observed`` one).
    would_have: Mapping[str, Any] | None = None
    #: Authority (policy v3): the AUTHORITY_RESOLVED / AUTHORITY_DENIED data of this call, or None
    #: when the policy has no ``authority:`` section; and the call's task (not in the action hash).
    authority: Mapping[str, Any] | None = None
    task: str | None = None
    hop: str | None = None
    #: The budget charges the call would make (authority, §C5), filled by the kernel; the store
    #: charges them when it takes the key. A call the store hands back refused carries none.
    budget_charges: tuple[Charge, ...] = ()
    #: The hash of what the call's scope provider answered (``protect(scope=...)``), or None.
    scope_hash: str | None = None
    #: The delegations (``dlg_...``) the call's authority rests on, nearest first: checked again, not
    #: revoked, in the transaction that takes the call's key.
    delegations: tuple[str, ...] = field(default=(), compare=False)
    #: Preconditions (§8.6): the fingerprint of the state when the request was made (the approval's)
    #: and when the call presenting it took its key; and why the state could not be read again.
    precondition_at_request: str | None = None
    precondition_at_recheck: str | None = None
    precondition_problem: str | None = field(default=None, compare=False)
    #: Policy v6 (``ctrlrun.approvers``): the roles and the count an ``approve`` call requires (the
    #: request pins them), and the verified approvers of the approval it used (the receipt's ``approvers``).
    required_roles: tuple[Any, ...] = ()
    approvals_required: int = 1
    approvers: tuple[Any, ...] = ()
    #: Where the call came from, when a surface said (``kernel.context.call_origin``: the MCP gateway's
    #: client, session and upstream): kept in ACTION_PROPOSED's data, so the event chain covers it. Not
    #: in the action or its hash (an approval binds what runs, not who relayed it).
    origin: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def authority_grant_id(self) -> str | None:
        """The grant that let this call through (None without authority, or when it was refused)."""
        data = self.authority
        return data.get("grant_id") if data is not None and data.get("reason") == "authority_grant" else None


@dataclass(frozen=True)
class Observation:
    """What an observe-mode call found when it began (``effects.observe_begin``).

    ``held``: the call took its effect key (a free key) and records its outcome on the row like any
    call; otherwise the row was left as it was. The three reasons are what would have refused the
    call at each of the store's decision points (None: nothing). ``budget_exhausted``: a charge
    would not have fitted its budget (nothing was charged: observe mode writes no ledger rows).
    """

    call: Call
    attempt: int | None
    held: bool
    ceiling: bool = False
    approval_problem: str | None = None
    reservation_problem: str | None = None
    budget_exhausted: bool = False

    def would_have(self, presented: bool, *, budget_problem: str | None = None,
                   scope_problem: str | None = None) -> dict[str, str | None]:
        """The receipt's ``would_have``: the policy's verdict and what would have refused the call first
        (with what the kernel found before the store: an unmeasurable budget, a call out of scope)."""
        call = self.call
        return would_have(call.decision, call.reason, blocked_reason(
            call.decision, call.reason, presented=presented, ceiling=self.ceiling,
            budget=self.budget_exhausted, budget_problem=budget_problem, scope_problem=scope_problem,
            approval_problem=self.approval_problem, reservation_problem=self.reservation_problem))


@dataclass(frozen=True)
class Reserved:
    attempt: int
    lease_expires_at: dt.datetime
    call: Call  # the call as recorded (with the approval it consumed, if any)


@dataclass(frozen=True)
class Refused:
    """A reservation that did not happen. ``final`` means its evidence is already written."""

    error: CTRLRunError
    attempt: int | None
    final: bool
    call: Call


@dataclass(frozen=True)
class OutcomeWrite:
    """Whether the outcome was recorded on the row; if not, ``refusal`` says why."""

    accepted: bool
    refusal: AmbiguousEffect | None = None


@dataclass(frozen=True)
class HookAnswer:
    """What a reconcile hook said, as recorded: ``outcome`` is always one of the three answers.

    ``duration`` is how long the hook took (seconds, a monotonic clock), so the time it was asked
    can be dated on the store's clock.
    """

    outcome: str
    reason: str | None = None  # "raised" | "invalid_return" when the hook could not say
    error: str | None = None
    duration: float = 0.0

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"outcome": self.outcome}
        if self.reason:
            data["reason"] = self.reason
            data["error"] = self.error
        return data


@dataclass(frozen=True)
class EffectView:
    """One effect record as read: by the pages and commands (``store.get_effect``), and by a decision
    (the reservation reads the key's row, locked, as one of these)."""

    effect_key: str
    action: str
    state: str
    action_id: str
    attempt: int
    lease_expires_at: dt.datetime | None
    error: str | None
    resolved_by: str | None
    reconcile_failures: int
    reconcile_after: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    #: False when the row does not carry ctrlrun's signature (written around ctrlrun).
    signature_ok: bool = True
    #: The stored columns the signature covers beyond those above: a running attempt's opening
    #: events (its stash, until the attempt ends) and the signature itself.
    pending: str | None = field(default=None, repr=False)
    mac: str | None = field(default=None, repr=False)

    def lease_lapsed(self, now: dt.datetime) -> bool:
        return lease_lapsed(self.lease_expires_at, now)


@dataclass(frozen=True)
class EventView:
    """One event as it is read: from the store (``id`` the row's; 0 for an opening event still waiting
    on its running attempt's record), or as an observer is told of it once its phase committed (``id``
    None: an append reads no ids back). ``seq`` is its position in the event chain (None while it waits).
    ``ctrlrun.observers.ObservedEvent`` is this class."""

    id: int | None
    ts: dt.datetime
    type: str
    action_id: str | None
    effect_key: str | None
    approval_id: str | None
    data: dict[str, Any]
    seq: int | None = None


@dataclass(frozen=True)
class ReceiptView:
    receipt_id: str
    seq: int | None
    action_id: str
    action: str
    agent: str
    decision: str
    result: str
    effect_key: str | None
    ts: dt.datetime
    document: str

    @functools.cached_property
    def doc(self) -> dict[str, Any]:
        return json.loads(self.document)


@dataclass(frozen=True)
class ApprovalView:
    approval_id: str
    status: str
    action: str
    action_id: str
    action_hash: str
    action_json: str
    agent: str
    user: str | None
    effect_key: str | None
    policy_hash: str | None
    decision_reason: str
    created_at: dt.datetime
    expires_at: dt.datetime
    answered_at: dt.datetime | None
    approver: str | None
    note: str | None
    consumed_at: dt.datetime | None
    consumed_by: str | None
    #: How many times an attempt that provably did nothing gave the approval back (issue 25).
    returned: int = 0
    #: The fingerprint of the state the person approving saw (``protect(preconditions=...)``), or None.
    precondition_fingerprint: str | None = None
    #: What the request pins (policy v6, ``ctrlrun.approvers``): RequiredRole and VerifiedApprover tuples.
    required_roles: tuple[Any, ...] = ()
    approvals_required: int = 1
    approvers: tuple[Any, ...] = ()
    #: False when the row does not carry ctrlrun's signature (written around ctrlrun).
    signature_ok: bool = True

    @property
    def canonical_action(self) -> dict[str, Any]:
        return json.loads(self.action_json)

    @property
    def arguments(self) -> dict[str, Any]:
        return self.canonical_action.get("arguments", {})

    @property
    def approvals_recorded(self) -> int:
        """How many distinct verified people granted it so far."""
        from .approvers import distinct

        return len(distinct(self.approvers))

    @property
    def tally(self) -> str:
        """``"1 of 2 approvals"`` (verified approvers of the count the request pins)."""
        from .approvers import tally

        return tally(self.approvals_recorded, self.approvals_required)


@dataclass(frozen=True)
class PolicyDocumentView:
    """A policy text ctrlrun stored (its signature held when read): what the pages explain decisions by."""

    hash: str
    schema: str
    source: str
    text: str
    environment: str
    first_seen: dt.datetime


@dataclass(frozen=True)
class ChainCheckView:
    """One recorded verification."""

    id: int
    checked_at: dt.datetime
    mode: str
    from_receipt_seq: int
    receipt_seq: int
    receipt_hash: str
    from_event_seq: int
    event_seq: int
    event_hash: str
    ok: bool
    breaks: int
    receipts_checked: int
    events_checked: int
    signatures_checked: int
    summary: str
    duration_seconds: float
    ran_by: str
    #: Whether the row carries ctrlrun's signature (a row written around ctrlrun does not).
    signature_ok: bool


@dataclass(frozen=True)
class Overview:
    """What needs a person now, for the console's front page."""

    pending_approvals: int
    ambiguous_effects: int
    lapsed_leases: int
    receipts: int
    #: Waiting requests whose row does not carry ctrlrun's signature: nobody can answer them.
    tampered_approvals: int = 0


@dataclass(frozen=True)
class PausedRunView:
    """A framework's paused run, kept beside the ctrlrun approval it waits on (``ctrlrun.resumption``)."""

    id: int
    approval_id: str
    framework: str
    state: str
    resume_with: str
    status: str
    answer: str | None
    claimed_by: str | None
    created_at: dt.datetime
    claimed_at: dt.datetime | None
    resumed_at: dt.datetime | None
    error: str | None
    released_by: str | None = None
    released_at: dt.datetime | None = None
    release_reason: str | None = None
    released_claim: str | None = None
    #: Whether what the run resumes with (request, framework, state, resumer) is what ctrlrun stored.
    signature_ok: bool = True

    @property
    def data(self) -> Any:
        """The state parsed as JSON (``ValueError`` if it no longer parses)."""
        return json.loads(self.state)


@dataclass(frozen=True)
class DeliveryView:
    """One mail about an approval request to one person (``ctrlrun.notify``), as the page shows it."""

    id: int
    approval_id: str
    recipient: str
    address: str
    basis: str
    status: str
    attempts: int
    last_error: str | None
    next_try: dt.datetime | None
    created_at: dt.datetime
    sent_at: dt.datetime | None
    link_nonce: str
    #: False when the row does not carry ctrlrun's signature (written around ctrlrun): never sent.
    signature_ok: bool = True


@dataclass(frozen=True)
class LinkUseView:
    """A mail link's one use: who opened it, when."""

    nonce: str
    approval_id: str
    used_by: str
    used_at: dt.datetime
    signature_ok: bool = True
