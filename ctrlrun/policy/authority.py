"""Authority (policy v3 ``authority:``): which principal may propose which action at all, and how much.

Pure: the standard library only, no Django, no database. The policy says how much autonomy an
action gets; authority says *who* may ask for it. With an ``authority:`` section every call needs
a grant that passes, else it is denied before the policy is asked (``no_authority``); without one
nothing here runs.

A grant *passes* for a call when its subject matches the principal, one of its action patterns the
action, one of its resource patterns the resource (when it lists any), its environments the
environment (when it lists any), it has not expired, its task patterns match the call's task (when
it lists any) and its constraints hold on the canonical arguments. Several passing: the smallest id
(by code point) is the one reported and charged. None passing: the reason reported is the highest
in :data:`PRECEDENCE` among the grants that came closest, with the smallest such id.

Patterns (:func:`matches`): segments split on ``.`` (actions) or ``:`` (resources, tasks); each is a
literal, ``prefix*`` (within that one segment; ``*`` alone is any one segment), or, last, ``**``:
one or more further segments, every earlier segment a literal. No ``?``, no ``[]``; case matters.
Subject patterns are one segment (``support-*``), without ``**``.

Budgets (:class:`Budget`): ``count`` costs one per call; any other metric names an argument whose
value (a non-negative int) is its cost. The ledger that enforces them lives in the store.
"""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..canonical import strict_equal

__all__ = [
    "PRECEDENCE",
    "Budget",
    "Grant",
    "Authority",
    "AuthorityResult",
    "Delegation",
    "CREATED_VIA",
    "DIMENSIONS",
    "contains",
    "containment",
    "matches",
    "validate_pattern",
    "parse_window",
    "window_text",
    "budget_cost",
]

#: Refusal reasons, strongest first: the one reported when no grant passes.
PRECEDENCE = (
    "authority_unreadable",
    "authority_escalation",
    "authority_revoked",
    "authority_expired",
    "authority_task",
    "authority_constraint",
    "authority_hop",
    "no_authority",
)
_RANK = {reason: rank for rank, reason in enumerate(PRECEDENCE)}

#: The largest amount (and budget limit) the ledger holds: a signed 64-bit integer.
MAX_AMOUNT = 2**63 - 1

#: The longest budget window (whole seconds): a hundred years.
MAX_WINDOW = dt.timedelta(days=36525)
_WINDOW = re.compile(r"P(?:(?P<d>[0-9]+)D)?(?:T(?:(?P<h>[0-9]+)H)?(?:(?P<m>[0-9]+)M)?(?:(?P<s>[0-9]+)S)?)?\Z")


# --------------------------------------------------------------------------- patterns


def validate_pattern(pattern: Any, separator: str, *, subject: bool = False) -> str | None:
    """Why ``pattern`` is not a pattern (a sentence), or None when it is one."""
    if not isinstance(pattern, str) or not pattern:
        return "a pattern must be a non-empty string"
    if "?" in pattern or "[" in pattern or "]" in pattern:
        return f"{pattern!r}: '?' and '[...]' are not pattern syntax (only 'prefix*' and a final '**')"
    if subject:  # one segment, whatever it contains
        if "**" in pattern:
            return f"{pattern!r}: a subject pattern is one segment; '**' is not allowed"
        if "*" in pattern[:-1]:
            return f"{pattern!r}: '*' may only end a subject pattern"
        return None
    segments = pattern.split(separator)
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "":
            return f"{pattern!r}: an empty segment (two {separator!r} in a row, or one at an end)"
        if segment == "**":
            if not last:
                return f"{pattern!r}: '**' may only be the last segment"
            if any("*" in earlier for earlier in segments[:-1]):
                return f"{pattern!r}: before a final '**' every segment must be literal"
            if len(segments) == 1:
                return f"{pattern!r}: '**' needs a literal segment before it (e.g. 'stripe.**')"
            continue
        if "*" in segment[:-1]:
            return f"{pattern!r}: '*' may only end a segment ('prefix*')"
    return None


def _segment_matches(pattern: str, value: str) -> bool:
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    return pattern == value


def matches(pattern: str, value: str | None, separator: str, *, subject: bool = False) -> bool:
    """Whether ``value`` matches the (valid) ``pattern``; None never matches."""
    if value is None:
        return False
    if subject:
        return _segment_matches(pattern, value)
    wanted = pattern.split(separator)
    given = value.split(separator)
    if wanted[-1] == "**":
        head = wanted[:-1]
        return len(given) > len(head) and given[: len(head)] == head
    return len(wanted) == len(given) and all(_segment_matches(p, v) for p, v in zip(wanted, given))


