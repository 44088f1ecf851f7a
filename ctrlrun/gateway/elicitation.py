"""MCP elicitation through the gateway (§E2, §A5): an upstream's ``input_required`` suspends the call.

An upstream that answers a ``tools/call`` with ``resultType: input_required`` and a
``requestState`` has not finished: it asks the client something first. The executor raises
``Asked`` (a ``ctrlrun.Suspended``): the kernel records no outcome, the effect key stays held
(``executing``) for ``Control.suspend_timeout`` (the ``elicitation_timeout``, 300 s by default),
and the client gets the upstream's answer with a **gateway-issued** ``requestState``. The client
answers by sending the same call again with that ``params.requestState`` (and its
``inputResponses``); the gateway resumes the same action (``Control.aresume``) and forwards the
answer with the upstream's own ``requestState``.

The continuation token (``issue``/``read``): ``ctrlrun-cont.v1.<nonce>.<payload>``, a random nonce
(32 bytes) and the base64url of ``{"h": action hash, "r": round, "s": upstream requestState}``.
The store keeps only its SHA-256, so the whole token is what resumes: a client that edits the
embedded state, round or hash holds a token nobody issued (``-41009``). The embedded action hash
(tool, canonical arguments, principal, resource, environment) is compared with the continuing
call's before the continuation is taken, so another tool, other arguments or another principal
cannot finish this action and do not spend its token.

On a continuation leg nothing claims ``failed``: the first leg reached the upstream, which may
already have acted on it, so an answer that would prove "nothing ran" on a first leg is recorded
``ambiguous`` here.
"""
from __future__ import annotations

import base64
import binascii
import json
import secrets
from dataclasses import dataclass, replace
from typing import Any

from ctrlrun.errors import Suspended
from ctrlrun.gateway.outcome import AMBIGUOUS, COMMITTED, FAILED, Outcome

__all__ = ["MAX_ELICITATION_ROUNDS", "ELICITATION_TIMEOUT_SECONDS", "PREFIX", "Asked", "Continuation", "Leg",
           "issue", "read", "settle", "relayed"]

#: How many times one call may ask for input; the next ``input_required`` is recorded ambiguous.
MAX_ELICITATION_ROUNDS = 8
#: How long the key is held for the client's answer (the gateway Control's ``suspend_timeout``).
ELICITATION_TIMEOUT_SECONDS = 300

PREFIX = "ctrlrun-cont.v1."


@dataclass(frozen=True)
class Continuation:
    """What a gateway token binds: the suspended action's hash, its round, the upstream's state."""

    action_hash: str
    round: int
    state: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def issue(action_hash: str, round_: int, state: str) -> str:
    """A fresh, single-use continuation for round ``round_`` of the action ``action_hash``."""
    payload = json.dumps({"h": action_hash, "r": round_, "s": state}, separators=(",", ":"), sort_keys=True,
                         ensure_ascii=False)
    return f"{PREFIX}{secrets.token_urlsafe(32)}.{_b64(payload.encode('utf-8'))}"


def read(token: Any) -> Continuation | None:
    """The binding a gateway token carries, or None for anything the gateway did not issue in this
    shape (whether it is still held is the store's to say, when it is taken)."""
    if not isinstance(token, str) or not token.startswith(PREFIX):
        return None
    nonce, dot, payload = token[len(PREFIX):].partition(".")
    if not nonce or not dot or not payload:
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode("utf-8"))
    except (ValueError, binascii.Error, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(body, dict) or set(body) != {"h", "r", "s"}:
        return None
    hash_, round_, state = body["h"], body["r"], body["s"]
    if not isinstance(hash_, str) or not isinstance(state, str) or not state or isinstance(round_, bool) \
            or not isinstance(round_, int) or round_ < 1:
        return None
    return Continuation(hash_, round_, state)


class Asked(Suspended):
    """The gateway executor's ``Suspended``: the upstream asked for input; ``outcome`` is its answer,
    relayed to the client with ``continuation`` in place of the upstream's ``requestState``."""

    def __init__(self, continuation: str, outcome: Outcome) -> None:
        super().__init__(continuation, "the upstream asks the client for input: the call is suspended")
        self.outcome = self.payload = outcome


@dataclass(frozen=True)
class Leg:
    """One leg of a call: the first (``rounds`` 0) or a continuation (``rounds`` asked so far)."""

    action_hash: str
    effect_key: str | None
    rounds: int = 0
    max_rounds: int = MAX_ELICITATION_ROUNDS

    @property
    def continuing(self) -> bool:
        return self.rounds > 0


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def settle(outcome: Outcome, leg: Leg) -> Outcome:
    """What a leg's classified answer means for the call: the outcome to act on (``committed``
    returns the result, ``ambiguous`` and ``failed`` raise as the executor does); raises ``Asked``
    when the upstream asks for input and the call can be suspended."""
    if leg.continuing and outcome.result == FAILED:
        outcome = replace(outcome, result=AMBIGUOUS,
                          synthesized="upstream_ambiguous" if outcome.synthesized else None,
                          error=f"{outcome.error}; but this is a continuation leg: the call's first leg reached the "
                                f"upstream, so nothing proves the tool did not act")
    if outcome.result == COMMITTED or outcome.request_state is None:
        return outcome
    if leg.effect_key is None:
        return replace(outcome, synthesized="upstream_ambiguous", reason="unkeyed_elicitation",
                       error="the upstream asked for input, but this action has no effect: template, so no key "
                             "can be held while the client answers")
    if leg.rounds >= leg.max_rounds:
        return replace(outcome, synthesized="upstream_ambiguous", reason="max_elicitation_rounds",
                       error=f"the upstream asked for input a {_ordinal(leg.rounds + 1)} time; max_elicitation_rounds "
                             f"is {leg.max_rounds}, so the call ends here and what the tool did is unknown")
    raise Asked(issue(leg.action_hash, leg.rounds + 1, outcome.request_state), outcome)


def relayed(asked: Asked, request_id: Any, stamp: dict[str, Any]) -> dict[str, Any]:
    """The client's answer to a suspended call: the upstream's ``input_required`` result with the
    gateway's continuation as its ``requestState`` and the suspension's stamp in ``_meta``."""
    message = dict(asked.outcome.relay or {})
    result = dict(message.get("result") or {})
    result["requestState"] = asked.continuation
    result["_meta"] = {**(result.get("_meta") or {}), **stamp}
    return {**message, "jsonrpc": "2.0", "id": request_id, "result": result}
