"""``policy replay`` (§D7), pure: the recorded receipts' actions decided again by a candidate policy,
on the policy axis only, with nothing written.

A receipt says what was decided (``decision``, ``decision_reason``) and about what (``action``,
``arguments``). Replay re-evaluates the candidate's rules on those arguments and reports every
receipt whose verdict would change. A receipt that is not a readable ``ctrlrun.receipt/v*`` document
is listed as skipped, with why; a receipt whose verdict was not the policy's (an authority denial,
``policy_unapproved``, an effect-key error: the policy never saw those calls) has no policy verdict
to compare, and is left out. No Django.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import Policy

__all__ = ["Change", "Replay", "replay", "POLICY_REASONS", "is_policy_reason"]

#: Receipt schemas replay can read (every one carries action, arguments, decision and its reason).
READABLE_SCHEMAS = tuple(f"ctrlrun.receipt/v{n}" for n in range(1, 8))


def is_policy_reason(reason: Any) -> bool:
    """Whether ``reason`` is one a policy gives (so the recorded verdict is the policy's)."""
    return isinstance(reason, str) and (reason in ("decision", "unknown_action", "no_matching_rule") or (
        reason.startswith("rule[") and reason.endswith("]") and reason[5:-1].isdigit()))


POLICY_REASONS = ("decision", "rule[N]", "unknown_action", "no_matching_rule")


@dataclass(frozen=True)
class Change:
    receipt_id: str
    action: str
    was: tuple[str, str]
    now: tuple[str, str]

    def json(self) -> dict[str, Any]:
        return {"receipt_id": self.receipt_id, "action": self.action,
                "from": {"decision": self.was[0], "reason": self.was[1]},
                "to": {"decision": self.now[0], "reason": self.now[1]}}

    def line(self) -> str:
        return (f"{self.receipt_id}  {self.action}  {self.was[0]} ({self.was[1]})  ->  "
                f"{self.now[0]} ({self.now[1]})")


@dataclass(frozen=True)
class Replay:
    """What replaying ``read`` receipts under ``candidate`` found."""

    candidate: str  # the candidate file as named
    read: int
    changed: tuple[Change, ...] = ()
    skipped: tuple[str, ...] = field(default=())

    def json(self) -> dict[str, Any]:
        return {"changed": [change.json() for change in self.changed], "skipped": list(self.skipped)}

    def lines(self) -> list[str]:
        lines = [change.line() for change in self.changed]
        if not lines:
            lines.append(f"no recorded decision changes under {self.candidate}")
        lines += [f"skipped: {why}" for why in self.skipped]
        return lines

    def text(self) -> str:
        return "\n".join(self.lines())


def _label(doc: Mapping[str, Any], number: int) -> str:
    ident = doc.get("receipt_id")
    return ident if isinstance(ident, str) and ident else f"receipt #{number}"


def replay(candidate: Policy, documents: Iterable[Any], *, name: str | None = None) -> Replay:
    """Decide each receipt's action again under ``candidate``. ``documents`` are receipts' stored
    JSON texts (or parsed dicts), oldest first; nothing is written anywhere."""
    changed: list[Change] = []
    skipped: list[str] = []
    read = 0
    for number, raw in enumerate(documents, start=1):
        read += 1
        doc = raw
        if isinstance(raw, (str, bytes)):
            try:
                doc = json.loads(raw)
            except (ValueError, RecursionError):
                skipped.append(f"receipt #{number}: its document is not JSON")
                continue
        if not isinstance(doc, dict):
            skipped.append(f"receipt #{number}: its document is not a JSON object")
            continue
        label = _label(doc, number)
        schema = doc.get("schema")
        if schema not in READABLE_SCHEMAS:
            skipped.append(f"{label}: unknown receipt schema {str(schema)[:80]!r}")
            continue
        action, arguments = doc.get("action"), doc.get("arguments")
        decision, reason = doc.get("decision"), doc.get("decision_reason")
        if not isinstance(action, str) or not isinstance(arguments, dict) or not isinstance(decision, str):
            skipped.append(f"{label}: no action, arguments or decision to replay")
            continue
        if not is_policy_reason(reason):
            continue  # the policy never gave this verdict (authority, the gate, a template): nothing to compare
        verdict = candidate.evaluate(action, arguments)
        now = (verdict.decision.value, verdict.reason)
        if now != (decision, reason):
            changed.append(Change(label, action, (decision, reason), now))
    return Replay(name or candidate.source, read, tuple(changed), tuple(skipped))