def _segment_contains(parent: str, child: str) -> bool:
    """Whether every value the child segment matches, the parent segment matches too."""
    if parent.endswith("*"):
        return child.startswith(parent[:-1])  # a literal or a narrower 'prefix*'
    return not child.endswith("*") and parent == child


def contains(parent: str, child: str, separator: str, *, subject: bool = False) -> bool:
    """Whether the (valid) ``parent`` pattern matches every value the (valid) ``child`` matches.

    Containment is not matching: ``Q.**`` (one or more segments after ``Q``) does not contain ``Q``,
    and ``stripe.*`` does not contain ``stripe.**``."""
    if subject:
        return _segment_contains(parent, child)
    wanted, given = parent.split(separator), child.split(separator)
    if wanted[-1] == "**":
        head = wanted[:-1]
        if given[-1] == "**":  # child: literals C then one or more segments
            return len(given) - 1 >= len(head) and given[: len(head)] == head
        return len(given) > len(head) and given[: len(head)] == head and not any("*" in g for g in given[:len(head)])
    if given[-1] == "**" or len(wanted) != len(given):
        return False
    return all(_segment_contains(p, c) for p, c in zip(wanted, given))


# --------------------------------------------------------------------------- budgets


def parse_window(text: Any) -> dt.timedelta:
    """An ISO-8601 duration of days, hours, minutes and seconds (``P1D``, ``PT12H``, ``P1DT30M``);
    ValueError (a sentence) for anything else: months, years, fractions, zero, over a hundred years."""
    if not isinstance(text, str):
        raise ValueError(f"a window is an ISO-8601 duration such as 'P1D' or 'PT1H', got {text!r}")
    found = _WINDOW.match(text)
    if not found or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(f"{text!r} is not a window ctrlrun reads: write days, hours, minutes and seconds as "
                         f"'P<n>D', 'PT<n>H', 'PT<n>M', 'PT<n>S' or a combination ('P1DT12H'); no months, years "
                         f"or fractions")
    parts = {key: int(value) for key, value in found.groupdict().items() if value is not None}
    # Whole seconds, in integer arithmetic: any part may be large ('PT3155760000S' is the longest
    # window, as a delegation row stores it) as long as the total is at most a hundred years.
    seconds = parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600 + parts.get("m", 0) * 60 + parts.get("s", 0)
    if seconds <= 0:
        raise ValueError(f"{text!r} is empty: a window must be longer than zero")
    if seconds > int(MAX_WINDOW.total_seconds()):
        raise ValueError(f"{text!r} is longer than a hundred years")
    return dt.timedelta(seconds=seconds)


def window_text(seconds: int) -> str:
    """``86400`` -> ``1 day``; ``5400`` -> ``1 hour 30 minutes``: for people."""
    parts = []
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}{'s' if count != 1 else ''}")
    return " ".join(parts) or "0 seconds"


#: ``evaluate(..., evaluate_task=False)``: the task a grant's ``tasks:`` are not checked against.
TASK_UNCHECKED: Any = object()


@dataclass(frozen=True)
class Budget:
    """``count`` calls, or the sum of an int argument, at most ``limit`` within any ``window``.
    ``currency`` (optional, an ISO 4217 code): the amounts are minor units of it (cents), shown as money;
    it changes nothing in what is charged or refused."""

    metric: str
    limit: int
    window: dt.timedelta
    currency: str | None = None

    @property
    def window_seconds(self) -> int:
        return int(self.window.total_seconds())

    def canonical(self) -> dict[str, Any]:
        document: dict[str, Any] = {"metric": self.metric, "limit": self.limit, "window": self.window_seconds}
        if self.currency is not None:  # absent when unset: the hash of a policy without it is unchanged
            document["currency"] = self.currency
        return document


