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

__all__ = [
    "PRECEDENCE",
    "Budget",
    "Grant",
    "Authority",
    "AuthorityResult",
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
    if any(value > 10**9 for value in parts.values()):
        raise ValueError(f"{text!r} is longer than a hundred years")
    window = dt.timedelta(days=parts.get("d", 0), hours=parts.get("h", 0), minutes=parts.get("m", 0),
                          seconds=parts.get("s", 0))
    if window <= dt.timedelta(0):
        raise ValueError(f"{text!r} is empty: a window must be longer than zero")
    if window > MAX_WINDOW:
        raise ValueError(f"{text!r} is longer than a hundred years")
    return window


def window_text(seconds: int) -> str:
    """``86400`` -> ``1 day``; ``5400`` -> ``1 hour 30 minutes``: for people."""
    parts = []
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second")):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count} {unit}{'s' if count != 1 else ''}")
    return " ".join(parts) or "0 seconds"


@dataclass(frozen=True)
class Budget:
    """``count`` calls, or the sum of an int argument, at most ``limit`` within any ``window``."""

    metric: str
    limit: int
    window: dt.timedelta

    @property
    def window_seconds(self) -> int:
        return int(self.window.total_seconds())

    def canonical(self) -> dict[str, Any]:
        return {"metric": self.metric, "limit": self.limit, "window": self.window_seconds}


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
        principal = action.principal
        if self.agent is not None and not matches(self.agent, principal.agent, "", subject=True):
            return False
        if self.user is not None and not matches(self.user, principal.user, "", subject=True):
            return False
        if not any(matches(pattern, action.name, ".") for pattern in self.actions):
            return False
        if self.resources is not None and not any(matches(p, action.resource, ":") for p in self.resources):
            return False
        return self.environments is None or action.environment in self.environments

    def refusal(self, action: Any, *, now: dt.datetime | None, task: str | None) -> str | None:
        """Why this grant, which covers the call, does not pass it (a reason code), or None: it passes."""
        if self.expires_at is not None and (now is None or now > self.expires_at):
            return "authority_expired"
        if self.tasks is not None and not any(matches(pattern, task, ":") for pattern in self.tasks):
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


@dataclass(frozen=True)
class AuthorityResult:
    """How authority judged one call: ``passed`` with the deciding ``grant``, or the refusal ``reason``
    (``grant_id`` the grant it is about, None for ``no_authority``)."""

    passed: bool
    reason: str
    grant_id: str | None = None
    grant: Grant | None = None

    def event_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"reason": self.reason}
        if self.grant_id is not None:
            data["grant_id"] = self.grant_id
        return data


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

    def evaluate(self, action: Any, *, now: dt.datetime | None = None, task: str | None = None) -> AuthorityResult:
        """Judge ``action`` (a canonical ``Action``) at ``now`` for ``task``. Pure."""
        passing: list[str] = []
        refused: dict[str, str] = {}
        for ident, grant in self.grants.items():
            if not grant.covers(action):
                continue
            reason = grant.refusal(action, now=now, task=task)
            if reason is None:
                passing.append(ident)
            else:
                refused[ident] = reason
        if passing:
            chosen = min(passing)
            return AuthorityResult(True, "authority_grant", chosen, self.grants[chosen])
        if not refused:
            return _NO_AUTHORITY
        strongest = min(refused.values(), key=_RANK.__getitem__)
        chosen = min(ident for ident, reason in refused.items() if reason == strongest)
        return AuthorityResult(False, strongest, chosen, self.grants[chosen])

    def canonical(self) -> dict[str, Any]:
        """``canonical_grants``: what the policy hash covers of this section."""
        return {
            "break_glass": {},
            "grants": {ident: grant.canonical() for ident, grant in self.grants.items()},
            "max_delegation_depth": self.max_delegation_depth,
        }

    def charges(self, result: AuthorityResult, arguments: Mapping[str, Any]) -> list[tuple[Budget, int | str]]:
        """The deciding grant's budgets with what this call costs against each (an int, or why not)."""
        if result.grant is None or not result.grant.budgets:
            return []
        return [(budget, budget_cost(budget, arguments)) for budget in result.grant.budgets]


def ordered(grants: Sequence[Grant]) -> dict[str, Grant]:
    """Grants by id, in the order written."""
    return {grant.id: grant for grant in grants}
