"""One intercepted ``tools/call``: a protected call through the Control, answered on the wire.

The executor is the upstream exchange; the kernel decides, keys, approves, runs and records it
exactly as it does a ``@protect`` function (``ctrlrun.gateway.protected``, over ``Control.acall``,
the async driver: the store runs on ctrlrun's store threads, never on the event loop). The outcome
table says what the exchange means: ``committed`` returns, provably-not-executed raises ``NotRun``
(recorded ``failed``), anything else raises ``UpstreamAmbiguous`` (recorded ``ambiguous``), and an
``input_required`` answer with a ``requestState`` suspends the call (``ctrlrun.gateway.elicitation``):
a later ``tools/call`` carrying the gateway's continuation in ``params.requestState`` resumes it
(``Control.aresume``).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from ctrlrun.canonical import Principal
from ctrlrun.gateway.elicitation import MAX_ELICITATION_ROUNDS, Asked, Leg, read, relayed, settle
from ctrlrun.gateway.outcome import AMBIGUOUS, COMMITTED, Observed, Outcome, classify
from ctrlrun.gateway.protected import (
    CALL_BINDING,
    Ambiguous,
    NotRun,
    protected_tool_call,
    receipt_meta,
    resumed_tool_call,
)
from ctrlrun.gateway.wire import RECEIPT_META, GatewayError

__all__ = ["UpstreamAmbiguous", "intercept", "receipt_meta"]


class UpstreamAmbiguous(Ambiguous):
    """Raised by the gateway's executor: the upstream's answer does not say whether the tool ran."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        super().__init__(outcome, outcome.error)


async def intercept(control: Any, *, alias: str, request_id: Any, params: dict[str, Any], principal: Principal | None,
                    send: Callable[..., Awaitable[Observed]], headers: dict[str, str] | None = None,
                    upstream: str | None = None, tools: Callable[[Any], Awaitable[Any]] | None = None,
                    max_elicitation_rounds: int = MAX_ELICITATION_ROUNDS,
                    ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Decide and run one ``tools/call``; the HTTP status, the JSON-RPC answer and extra headers.
    ``headers``, ``upstream`` and ``tools(pins)`` are ``protected_tool_call``'s.

    ``send(pins)`` sends the client's request on, its connection held to the entry's certificate
    pins; ``send(pins, params)`` sends it with other ``params`` (a continuation leg: the upstream's
    own ``requestState`` in place of the gateway's). A ``params.requestState`` is a continuation: the
    call it names is resumed, not decided again."""
    tool = params.get("name")
    if not isinstance(tool, str) or not tool:
        raise GatewayError(-32602, "tools/call needs params.name, the tool's name (a string)", 400, None, request_id)
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise GatewayError(-32602, "tools/call params.arguments must be an object of argument names to values",
                           400, None, request_id)
    token = params.get("requestState")
    continuation = read(token) if token is not None else None
    if token is not None and continuation is None:
        raise GatewayError.of("unknown_continuation", f"mcp.{alias}.{tool}: params.requestState is not a "
                              f"continuation this gateway issued; send the call without it to start a new one",
                              request_id)
    rounds = continuation.round if continuation is not None else 0
    sent = ({**params, "requestState": continuation.state},) if continuation is not None else ()

    policy = control.loaded_policy or await control.aread(control.load)
    entry = policy.entry(f"mcp.{alias}.{tool}")
    pins = entry.upstream if entry is not None and entry.upstream else None

    async def run(not_executed_on_error: bool) -> dict[str, Any]:
        bound = CALL_BINDING.get()
        leg = Leg(bound[0] if bound else "", bound[1] if bound else None, rounds, max_elicitation_rounds)
        outcome = settle(classify(await send(pins, *sent), not_executed_on_error=not_executed_on_error), leg)
        if outcome.result == COMMITTED:
            return outcome.relay["result"]  # type: ignore[index]
        if outcome.result == AMBIGUOUS:
            raise UpstreamAmbiguous(outcome)
        raise NotRun(outcome, outcome.error)

    if continuation is not None:
        finished = await resumed_tool_call(control, alias=alias, tool=tool, arguments=arguments, principal=principal,
                                           continuation=token, action_hash=continuation.action_hash, run=run,
                                           request_id=request_id, headers=headers, upstream=upstream, tools=tools)
    else:
        finished = await protected_tool_call(control, alias=alias, tool=tool, arguments=arguments,
                                             principal=principal, run=run, request_id=request_id, headers=headers,
                                             upstream=upstream, tools=tools)
    if finished.unfinished is None:
        answer = dict(finished.result)
        answer["_meta"] = {**(answer.get("_meta") or {}), RECEIPT_META: finished.meta}
        return 200, {"jsonrpc": "2.0", "id": request_id, "result": answer}, {}
    if isinstance(finished.unfinished, Asked):
        asked = finished.unfinished
        return 200, relayed(asked, request_id, {RECEIPT_META: finished.meta}), asked.outcome.headers
    outcome = finished.unfinished.payload
    if outcome.request_state is not None and outcome.synthesized is None:  # an input_required the kernel would not hold
        outcome = replace(outcome, synthesized="upstream_ambiguous", error=str(finished.unfinished))
    return _answered(outcome, request_id, finished.meta)


def _answered(outcome: Outcome, request_id: Any, meta: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    if outcome.synthesized is not None:
        reason = {"reason": outcome.reason} if outcome.reason else {}
        error = GatewayError.of(outcome.synthesized, outcome.error, request_id, effect_key=meta["effect_key"],
                                action_id=meta["action_id"], **reason, _meta={RECEIPT_META: meta})
        return error.status, error.body(), {}
    message = dict(outcome.relay or {"jsonrpc": "2.0", "id": request_id, "result": {}})
    if "result" in message and isinstance(message["result"], dict):
        result = dict(message["result"])
        result["_meta"] = {**(result.get("_meta") or {}), RECEIPT_META: meta}
        message["result"] = result
    elif isinstance(message.get("error"), dict):
        error = dict(message["error"])
        data = error.get("data")
        if data is None or isinstance(data, dict):
            error["data"] = {**(data or {}), "_meta": {RECEIPT_META: meta}}
        message["error"] = error
    return outcome.status, message, outcome.headers
