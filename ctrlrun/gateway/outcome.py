"""The MCP outcome table (§E2): what an upstream's answer to a ``tools/call`` means for the effect.

``classify`` is pure: it takes what was observed on the wire (``Observed``) and returns an
``Outcome``: the result to record (``committed``, ``failed`` - provably not executed - or
``ambiguous``) and what the client is told (the upstream's answer relayed, or an error the gateway
synthesizes). Only an answer that proves nothing ran may record ``failed``; anything unclear is
``ambiguous``, never ``failed``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctrlrun.gateway.wire import CURRENT_REVISION

__all__ = ["Observed", "Outcome", "classify", "PRE_DISPATCH_CODES", "COMMITTED", "FAILED", "AMBIGUOUS"]

COMMITTED, FAILED, AMBIGUOUS = "committed", "failed", "ambiguous"

#: JSON-RPC errors a server returns before it dispatches to the tool: nothing ran.
PRE_DISPATCH_CODES = frozenset({-32700, -32600, -32601, -32602, -32020, -32021, -32022})


@dataclass(frozen=True)
class Observed:
    """One upstream exchange as seen by the gateway.

    ``transport`` is ``None`` when an HTTP answer arrived, else ``never_connected`` (the TCP
    connection was refused: no byte of the call left), ``unpinned`` (the connection presented a
    certificate the entry's pins refuse, found before a byte of the call was written),
    ``client_disconnected`` or ``lost``
    (the connection failed after the request was sent, a timeout, an oversized or unreadable
    answer)."""

    transport: str | None = None
    detail: str = ""
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    message: dict[str, Any] | None = None  # the JSON-RPC response to this request
    revision: str = CURRENT_REVISION


@dataclass(frozen=True)
class Outcome:
    result: str
    #: What the client gets: ("relay", upstream message, HTTP status) or ("error", error name, message).
    relay: dict[str, Any] | None = None
    status: int = 200
    synthesized: str | None = None
    error: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    #: ``input_required`` with a ``requestState``: the call is suspended, not finished (§E2, §A5).
    request_state: str | None = None
    #: A synthesized error's ``data.reason`` (``upstream_mismatch`` for ``-41016``, ``max_elicitation_rounds``
    #: ...), when it has one.
    reason: str | None = None


def classify(observed: Observed, *, not_executed_on_error: bool = False) -> Outcome:
    """The outcome table of §E2."""
    if observed.transport == "never_connected":
        return Outcome(FAILED, synthesized="upstream_not_executed",
                       error=f"the upstream could not be reached, so the call never left: {observed.detail}")
    if observed.transport == "unpinned":
        return Outcome(FAILED, synthesized="upstream_unpinned", reason="upstream_mismatch",
                       error=f"the upstream's connection did not present a pinned certificate, so the call was "
                             f"never written: {observed.detail}")
    if observed.transport is not None:
        return Outcome(AMBIGUOUS, synthesized=None if observed.transport == "client_disconnected" else
                       "upstream_ambiguous", error=f"the upstream's answer was lost ({observed.detail}): the tool "
                                                  f"may have run")
    status, message = observed.status, observed.message
    if status == 401 or (status == 403 and any(k.lower() == "www-authenticate" for k in observed.headers)):
        challenge = {k: v for k, v in observed.headers.items() if k.lower() == "www-authenticate"}
        return Outcome(FAILED, relay=message, status=status, headers=challenge,
                       error=f"the upstream refused the credentials (HTTP {status}) before running the tool")
    if not 200 <= status < 300 or message is None:
        what = f"HTTP {status}" if not 200 <= status < 300 else "an answer that is not this call's JSON-RPC response"
        return Outcome(AMBIGUOUS, synthesized="upstream_ambiguous",
                       error=f"the upstream answered {what}: the tool may have run")
    if "error" in message:
        error = message.get("error") or {}
        code = error.get("code") if isinstance(error, dict) else None
        text = f"the upstream answered JSON-RPC error {code}: {error.get('message', '') if isinstance(error, dict) else ''}"
        if code in PRE_DISPATCH_CODES:
            return Outcome(FAILED, relay=message, status=status, error=text + " (before dispatch: nothing ran)")
        return Outcome(AMBIGUOUS, relay=message, status=status, error=text + " (the tool may have run)")
    result = message.get("result")
    if not isinstance(result, dict):
        return Outcome(AMBIGUOUS, synthesized="upstream_ambiguous", error="the upstream's result is not an object")
    kind = result.get("resultType")
    if kind is None and observed.revision != CURRENT_REVISION:
        kind = "complete"  # legacy revisions have no resultType: an answer is a complete one
    if kind == "input_required":
        state = result.get("requestState")
        if isinstance(state, str) and state:
            return Outcome(AMBIGUOUS, relay=message, status=status, request_state=state,
                           error="the upstream asks the client for input")
        return Outcome(AMBIGUOUS, synthesized="upstream_ambiguous",
                       error="the upstream asked for input without a requestState: a continuation could not be "
                             "told from a duplicate")
    if kind != "complete":
        return Outcome(AMBIGUOUS, relay=message, status=status,
                       error=f"the upstream's resultType is {kind!r}, not 'complete': the outcome is unknown")
    if result.get("isError") is True:
        if not_executed_on_error:
            return Outcome(FAILED, relay=message, status=status,
                           error="the tool answered isError (the policy says such an error means nothing ran)")
        return Outcome(AMBIGUOUS, relay=message, status=status, error="the tool answered isError: part of it may "
                                                                      "have run")
    return Outcome(COMMITTED, relay=message, status=status)