def budget_cost(budget: Budget, arguments: Mapping[str, Any]) -> int | str:
    """What one call costs against ``budget``: an int, or why it cannot be measured (a sentence)."""
    if budget.metric == "count":
        return 1
    if budget.metric not in arguments:
        return (f"budget '{budget.metric}' is measured by the argument {budget.metric!r}, which this call "
                f"does not have")
    value = arguments[budget.metric]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return (f"budget '{budget.metric}' is measured by the argument {budget.metric!r}, which must be a "
                f"non-negative int; this call gives {type(value).__name__} {value!r}")
    if value > MAX_AMOUNT:
        return (f"budget '{budget.metric}' is measured by the argument {budget.metric!r}, which must be at most "
                f"{MAX_AMOUNT} (2**63 - 1, what the ledger holds); this call gives {value}")
    return value


# --------------------------------------------------------------------------- grants


@dataclass(frozen=True)
class Grant:
    """One grant of the ``authority:`` section (see the module docstring for when it passes)."""

    id: str
    agent: str | None
    user: str | None
    actions: tuple[str, ...]
    resources: tuple[str, ...] | None = None
    constraints: tuple[Any, ...] | None = None  # policy.Condition objects
    environments: tuple[str, ...] | None = None
    expires_at: dt.datetime | None = None
    delegable: bool = False
    tasks: tuple[str, ...] | None = None
    budgets: tuple[Budget, ...] | None = None

    def covers(self, action: Any) -> bool:
        """Subject, action, resource and environment: whether this grant is about this call at all."""
        return self.uncovered(action) is None

    def uncovered(self, action: Any) -> str | None:
        """The first dimension (``subject``, ``actions``, ``resources``, ``environments``) in which
        this grant is not about this call, or None when it covers it."""
        principal = action.principal
        if (self.agent is not None and not matches(self.agent, principal.agent, "", subject=True)) or (
                self.user is not None and not matches(self.user, principal.user, "", subject=True)):
            return "subject"
        if not any(matches(pattern, action.name, ".") for pattern in self.actions):
            return "actions"
        if self.resources is not None and not any(matches(p, action.resource, ":") for p in self.resources):
            return "resources"
        if self.environments is not None and action.environment not in self.environments:
            return "environments"
        return None

    def refusal(self, action: Any, *, now: dt.datetime | None, task: str | None) -> str | None:
        """Why this grant, which covers the call, does not pass it (a reason code), or None: it passes."""
        if self.expires_at is not None and (now is None or now > self.expires_at):
            return "authority_expired"
        if self.tasks is not None and task is not TASK_UNCHECKED and not any(
                matches(pattern, task, ":") for pattern in self.tasks):
            return "authority_task"
        if self.constraints is not None and not all(c.holds(action.name, action.arguments) for c in self.constraints):
            return "authority_constraint"
        return None

    def canonical(self) -> dict[str, Any]:
        """The grant as the policy hash covers it."""
        return {
            "actions": list(self.actions),
            "budgets": None if self.budgets is None else [b.canonical() for b in self.budgets],
            "constraints": None if self.constraints is None else {
                c.key: {"argument": c.argument, "op": c.op, "operand": c.operand}
                for c in sorted(self.constraints, key=lambda c: c.key)},
            "delegable": self.delegable,
            "environments": None if self.environments is None else list(self.environments),
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
            "resources": None if self.resources is None else list(self.resources),
            "subject": {"agent": self.agent, "user": self.user},
            "tasks": None if self.tasks is None else list(self.tasks),
        }


# --------------------------------------------------------------------------- containment (delegation)

#: The dimensions a delegated grant must be contained in its parent's, in the order they are checked.
DIMENSIONS = ("subject", "actions", "resources", "constraints", "environments", "expires_at", "tasks", "budgets")

#: How a delegation row may have been made; any other value makes the row unreadable.
CREATED_VIA = ("api", "cli", "break-glass", "hop")


def _patterns_within(parent: tuple[str, ...] | None, child: tuple[str, ...] | None, separator: str) -> bool:
    if parent is None:
        return True  # the parent says nothing here: the child may say anything, or nothing
    if child is None:
        return False  # omission never means unlimited
    return all(any(contains(p, c, separator) for p in parent) for c in child)


def _condition_within(parent: Any, child: Any) -> bool:
    """Whether ``child`` (same argument and operator) is at least as strict as ``parent``."""
    op, mine, theirs = parent.op, child.operand, parent.operand
    if op in ("lt", "lte"):
        return mine <= theirs
    if op in ("gt", "gte"):
        return mine >= theirs
    if op == "in":
        return all(any(strict_equal(item, allowed) for allowed in theirs) for item in mine)
    return strict_equal(mine, theirs)  # eq, neq: the same operand


