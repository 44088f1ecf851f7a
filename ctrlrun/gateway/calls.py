"""One intercepted ``tools/call``: a protected call through the Control, answered on the wire.

The executor is the upstream exchange; the kernel decides, keys, approves, runs and records it
exactly as it does a ``@protect`` function (``Control.acall``, the async driver: the store runs on
ctrlrun's store threads, never on the event loop). The outcome table says what the exchange means:
``committed`` returns, provably-not-executed raises ``NotExecuted`` (recorded ``failed``), anything
else raises ``UpstreamAmbiguous`` (recorded ``ambiguous``).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from ctrlrun import observers
from ctrlrun.canonical import Action, Principal, canonical_arguments, evidence_time
from ctrlrun.errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    AuthorityDenied,
    CTRLRunError,
    DuplicateEffect,
    IdentityError,
    InvalidArgument,
    NotExecuted,
)
from ctrlrun.gateway.outcome import AMBIGUOUS, COMMITTED, Observed, Outcome, classify
from ctrlrun.gateway.wire import RECEIPT_META, GatewayError, find_unrepresentable
from ctrlrun.identity import IdentityContext, answer_of, wrapped
from ctrlrun.kernel.context import current_origin, with_approval
from ctrlrun.states import Decision
from ctrlrun.upstream import check as pin_check
from ctrlrun.upstream import observe_certificate, observe_tool_schema, verified

__all__ = ["UpstreamAmbiguous", "intercept"]


class UpstreamAmbiguous(Exception):
    """Raised by the gateway's executor: the upstream's answer does not say whether the tool ran."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        super().__init__(outcome.error)


class _NotRun(NotExecuted):
    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
        super().__init__(outcome.error)


# ---------------------------------------------------------------- the receipt of this call

_capture: ContextVar[list[dict[str, Any]] | None] = ContextVar("ctrlrun_gateway_receipts", default=None)


class _ReceiptCatcher:
    """A process observer that keeps the receipts written in a gateway call's context (the store
    phases of an async call run in a copy of the caller's context, and observers are told in the
    committing thread, so the call's own list is the one it sees)."""

    def on_receipt(self, receipt: dict[str, Any]) -> None:
        caught = _capture.get()
        if caught is not None:
            caught.append(receipt)


_CATCHER = _ReceiptCatcher()


def receipt_meta(receipt: dict[str, Any] | None, effect_key: str | None = None) -> dict[str, Any]:
    receipt = receipt or {}
    return {"action_id": receipt.get("action_id"), "receipt_id": receipt.get("receipt_id"),
            "effect_key": receipt.get("effect_key", effect_key), "result": receipt.get("result"),
            "attempt": receipt.get("attempt")}


# ---------------------------------------------------------------- approvals re-sent on the wire

def _bound(policy: Any, name: str, arguments: dict[str, Any], principal: Principal) -> tuple[str, str | None] | None:
    """The hash the kernel will bind an approval of this call to, and its effect key (None if the
    kernel will refuse the call before asking anyone)."""
    try:
        canonical = canonical_arguments(arguments)
        entry = policy.entry(name)
        resource = entry.resource.render(canonical, error=InvalidArgument) if entry and entry.resource else None
        action = Action(name, canonical, principal, resource=resource, environment=policy.environment)
        key = entry.effect.render(canonical, error=InvalidArgument) if entry and entry.effect else None
        return action.hash, key
    except CTRLRunError:
        return None


def _settled(store: Any, key: str | None) -> tuple[str, str] | None:
    """A key that already ran or is running, so asking a person again would be pointless: the
    refusal the kernel's reservation would give (it stays the authority on every other path)."""
    if key is None:
        return None
    effect = store.get_effect(key)
    if effect is None or not getattr(effect, "signature_ok", True):
        return None
    if effect.state == "committed":
        return "duplicate_effect", "committed"
    if effect.state == "executing":
        return "duplicate_effect", "in_progress"
    if effect.state == "ambiguous":
        return "ambiguous_effect", "ambiguous"
    return None


