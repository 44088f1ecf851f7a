"""One MCP ``tools/call`` as a protected call: what the gateway and an in-process server share.

``protected_tool_call`` is the whole pipeline between "a client asked for tool T with these
arguments" and "this is what happened": the action ``mcp.<alias>.<tool>``, who acts (a fixed
principal, or the Control's identity provider reading the request's headers), the float check
(``-41008``, recorded), upstream pins, an approval presented by re-sending the identical call, the
kernel's decision, key and run (``Control.acall``), and the receipt of the call for
``_meta["com.ctrlrun/receipt"]``. A refusal is raised as a ``GatewayError`` (the §E1 codes); how the
tool is reached is the caller's ``run``: the gateway's upstream exchange (``gateway.calls``) or the
SDK server's own tool call (``ctrlrun.mcp_server``).

``run`` returns the result to commit, raises ``Ambiguous(payload)`` (recorded ``ambiguous``) or
``NotRun(payload)`` (a ``NotExecuted``: recorded ``failed``); the payload comes back to the caller,
who says what the client is told.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
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
    Suspended,
)
from ctrlrun.gateway.wire import GatewayError, find_unrepresentable
from ctrlrun.identity import IdentityContext, answer_of, wrapped
from ctrlrun.kernel.context import current_origin, with_approval
from ctrlrun.resent import answered_for as _answered_for
from ctrlrun.resent import bound as _bound
from ctrlrun.resent import settled as _settled
from ctrlrun.states import Decision
from ctrlrun.upstream import check as pin_check
from ctrlrun.upstream import MISMATCH, observe_certificate, observe_tool_schema, verified

__all__ = ["Ambiguous", "NotRun", "Finished", "protected_tool_call", "resumed_tool_call", "receipt_meta", "refusal",
           "CALL_BINDING"]

#: While a ``run`` runs: the (action hash, effect key) of its call, for a run that suspends it
#: (the gateway's elicitation binds its continuation to them).
CALL_BINDING: ContextVar[tuple[str, str | None] | None] = ContextVar("ctrlrun_gateway_binding", default=None)


class Ambiguous(Exception):
    """Raised by a ``run``: the tool may have acted; ``payload`` is what the caller answers with."""

    def __init__(self, payload: Any, message: str = "") -> None:
        self.payload = payload
        super().__init__(message or str(payload))


class NotRun(NotExecuted):
    """Raised by a ``run``: provably nothing ran (recorded ``failed``, a retry may run)."""

    def __init__(self, payload: Any, message: str = "") -> None:
        self.payload = payload
        super().__init__(message or str(payload))


@dataclass(frozen=True)
class Finished:
    """A call the kernel let through: ``result`` when it committed, else ``unfinished`` (the
    ``Ambiguous`` or ``NotRun`` its run raised, or the ``Suspended``: held, no outcome yet);
    ``meta`` is its receipt's stamp (a suspended call's: ``result: "suspended"``, its round)."""

    result: Any
    unfinished: Ambiguous | NotRun | Suspended | None
    meta: dict[str, Any]


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


# ---------------------------------------------------------------- one call

async def protected_tool_call(control: Any, *, alias: str, tool: str, arguments: dict[str, Any],
                              principal: Principal | None, run: Callable[[bool], Awaitable[Any]],
                              request_id: Any = None, headers: dict[str, str] | None = None,
                              upstream: str | None = None, tools: Callable[[Any], Awaitable[Any]] | None = None,
                              ) -> Finished:
    """Decide and run ``mcp.<alias>.<tool>``; a refusal is raised as a ``GatewayError``.

    ``run(not_executed_on_error)`` reaches the tool (``not_executed_on_error``: the policy entry's
    ``mcp: {not_executed_on_error: true}``, an ``isError`` answer meaning nothing ran).

    ``headers`` (the request's) mean the Control's identity provider says who acts: it is asked
    here, so an approval re-sent on the wire is matched to the hash of that principal's call, and
    the kernel asks it again with the same headers (``Control.acall(headers=...)``).

    ``tools(pins)`` reads the upstream's ``tools/list`` now (and its certificate), for a pinned entry
    (``upstream:``, ``ctrlrun.upstream``): checked before anyone is asked to approve. Without an
    upstream (in-process) a pinned entry is refused ``upstream_unverified``."""
    name = f"mcp.{alias}.{tool}"
    policy, principal = await _opened(control, name, principal, headers, request_id)
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

    async def executor() -> Any:
        return await run(not_executed_on_error)

    async def start() -> Any:
        with with_approval(presented) if presented else contextlib.nullcontext(), \
                verified(name) if entry is not None and entry.upstream else contextlib.nullcontext():
            return await control.acall(name, arguments, executor, principal=principal, headers=headers)

    return await _finished(control, name, request_id, bound, start)


async def resumed_tool_call(control: Any, *, alias: str, tool: str, arguments: dict[str, Any],
                            principal: Principal | None, continuation: str, action_hash: str,
                            run: Callable[[bool], Awaitable[Any]], request_id: Any = None,
                            headers: dict[str, str] | None = None, upstream: str | None = None,
                            tools: Callable[[Any], Awaitable[Any]] | None = None) -> Finished:
    """Finish the call suspended under ``continuation`` (``Control.aresume``), whose action hash the
    continuation says is ``action_hash``: refused ``-41009`` unless this very call (tool, arguments,
    principal) has that hash, and when no held suspension matches (resumed already, never issued,
    lapsed). The policy is not evaluated again and no approval is asked for; authority is (the
    kernel's resume), and a pinned entry's upstream is checked again (``-41016``, left suspended)."""
    name = f"mcp.{alias}.{tool}"
    policy, principal = await _opened(control, name, principal, headers, request_id)
    bound = _bound(policy, name, arguments, principal)
    if bound is None or bound[0] != action_hash:
        raise GatewayError.of("unknown_continuation", f"{name}: this continuation belongs to another call (the tool, "
                              f"its arguments or who acts differ from the suspended call's); it is left as it was",
                              request_id)
    entry = policy.entry(name)
    not_executed_on_error = bool((entry.mcp or {}).get("not_executed_on_error")) if entry is not None else False
    if entry is not None and entry.upstream:
        reason = await _pinned(entry.upstream, upstream, name, tool, tools)
        if reason is not None:
            raise GatewayError.of("upstream_unpinned", f"{name}: the upstream no longer matches the policy's pin "
                                  f"({reason}); the suspended call is not resumed (it is recorded ambiguous when "
                                  f"its elicitation_timeout lapses)", request_id, reason=reason)
    ran = False

    async def executor() -> Any:
        nonlocal ran
        ran = True
        return await run(not_executed_on_error)

    async def start() -> Any:
        try:
            return await control.aresume(continuation, executor)
        except InvalidArgument as exc:
            if ran:
                raise
            raise GatewayError.of("unknown_continuation", f"{name}: {exc}", request_id) from None

    return await _finished(control, name, request_id, bound, start)


async def _finished(control: Any, name: str, request_id: Any, bound: tuple[str, str | None] | None,
                    start: Callable[[], Awaitable[Any]]) -> Finished:
    """Run one leg through the kernel (``start``) with its receipt caught: what it came to."""
    caught: list[dict[str, Any]] = []
    token = _capture.set(caught)
    binding = CALL_BINDING.set(bound)
    result: Any = None
    unfinished: Ambiguous | NotRun | Suspended | None = None
    try:
        try:
            result = await start()
        except (Ambiguous, NotRun) as exc:
            unfinished = exc
        except Suspended as exc:
            return Finished(None, exc, await _suspended_meta(control, exc))
        except CTRLRunError as exc:
            cause = exc.__cause__ or exc.__context__
            if not isinstance(exc, InvalidArgument) or not isinstance(cause, Suspended):
                raise await refusal(control, exc, name, request_id) from None
            # The kernel would not hold the key (observe mode, a lease that lapsed): recorded ambiguous.
            unfinished = Ambiguous(getattr(cause, "payload", None), str(exc))
    finally:
        CALL_BINDING.reset(binding)
        _capture.reset(token)
    return Finished(result, unfinished, receipt_meta(caught[-1] if caught else None))


async def _suspended_meta(control: Any, suspended: Suspended) -> dict[str, Any]:
    """The stamp of a suspended call: its action and attempt (no receipt yet), ``result:
    "suspended"`` and the round."""
    key = suspended.effect_key
    effect = await control.aread(control.store.get_effect, key) if key else None
    return {"action_id": effect.action_id if effect else None, "receipt_id": None, "effect_key": key,
            "result": "suspended", "attempt": effect.attempt if effect else None, "round": suspended.round}


async def _opened(control: Any, name: str, principal: Principal | None, headers: dict[str, str] | None,
                  request_id: Any) -> tuple[Any, Principal]:
    """The policy in force and who acts (the given principal, else the identity provider's answer for
    these headers; nobody is ``-41007``), with this process's receipt catcher registered."""
    policy = control.loaded_policy or await control.aread(control.load)
    if principal is None and headers is not None and control.identity is not None:
        principal = await _identified(control, name, policy, headers, request_id)
    if principal is None:
        raise GatewayError.of("no_principal", f"{name}: the identity named nobody for this request", request_id)
    if not observers._process.count(_CATCHER):
        observers.register(_CATCHER)
    return policy, principal


async def _pinned(pins: Any, upstream: str | None, name: str, tool: str,
                  tools: Callable[[Any], Awaitable[Any]] | None) -> str | None:
    """Observe the upstream as it is now (its tool's ``tools/list`` entry, its certificate) under the
    action name, then check the pins: the refusal's reason, or None."""
    if upstream is None or tools is None:
        return pin_check(pins, None, name)
    listed, certificate, untrusted = await tools(pins)
    if untrusted is not None:  # the handshake refused the certificate under the pinned trust anchors
        observe_certificate(upstream, None)
        return MISMATCH
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
        raise GatewayError.of("no_principal", f"{name}: the request carries no identity ctrlrun is told to trust",
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


async def refusal(control: Any, exc: CTRLRunError, name: str, request_id: Any) -> GatewayError:
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