def containment(parent: Grant, child: Grant) -> str | None:
    """The first dimension (of :data:`DIMENSIONS`, in order) in which ``child`` is not contained in
    ``parent``, or None: every call the child passes, the parent would pass too."""
    # subject: the child names one agent, literally (it is handed to another principal: the agent may
    # differ from the parent's); the parent's user, if it has one, binds the child's
    if child.agent is None or "*" in child.agent:
        return "subject"
    if parent.user is not None and (child.user is None or "*" in child.user
                                    or not matches(parent.user, child.user, "", subject=True)):
        return "subject"
    if not _patterns_within(parent.actions, child.actions, "."):
        return "actions"
    if not _patterns_within(parent.resources, child.resources, ":"):
        return "resources"
    if parent.constraints is not None:
        mine = {c.key: c for c in child.constraints or ()}
        if not all(c.key in mine and _condition_within(c, mine[c.key]) for c in parent.constraints):
            return "constraints"
    if parent.environments is not None and (child.environments is None
                                            or not set(child.environments) <= set(parent.environments)):
        return "environments"
    if parent.expires_at is not None and (child.expires_at is None or child.expires_at > parent.expires_at):
        return "expires_at"
    if not _patterns_within(parent.tasks, child.tasks, ":"):
        return "tasks"
    for budget in parent.budgets or ():
        if not any(b.metric == budget.metric and b.limit <= budget.limit and b.window >= budget.window
                   for b in child.budgets or ()):
            return "budgets"
    return None


@dataclass(frozen=True)
class Delegation:
    """A grant handed down at runtime from a delegable ``parent_id`` (a grant id, or another
    delegation's), ``depth`` steps below its root grant. Its ``grant`` carries its own id
    (``dlg_...``). ``problem`` says why a stored row could not be read (then ``grant`` is None and
    every evaluation is refused ``authority_unreadable``)."""

    id: str
    parent_id: str
    depth: int
    grant: Grant | None
    created_by_agent: str | None
    created_by_user: str | None
    created_via: str
    created_at: dt.datetime | None
    revoked_at: dt.datetime | None = None
    revoked_by: str | None = None
    problem: str | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True)
class AuthorityResult:
    """How authority judged one call: ``passed`` with the deciding ``grant``, or the refusal ``reason``
    (``grant_id`` the grant it is about, None for ``no_authority``). When a delegation decided,
    ``delegation_id`` is its id (and ``grant_id`` too) and ``chain`` the deciding grant, then each
    ancestor up to its root grant; ``details`` the chain's facts (``missing_parent_id`` ...)."""

    passed: bool
    reason: str
    grant_id: str | None = None
    grant: Grant | None = None
    delegation_id: str | None = None
    depth: int | None = None
    chain: tuple[Grant, ...] = ()
    details: Mapping[str, Any] | None = None

    def event_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"reason": self.reason}
        if self.grant_id is not None:
            data["grant_id"] = self.grant_id
        if self.delegation_id is not None:
            data["delegation_id"] = self.delegation_id
            data["depth"] = self.depth
        if self.details:
            data.update(self.details)
        return data


@dataclass(frozen=True)
class Standing:
    """Whether a grant or delegation, as it stands now, may be relied on: ``reason`` None (valid), or
    the chain's strongest refusal with its facts; ``chain`` the grant then its ancestors to the root."""

    reason: str | None
    chain: tuple[Grant, ...]
    depth: int
    details: Mapping[str, Any]


_NO_AUTHORITY = AuthorityResult(False, "no_authority")


