"""One intercepted ``tools/call``: a protected call through the Control, answered on the wire.

The executor is the upstream exchange; the kernel decides, keys, approves, runs and records it
exactly as it does a ``@protect`` function (``ctrlrun.gateway.protected``, over ``Control.acall``,
the async driver: the store runs on ctrlrun's store threads, never on the event loop). The outcome
table says what the exchange means: ``committed`` returns, provably-not-executed raises ``NotRun``
(recorded ``failed``), anything else raises ``UpstreamAmbiguous`` (recorded ``ambiguous``).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ctrlrun.canonical import Principal
from ctrlrun.gateway.outcome import AMBIGUOUS, COMMITTED, Observed, Outcome, classify
from ctrlrun.gateway.protected import Ambiguous, NotRun, protected_tool_call, receipt_meta
from ctrlrun.gateway.wire import RECEIPT_META, GatewayError

__all__ = ["UpstreamAmbiguous", "intercept", "receipt_meta"]


class UpstreamAmbiguous(Ambiguous):
    """Raised by the gateway's executor: the upstream's answer does not say whether the tool ran."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        super().__init__(outcome, outcome.error)


async def intercept(control: Any, *, alias: str, request_id: Any, params: dict[str, Any], principal: Principal | None,
                    send: Callable[[Any], Awaitable[Observed]], headers: dict[str, str] | None = None,
                    upstream: str | None = None, tools: Callable[[Any], Awaitable[Any]] | None = None,
                    ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Decide and run one ``tools/call``; the HTTP status, the JSON-RPC answer and extra headers.
    ``headers``, ``upstream`` and ``tools(pins)`` are ``protected_tool_call``'s; ``send(pins)`` is the
    call's own exchange, its connection held to the entry's certificate pins."""
    tool = params.get("name")
    if not isinstance(tool, str) or not tool:
        raise GatewayError(-32602, "tools/call needs params.name, the tool's name (a string)", 400, None, request_id)
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise GatewayError(-32602, "tools/call params.arguments must be an object of argument names to values",
                           400, None, request_id)

    policy = control.loaded_policy or await control.aread(control.load)
    entry = policy.entry(f"mcp.{alias}.{tool}")
    pins = entry.upstream if entry is not None and entry.upstream else None

    async def run(not_executed_on_error: bool) -> dict[str, Any]:
        outcome = classify(await send(pins), not_executed_on_error=not_executed_on_error)
        if outcome.result == COMMITTED:
            return outcome.relay["result"]  # type: ignore[index]
        if outcome.result == AMBIGUOUS:
            raise UpstreamAmbiguous(outcome)
        raise NotRun(outcome, outcome.error)

    finished = await protected_tool_call(control, alias=alias, tool=tool, arguments=arguments, principal=principal,
                                         run=run, request_id=request_id, headers=headers, upstream=upstream,
                                         tools=tools)
    if finished.unfinished is None:
        answer = dict(finished.result)
        answer["_meta"] = {**(answer.get("_meta") or {}), RECEIPT_META: finished.meta}
        return 200, {"jsonrpc": "2.0", "id": request_id, "result": answer}, {}
    return _answered(finished.unfinished.payload, request_id, finished.meta)


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
