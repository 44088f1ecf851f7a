"""Approval providers: how a person is asked to approve one exact action, and how the answer is found.

The protocol is two calls, both store phases of the call that asks:

- ``request(call, ttl) -> ApprovalView``: record a pending request bound to the action's hash
  (the ``APPROVAL_REQUESTED`` event) and make it known to whoever answers;
- ``check(request_id) -> ApprovalView | None``: the request as it stands now.

and an optional ``poll_interval`` (seconds between checks while a ``wait=True`` call waits).
The answer itself is always recorded by the store (``store.answer_approval``): a provider may
route the question anywhere - the console, a chat message, a webhook - but the grant that lets a
call run is the row in the database, bound to the hash, single-use, expiring. A provider can
never authorise an action by itself.

``LocalApprovalProvider`` is the default: requests wait in the database for a person in the
console (or ``ctrlrun approve``). ``ScriptedApprovalProvider`` answers each request at once
from a script, for tests.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any, Literal, Protocol, runtime_checkable

from .errors import InvalidArgument

__all__ = ["ApprovalProvider", "LocalApprovalProvider", "ScriptedApprovalProvider", "ScriptedOutcome"]

#: What a scripted approver does with the next request: grant it, deny it, or leave it unanswered.
ScriptedOutcome = Literal["grant", "deny", "ignore"]
_OUTCOMES = ("grant", "deny", "ignore")


@runtime_checkable
class ApprovalProvider(Protocol):
    def request(self, call: Any, ttl: dt.timedelta) -> Any: ...

    def check(self, request_id: str) -> Any: ...


class LocalApprovalProvider:
    """Requests wait in ctrlrun's database until a person answers them in the console or a command."""

    def __init__(self, *, poll_interval: float | None = None) -> None:
        if poll_interval is not None and (isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float))
                                          or poll_interval <= 0):
            raise InvalidArgument(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
        self.poll_interval = poll_interval

    def request(self, call: Any, ttl: dt.timedelta) -> Any:
        from . import store

        return store.request_approval(call, ttl)

    def check(self, request_id: str) -> Any:
        from . import store

        return store.get_approval(request_id)


class ScriptedApprovalProvider(LocalApprovalProvider):
    """Answers each request as it is made, from ``script`` (``"grant"``, ``"deny"`` or ``"ignore"``),
    as ``approver``; a request after the script ran out is left unanswered.

    The answers go through the store like a person's (events, signatures, the hash binding), so a
    test exercises the same path as production. ``answered`` lists (request id, outcome) so far.
    """

    def __init__(self, script: Iterable[ScriptedOutcome] = (), *, approver: str = "cli:scripted",
                 note: str | None = None) -> None:
        super().__init__(poll_interval=0.01)
        outcomes = list(script)
        for outcome in outcomes:
            if outcome not in _OUTCOMES:
                raise InvalidArgument(f"ScriptedApprovalProvider: {outcome!r} is not one of {', '.join(_OUTCOMES)}")
        if not isinstance(approver, str) or not approver.strip():
            raise InvalidArgument("ScriptedApprovalProvider(approver=...) must name who answers")
        self._script = outcomes
        self.approver = approver
        self.note = note
        self.answered: list[tuple[str, str]] = []

    def add(self, *outcomes: ScriptedOutcome) -> None:
        """Append answers to the script."""
        for outcome in outcomes:
            if outcome not in _OUTCOMES:
                raise InvalidArgument(f"ScriptedApprovalProvider: {outcome!r} is not one of {', '.join(_OUTCOMES)}")
        self._script.extend(outcomes)

    def request(self, call: Any, ttl: dt.timedelta) -> Any:
        from . import store

        view = super().request(call, ttl)
        outcome = self._script.pop(0) if self._script else "ignore"
        self.answered.append((view.approval_id, outcome))
        if outcome == "ignore":
            return view
        return store.answer_approval(view.approval_id, outcome == "grant", by=self.approver, note=self.note)