@dataclass(frozen=True)
class Authority:
    """The ``authority:`` section: its grants (by id, in the order written) and the delegation depth."""

    grants: Mapping[str, Grant]
    max_delegation_depth: int = 3

    @property
    def has_expiry(self) -> bool:
        """Whether any grant expires: evaluating then needs the store's clock."""
        return any(grant.expires_at is not None for grant in self.grants.values())

    @property
    def delegates(self) -> bool:
        """Whether delegations can exist under this section (a delegable grant, and depth above 0):
        only then are they read from the store."""
        return self.max_delegation_depth > 0 and any(grant.delegable for grant in self.grants.values())

    def evaluate(self, action: Any, *, now: dt.datetime | None = None, task: str | None = None,
                 delegations: Sequence[Delegation] = (), hop: str | None = None,
                 evaluate_task: bool = True) -> AuthorityResult:
        """Judge ``action`` (a canonical ``Action``) at ``now`` for ``task``, over the section's grants
        and the store's ``delegations`` (each chain re-walked). With ``hop`` (a delegation id the
        caller presents, §C7) that delegation is the only candidate: the caller's own grants do not
        widen it, and its chain pays. ``evaluate_task=False`` (a resumed call, spec A5): a grant's
        ``tasks:`` are not checked. Pure."""
        if not evaluate_task:
            task = TASK_UNCHECKED  # type: ignore[assignment]
        for delegation in delegations:  # one row that cannot be read: nothing can be trusted
            if delegation.problem is not None or delegation.grant is None:
                return AuthorityResult(False, "authority_unreadable", delegation.id, None, delegation.id,
                                       delegation.depth, details={"error": delegation.problem or "unreadable"})
        by_id = {d.id: d for d in delegations}
        if hop is not None:
            return self._under_hop(action, hop, by_id, now=now, task=task)
        candidates: list[tuple[Grant, Delegation | None]] = [(g, None) for g in self.grants.values()]
        candidates += [(d.grant, d) for d in delegations]  # type: ignore[misc]
        passing: dict[str, AuthorityResult] = {}
        refused: dict[str, AuthorityResult] = {}
        for grant, delegation in candidates:
            if not grant.covers(action):
                continue
            standing = self.standing(grant.id, now=now, delegations=by_id) if delegation else None
            reason = standing.reason if standing else None
            if reason is None:
                reason = grant.refusal(action, now=now, task=task)
            chain = standing.chain if standing else (grant,)
            result = AuthorityResult(reason is None, reason or "authority_grant", grant.id, grant,
                                     delegation.id if delegation else None,
                                     delegation.depth if delegation else None, chain,
                                     dict(standing.details) if standing and standing.reason else None)
            (passing if reason is None else refused)[grant.id] = result
        if passing:
            return passing[min(passing)]
        if not refused:
            return _NO_AUTHORITY
        strongest = min((r.reason for r in refused.values()), key=_RANK.__getitem__)
        return refused[min(ident for ident, r in refused.items() if r.reason == strongest)]

    def _under_hop(self, action: Any, hop: str, by_id: Mapping[str, Delegation], *, now: dt.datetime | None,
                   task: str | None) -> AuthorityResult:
        delegation = by_id.get(hop)
        if delegation is None or delegation.grant is None:
            return AuthorityResult(False, "authority_hop", details={"hop": hop})
        grant = delegation.grant
        dimension = grant.uncovered(action)
        if dimension is not None:
            return AuthorityResult(False, "authority_hop", grant.id, grant, hop, delegation.depth,
                                   details={"hop": hop, "dimension": dimension})
        standing = self.standing(hop, now=now, delegations=by_id)
        reason = standing.reason or grant.refusal(action, now=now, task=task)
        details = {"hop": hop, **(dict(standing.details) if standing.reason else {})}
        return AuthorityResult(reason is None, reason or "authority_grant", grant.id, grant, hop, delegation.depth,
                               standing.chain, details)

    def delegation_refusal(self, parent_id: str, grant: Grant, agent: str, user: str | None, *,
                           now: dt.datetime | None, delegations: Sequence[Delegation] = ()
                           ) -> tuple[str, str | None, str] | int:
        """Whether ``agent``/``user`` may delegate ``grant`` from ``parent_id`` now: the new
        delegation's depth (an int), or the refusal ``(reason, dimension, why)``, checked in the
        order ``unknown_parent``, ``parent_not_delegable``, ``parent_not_valid``, ``not_the_subject``,
        ``max_depth``, ``containment`` (with its dimension). Pure."""
        by_id = {d.id: d for d in delegations}
        unreadable = next((d for d in delegations if d.problem is not None or d.grant is None), None)
        parent_row = by_id.get(parent_id)
        parent = parent_row.grant if parent_row is not None else self.grants.get(parent_id)
        if parent is None and parent_row is None:
            return ("unknown_parent", None, f"no grant or delegation {parent_id!r} to delegate from")
        if unreadable is not None:
            return ("parent_not_valid", None, f"delegation {unreadable.id} cannot be read ({unreadable.problem}), "
                                              f"so no chain can be trusted")
        assert parent is not None
        if not parent.delegable:
            return ("parent_not_delegable", None, f"{parent_id!r} is not delegable")
        if parent.expires_at is not None and (now is None or now > parent.expires_at):
            return ("parent_not_valid", None, f"{parent_id!r} expired at {parent.expires_at.isoformat()}")
        standing = self.standing(parent_id, now=now, delegations=by_id)
        if standing.reason is not None:
            facts = ", ".join(f"{key} {value}" for key, value in standing.details.items())
            return ("parent_not_valid", None, f"the chain of {parent_id!r} is refused {standing.reason} ({facts})")
        subject_ok = (parent.agent is None or matches(parent.agent, agent, "", subject=True)) and (
            parent.user is None or matches(parent.user, user, "", subject=True))
        if not subject_ok:
            shown = agent + (f"/{user}" if user else "")
            return ("not_the_subject", None, f"{shown!r} is not the subject of {parent_id!r} "
                                             f"(agent {parent.agent!r}, user {parent.user!r})")
        depth = (parent_row.depth if parent_row is not None else 0) + 1
        if depth > self.max_delegation_depth:
            return ("max_depth", None, f"a delegation from {parent_id!r} would be at depth {depth}, over "
                                       f"max_delegation_depth {self.max_delegation_depth}")
        dimension = containment(parent, grant)
        if dimension is not None:
            return ("containment", dimension, f"the grant is not contained in {parent_id!r} on {dimension!r}")
        return depth

    def standing(self, ident: str, *, now: dt.datetime | None,
                 delegations: Mapping[str, Delegation]) -> Standing:
        """Walk ``ident``'s chain up to its root grant: whether it may be relied on now (``reason``
        None), else the strongest refusal found (``authority_escalation`` > ``authority_revoked`` >
        ``authority_expired``) with its facts. Each step must still be contained in its parent, its
        parent delegable, and the depth within ``max_delegation_depth``."""
        found: dict[str, dict[str, Any]] = {}
        chain: list[Grant] = []
        seen: set[str] = set()
        current: str | None = ident
        depth = 0
        child: Grant | None = None
        while current is not None:
            if current in seen:
                found.setdefault("authority_escalation", {"cycle_at": current})
                break
            seen.add(current)
            delegation = delegations.get(current)
            grant = delegation.grant if delegation is not None else self.grants.get(current)
            if grant is None:
                found.setdefault("authority_escalation", {"missing_parent_id": current})
                break
            if child is not None:
                if not grant.delegable:
                    found.setdefault("authority_escalation", {"undelegable_parent_id": current})
                dimension = containment(grant, child)
                if dimension is not None:
                    found.setdefault("authority_escalation", {"dimension": dimension, "escalates_over": current})
            chain.append(grant)
            if delegation is not None and delegation.revoked:
                found.setdefault("authority_revoked", {"revoked_id": current})
            if grant.expires_at is not None and (now is None or now > grant.expires_at) and current != ident:
                found.setdefault("authority_expired", {"expired_parent_id": current})
            if delegation is None:
                break  # the root grant
            depth = max(depth, delegation.depth)
            child, current = grant, delegation.parent_id
        if len(chain) - 1 > self.max_delegation_depth or depth > self.max_delegation_depth:
            found.setdefault("authority_escalation", {"depth_exceeded": max(depth, len(chain) - 1)})
        if not found:
            return Standing(None, tuple(chain), len(chain) - 1, {})
        strongest = min(found, key=_RANK.__getitem__)
        return Standing(strongest, tuple(chain), len(chain) - 1, found[strongest])

    def canonical(self) -> dict[str, Any]:
        """``canonical_grants``: what the policy hash covers of this section."""
        return {
            "break_glass": {},
            "grants": {ident: grant.canonical() for ident, grant in self.grants.items()},
            "max_delegation_depth": self.max_delegation_depth,
        }

    def charges(self, result: AuthorityResult, arguments: Mapping[str, Any]) -> list[tuple[str, Budget, int | str]]:
        """What this call costs the budgets of its deciding chain: one ``(grant id, budget, cost)`` per
        budget per grant, the deciding grant (or delegation) first, then each ancestor up to the
        root; the cost an int, or why it cannot be measured (a sentence)."""
        chain = result.chain or ((result.grant,) if result.grant is not None else ())
        return [(grant.id, budget, budget_cost(budget, arguments)) for grant in chain for budget in grant.budgets or ()]


def ordered(grants: Sequence[Grant]) -> dict[str, Grant]:
    """Grants by id, in the order written."""
    return {grant.id: grant for grant in grants}