def _verified_enough(row: Any) -> bool:
    """Whether a granted row carries the verified approvers its own pins require: one granted through a
    surface that verifies nobody (the command line, a webhook) is refused at use and left granted, so
    presenting it again would refuse every re-sent call until it expires instead of asking again."""
    from ctrlrun import approvers

    return approvers.problem(pinned_roles=tuple(row.required_roles), pinned_count=row.approvals_required,
                             approvers=tuple(row.approvers), required_roles=(), required_count=1,
                             requester=row.user) is None


def _answered_for(store: Any, action_hash: str) -> Any:
    """The request to present for a re-sent call: the newest granted, unconsumed, unexpired one,
    else the newest denied one, else a pending one (returned as is), else None."""
    now = store.now()
    rows = list(reversed(store.approvals_for_hash(action_hash)))
    for row in rows:
        if (row.status == "granted" and row.consumed_at is None and row.expires_at > now and row.signature_ok
                and _verified_enough(row)):
            return row
    for row in rows:
        if row.status == "pending" and row.expires_at > now:
            return row
    for row in rows:
        if row.status == "denied" and row.signature_ok:
            return row
    return None


# ---------------------------------------------------------------- one call

async def intercept(control: Any, *, alias: str, request_id: Any, params: dict[str, Any], principal: Principal | None,
                    send: Callable[[], Awaitable[Observed]], headers: dict[str, str] | None = None,
                    upstream: str | None = None, tools: Callable[[], Awaitable[Any]] | None = None,
                    ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Decide and run one ``tools/call``; the HTTP status, the JSON-RPC answer and extra headers.

    ``headers`` (the request's) mean the Control's identity provider says who acts: it is asked
    here, so an approval re-sent on the wire is matched to the hash of that principal's call, and
    the kernel asks it again with the same headers (``Control.acall(headers=...)``).

    ``tools()`` reads the upstream's ``tools/list`` now (and its certificate), for a pinned entry
    (``upstream:``, ``ctrlrun.upstream``): checked before anyone is asked to approve."""
    tool = params.get("name")
    if not isinstance(tool, str) or not tool:
        raise GatewayError(-32602, "tools/call needs params.name, the tool's name (a string)", 400, None, request_id)
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise GatewayError(-32602, "tools/call params.arguments must be an object of argument names to values",
                           400, None, request_id)
    name = f"mcp.{alias}.{tool}"
    policy = control.loaded_policy or await control.aread(control.load)
    if principal is None and headers is not None and control.identity is not None:
        principal = await _identified(control, name, policy, headers, request_id)
    if principal is None:
        raise GatewayError.of("no_principal", "the gateway's identity named nobody for this request", request_id)
    if not observers._process.count(_CATCHER):
        observers.register(_CATCHER)
    pointer = find_unrepresentable(arguments)
    if pointer is not None:
        message = (f"the argument at {pointer} is a float, which ctrlrun cannot key or hash exactly: send an "
                   f"integer (minor units) or a string")
        action_id = await _record_unrepresentable(control, policy, name, arguments, principal, pointer, message)
        raise GatewayError.of("unrepresentable_argument", message, request_id, pointer=pointer,
                              reason="unrepresentable_argument", action_id=action_id)
    entry = policy.entry(name)
    not_executed_on_error = bool((entry.mcp or {}).get("not_executed_on_error")) if entry is not None else False

    if entry is not None and entry.upstream:
        reason = await _pinned(entry.upstream, upstream, name, tool, tools)
        if reason is not None:
            message = (f"{name}: the upstream does not match the policy's pin ({reason}): the tool, its schema or "
                       f"the server's certificate is not the one pinned")
            action_id = await _record_refusal(control, policy, name, arguments, principal, reason, message)
            raise GatewayError.of("upstream_unpinned", message, request_id, reason=reason, action_id=action_id)

    presented = None
    bound = _bound(policy, name, arguments, principal)
    if bound is not None and entry is not None and policy.evaluate(name, canonical_arguments(arguments)).decision.value \
            == "approve":
        action_hash, key = bound
        found = await control.aread(_answered_for, control.store, action_hash)
        if found is None or found.status != "granted":
            settled = await control.aread(_settled, control.store, key)
            if settled is not None:
                kind, state = settled
                data = {"effect_key": key, "state": state} if kind == "duplicate_effect" else {"effect_key": key}
                raise GatewayError.of(kind, f"effect {key!r} is {state}: {name} will not be asked about again",
                                      request_id, **data)
        if found is not None and found.status == "pending":
            raise GatewayError.of("approval_required", f"{name} waits for a person's approval ({found.approval_id}); "
                                  f"send the identical call again once it is granted", request_id,
                                  request_id=found.approval_id, action_hash=found.action_hash,
                                  expires_at=evidence_time(found.expires_at))
        presented = found.approval_id if found is not None else None

    async def executor() -> dict[str, Any]:
        outcome = classify(await send(), not_executed_on_error=not_executed_on_error)
        if outcome.result == COMMITTED:
            return outcome.relay["result"]  # type: ignore[index]
        if outcome.result == AMBIGUOUS:
            raise UpstreamAmbiguous(outcome)
        raise _NotRun(outcome)

    caught: list[dict[str, Any]] = []
    token = _capture.set(caught)
    outcome: Outcome | None = None
    try:
        with with_approval(presented) if presented else contextlib.nullcontext(), \
                verified(name) if entry is not None and entry.upstream else contextlib.nullcontext():
            try:
                result = await control.acall(name, arguments, executor, principal=principal, headers=headers)
            except (UpstreamAmbiguous, _NotRun) as exc:
                outcome = exc.outcome
            except CTRLRunError as exc:
                raise await _refusal(control, exc, name, request_id) from None
    finally:
        _capture.reset(token)
    meta = receipt_meta(caught[-1] if caught else None)
    if outcome is None:
        answer = dict(result)
        answer["_meta"] = {**(answer.get("_meta") or {}), RECEIPT_META: meta}
        return 200, {"jsonrpc": "2.0", "id": request_id, "result": answer}, {}
    return _answered(outcome, request_id, meta)


async def _pinned(pins: Any, upstream: str | None, name: str, tool: str,
                  tools: Callable[[], Awaitable[Any]] | None) -> str | None:
    """Observe the upstream as it is now (its tool's ``tools/list`` entry, its certificate) under the
    action name, then check the pins: the refusal's reason, or None."""
    if upstream is None or tools is None:
        return pin_check(pins, None, name)
    listed, certificate = await tools()
    observe_certificate(upstream, certificate)
    found = next((item for item in listed if item.get("name") == tool), None) if listed is not None else None
    try:
        observe_tool_schema(upstream, name, found)
    except CTRLRunError:  # an entry ctrlrun cannot hash (a float in its schema): not verifiable
        observe_tool_schema(upstream, name, None)
    return pin_check(pins, upstream, name)


async def _identified(control: Any, name: str, policy: Any, headers: dict[str, str], request_id: Any) -> Principal:
    """The principal the Control's identity provider names for this request, or the refusal: a
    rejected credential or a provider that declines is ``-41007`` (the message stays coarse; the
    detail is in the ``ctrlrun.identity`` log)."""
    provider = control.identity
    context = IdentityContext(action=name, environment=policy.environment, headers=headers)
    try:
        answer = answer_of(provider, name, await asyncio.to_thread(provider.resolve, context))
    except IdentityError as exc:
        raise GatewayError.of("no_principal", f"{name}: {exc}", request_id) from None
    except Exception as exc:
        raise GatewayError.of("no_principal", str(wrapped(provider, name, exc)), request_id) from None
    if answer is None:
        raise GatewayError.of("no_principal", f"{name}: the request carries no identity the gateway trusts",
                              request_id)
    return answer


def _as_text(value: Any) -> Any:
    """The arguments with each float as its JSON text (``1.5`` -> ``"1.5"``), so the refusal can be recorded."""
    if isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, dict):
        return {key: _as_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_text(item) for item in value]
    return value


async def _record_refusal(control: Any, policy: Any, name: str, arguments: dict[str, Any], principal: Principal,
                          reason: str, message: str) -> str | None:
    """A gateway refusal in the evidence: ACTION_DENIED and a ``denied`` receipt with ``reason``."""
    store = control.store
    try:
        action = Action(name, canonical_arguments(arguments), principal, environment=policy.environment)
    except CTRLRunError:
        return None
    call = store.Call(action, Decision.DENY, reason, policy.hash, None, policy_version=policy.version,
                      origin=current_origin())
    await control.aread(store.record_denial, call, {"reason": reason, "error": message})
    return action.action_id


async def _record_unrepresentable(control: Any, policy: Any, name: str, arguments: dict[str, Any],
                                  principal: Principal, pointer: str, message: str) -> str | None:
    """The float's refusal in the evidence: ACTION_DENIED and a ``denied`` receipt with reason
    ``unrepresentable_argument`` (the float kept as its JSON text). Its action id, or None when the
    arguments are refused for another reason too (the answer is the same; nothing is recorded)."""
    store = control.store
    try:
        action = Action(name, canonical_arguments(_as_text(arguments)), principal, environment=policy.environment)
    except CTRLRunError:
        return None
    call = store.Call(action, Decision.DENY, "unrepresentable_argument", policy.hash, None,
                      policy_version=policy.version, origin=current_origin())
    await control.aread(store.record_denial, call, {"reason": "unrepresentable_argument", "pointer": pointer,
                                                     "error": message})
    return action.action_id


def _answered(outcome: Outcome, request_id: Any, meta: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    if outcome.synthesized is not None:
        error = GatewayError.of(outcome.synthesized, outcome.error, request_id, effect_key=meta["effect_key"],
                                action_id=meta["action_id"], _meta={RECEIPT_META: meta})
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


async def _refusal(control: Any, exc: CTRLRunError, name: str, request_id: Any) -> GatewayError:
    """The kernel's refusal as the gateway's JSON-RPC error (these carry no ``_meta``)."""
    if isinstance(exc, IdentityError):
        kind = "principal_expired" if "principal_expired" in str(exc) else "no_principal"
        return GatewayError.of(kind, str(exc), request_id)
    if isinstance(exc, AuthorityDenied):
        return GatewayError.of("unauthorized", f"{name} is not permitted to you: {exc.reason}", request_id,
                               reason=exc.reason, action_id=exc.action_id)
    if isinstance(exc, ActionDenied):
        if exc.reason == "no_principal":
            return GatewayError.of("no_principal", str(exc), request_id)
        if exc.reason == "approval_denied":
            return GatewayError.of("approval_denied", str(exc), request_id, reason=exc.reason,
                                   action_id=exc.action_id)
        return GatewayError.of("denied", f"{name} denied: {exc.reason}", request_id, reason=exc.reason,
                               action_id=exc.action_id)
    if isinstance(exc, ApprovalRequired):
        request = await control.aread(control.store.get_approval, exc.request_id)
        return GatewayError.of("approval_required", str(exc), request_id, request_id=exc.request_id,
                               action_hash=request.action_hash if request else None,
                               expires_at=evidence_time(request.expires_at) if request else None)
    if isinstance(exc, DuplicateEffect):
        return GatewayError.of("duplicate_effect", str(exc), request_id, effect_key=exc.effect_key, state=exc.state)
    if isinstance(exc, AmbiguousEffect):
        return GatewayError.of("ambiguous_effect", str(exc), request_id, effect_key=exc.effect_key)
    if isinstance(exc, ApprovalMismatch):
        return GatewayError.of("blocked", str(exc), request_id, reason=exc.reason)
    return GatewayError.of("blocked", f"{name}: {exc}", request_id, reason=type(exc).__name__)
