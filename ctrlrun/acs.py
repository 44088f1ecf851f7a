"""The ACS control hook (Agent Control Standard v0.1.0, spec §E5): a Guardian's two checkpoints.

ACS is advisory: the Guardian answers and the agent platform runs the tool. So one protected call
is split across the two hooks the platform fires, joined by ``Suspended``/``Control.resume`` (§A5):

- ``steps/toolCallRequest``: the call is decided and its effect key reserved exactly as
  ``Control.call`` does it; the executor raises ``Suspended("acs:<request_id>")``, so the key stays
  held (``executing``) and the answer is ``allow``. A call that needs a person answers ``ask``
  (``ask_details``); any refusal answers ``deny`` with ``reason_codes``;
- ``steps/toolCallResult``: ``payload.request_id_ref`` resumes that call and ``exit_status`` says
  what happened: ``success`` committed, ``blocked`` failed (nothing ran), ``failure`` failed only
  where the policy entry says such an error means nothing ran (``mcp: {not_executed_on_error:
  true}``, the gateway's key), else ambiguous; ``timeout`` ambiguous.

The hook's own steps are written once (``_request_steps``, ``_result_steps``: generators yielding
what they need done) and driven twice: ``handle`` in the calling thread, ``ahandle`` from an event
loop, where every store read and every call runs as ``Control.aread``/``acall`` run it (on ctrlrun's
store threads, never on the loop). Bad input is a JSON-RPC error, never a traceback:
``-32002`` for an envelope that is not ACS v0.1's, ``-32001`` for a method or a result this hook did
not answer. See docs/acs.md.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import resent
from .canonical import MAX_DEPTH, Principal, canonical_arguments, evidence_time
from .errors import (
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
from .identity import IdentityContext, answer_of, check_provider, wrapped
from .kernel import drive
from .kernel.context import running_attempt, with_approval
from .kernel.suspension import resume_steps

__all__ = ["AcsControlHook", "ACS_VERSION", "TOOL_CALL_REQUEST", "TOOL_CALL_RESULT", "NOT_ANSWERED", "MALFORMED",
           "MAX_ENVELOPE_BYTES", "CONTINUATION_PREFIX"]

logger = logging.getLogger("ctrlrun.acs")

ACS_VERSION = "0.1.0"
TOOL_CALL_REQUEST = "steps/toolCallRequest"
TOOL_CALL_RESULT = "steps/toolCallResult"
#: JSON-RPC errors of the ACS range (-32000..-32099): not a checkpoint this hook answered; not ACS v0.1.
NOT_ANSWERED, MALFORMED = -32001, -32002
#: JSON-RPC's own: the store could not record a result (nothing about the envelope is wrong).
INTERNAL = -32603
#: How large an envelope may be (a lower bound of its JSON: string lengths and two per item).
MAX_ENVELOPE_BYTES = 1024 * 1024
#: Containers an envelope may nest: an argument's value sits five levels down (envelope, params,
#: payload, arguments, its {value, provenance}), and may itself nest as deep as any argument.
MAX_ENVELOPE_DEPTH = MAX_DEPTH + 5
#: A request's continuation is its ACS ``request_id`` under this prefix, so a result can resume
#: only a call this hook suspended (never another integration's continuation).
CONTINUATION_PREFIX = "acs:"
EXIT_STATUSES = ("success", "failure", "timeout", "blocked")

_PREFIX = re.compile(r"[a-z0-9][a-z0-9_-]*\Z")
_SEGMENT = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
_VERSION = re.compile(r"0\.1\.[0-9]+\Z")
_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class _Malformed(Exception):
    def __init__(self, message: str, code: int = MALFORMED) -> None:
        super().__init__(message)
        self.code = code


class _Unknown(Exception):
    """Raised by the result leg's executor: the platform's report does not say whether the tool acted."""


# --------------------------------------------------------------------------- instructions


@dataclass(frozen=True)
class _Read:
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class _Resolve:
    provider: Any
    context: IdentityContext


@dataclass(frozen=True)
class _Call:
    name: str
    arguments: dict[str, Any]
    executor: Callable[[], Any]
    principal: Principal
    headers: Mapping[str, str] | None
    presented: str | None = None


@dataclass(frozen=True)
class _Resume:
    continuation: str
    invoke: Callable[[Any], Any]


@dataclass(frozen=True)
class _Envelope:
    rpc_id: Any
    method: str
    request_id: str
    metadata: Mapping[str, Any]
    payload: Mapping[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


_Steps = Generator[Any, Any, dict[str, Any]]


# --------------------------------------------------------------------------- the hook


class AcsControlHook:
    """Answers ACS v0.1.0 ``steps/toolCallRequest`` and ``steps/toolCallResult`` under ``control``.

    ``prefix``: the action names' first part (``<prefix>.<provider>.<tool>[.<operation>]``).
    ``approver_id``: who an ``ask`` names as the human approver (default ``cli:local``, the command
    line). ``ask_timeout_seconds``: the ``timeout_seconds`` an ``ask`` carries. ``identity``: an
    identity provider that says who acts from the request's headers (default: the Control's); with
    neither, ``params.metadata.agent_id`` (and ``user_context.user_id``) acts, which a policy with an
    ``authority:`` section refuses to trust: that is ``InvalidArgument`` here.
    """

    def __init__(self, control: Any, *, prefix: str = "acs", approver_id: str = "cli:local",
                 ask_timeout_seconds: int = 900, identity: Any = None) -> None:
        from .control import Control

        if not isinstance(control, Control):
            raise InvalidArgument(f"AcsControlHook(control) takes a ctrlrun Control, not {type(control).__name__}")
        if not isinstance(prefix, str) or not _PREFIX.match(prefix):
            raise InvalidArgument(f"AcsControlHook(prefix=...) must match {_PREFIX.pattern} (it names the actions "
                                  f"<prefix>.<provider>.<tool>), got {prefix!r}")
        if not isinstance(approver_id, str) or not approver_id.strip() or _FORBIDDEN.search(approver_id):
            raise InvalidArgument("AcsControlHook(approver_id=...) must name the approver an 'ask' points to, "
                                  "e.g. 'cli:local'")
        if isinstance(ask_timeout_seconds, bool) or not isinstance(ask_timeout_seconds, int) \
                or ask_timeout_seconds < 1:
            raise InvalidArgument(f"AcsControlHook(ask_timeout_seconds=...) must be a positive whole number of "
                                  f"seconds, got {ask_timeout_seconds!r}")
        check_provider(identity)
        own = control.identity
        if identity is not None and own is not None and own is not identity:
            raise InvalidArgument("AcsControlHook(identity=...): the Control has an identity provider of its own; "
                                  "two providers would answer for one call (give the hook none, or the same one)")
        self.control, self.prefix, self.approver_id = control, prefix, approver_id
        self.ask_timeout_seconds = ask_timeout_seconds
        self.identity = identity if identity is not None else own
        policy = control.read_policy()
        if policy.authority is not None and self.identity is None:
            raise InvalidArgument(f"{policy.source} has an 'authority:' section, and the ACS hook has no identity "
                                  f"provider: it would trust params.metadata.agent_id, which the agent writes "
                                  f"itself. Give AcsControlHook(identity=...) or the Control one")
        pinned = sorted(name for name, entry in policy.actions.items()
                        if entry.upstream and name.startswith(prefix + "."))
        if pinned:
            raise InvalidArgument(f"{policy.source} pins an upstream server for {', '.join(pinned)} ('upstream:'), "
                                  f"which only the MCP gateway can check; the ACS hook cannot")

    def __repr__(self) -> str:
        return f"<AcsControlHook prefix={self.prefix!r} control={self.control!r}>"

    # ------------------------------------------------------------------ entry points

    def handle(self, envelope: Any, *, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Answer one ACS request envelope (a parsed JSON object): the response envelope, a dict."""
        steps = self._steps(envelope, _headers(headers))
        send: Any = None
        throw: Exception | None = None
        while True:
            try:
                op = steps.send(send) if throw is None else steps.throw(throw)
            except StopIteration as done:
                return done.value
            send, throw = None, None
            try:
                send = self._sync(op)
            except Exception as exc:  # noqa: BLE001 - thrown back into the steps, which decide
                throw = exc

    async def ahandle(self, envelope: Any, *, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        """``handle`` from an event loop: the store is never waited on in the loop."""
        steps = self._steps(envelope, _headers(headers))
        send: Any = None
        throw: Exception | None = None
        while True:
            try:
                op = steps.send(send) if throw is None else steps.throw(throw)
            except StopIteration as done:
                return done.value
            send, throw = None, None
            try:
                send = await self._async(op)
            except Exception as exc:  # noqa: BLE001 - thrown back into the steps, which decide
                throw = exc

    # ------------------------------------------------------------------ the two drivers

    def _sync(self, op: Any) -> Any:
        control = self.control
        if isinstance(op, _Read):
            return control.read(op.fn, *op.args)
        if isinstance(op, _Resolve):
            return op.provider.resolve(op.context)
        if isinstance(op, _Call):
            with with_approval(op.presented) if op.presented else contextlib.nullcontext():
                return control.call(op.name, op.arguments, op.executor, principal=op.principal, headers=op.headers)
        if isinstance(op, _Resume):
            return drive.run_sync(resume_steps(control, op.continuation, op.invoke, awaitable=False), control)
        raise AssertionError(op)

    async def _async(self, op: Any) -> Any:
        control = self.control
        if isinstance(op, _Read):
            return await control.aread(op.fn, *op.args)
        if isinstance(op, _Resolve):
            return await asyncio.to_thread(op.provider.resolve, op.context)
        if isinstance(op, _Call):
            executor = op.executor

            async def run() -> Any:
                return executor()

            with with_approval(op.presented) if op.presented else contextlib.nullcontext():
                return await control.acall(op.name, op.arguments, run, principal=op.principal, headers=op.headers)
        if isinstance(op, _Resume):
            invoke = op.invoke

            async def ainvoke(action: Any) -> Any:
                return invoke(action)

            return await drive.run_async(resume_steps(control, op.continuation, ainvoke, awaitable=True), control)
        raise AssertionError(op)

    # ------------------------------------------------------------------ the steps, written once

    def _steps(self, envelope: Any, headers: Mapping[str, str] | None) -> _Steps:
        try:
            parsed = _parse(envelope)
        except _Malformed as refused:
            return _error(_rpc_id(envelope), refused.code, str(refused))
        try:
            if parsed.method == TOOL_CALL_REQUEST:
                return (yield from self._request_steps(parsed, headers))
            return (yield from self._result_steps(parsed, headers))
        except _Malformed as refused:
            return _error(parsed.rpc_id, refused.code, str(refused))
        except CTRLRunError as exc:  # the store or the policy could not answer
            logger.warning("ACS %s %s: %s: %s", parsed.method, parsed.request_id, type(exc).__name__, exc)
            if parsed.method == TOOL_CALL_REQUEST:  # fail closed: a request nobody could decide is denied
                return _Answers(parsed, "").refused(exc)
            return _error(parsed.rpc_id, INTERNAL, f"ctrlrun could not record the result: {exc}")

    def _name(self, payload: Mapping[str, Any], *, partial: bool = False) -> tuple[str, str | None, str | None]:
        """The action name ``<prefix>.<provider>.<tool>[.<operation>]`` of a payload, with its provider
        and operation (``partial``: a result may leave the provider out)."""
        tool = payload.get("tool")
        if not isinstance(tool, Mapping):
            raise _Malformed("payload.tool must be an object naming the tool ({name, provider})")
        name, provider, operation = tool.get("name"), tool.get("provider"), payload.get("operation")
        if not isinstance(name, str) or not _SEGMENT.match(name):
            raise _Malformed(f"payload.tool.name must be 1 to 128 letters, digits, '_' or '-' (it is part of the "
                             f"action name), got {_shown(name)}")
        if not (provider is None and partial) and (not isinstance(provider, str) or not _SEGMENT.match(provider)):
            raise _Malformed(f"payload.tool.provider must be 1 to 128 letters, digits, '_' or '-' (the action is "
                             f"{self.prefix}.<provider>.<tool>), got {_shown(provider)}")
        if operation is not None and (not isinstance(operation, str) or not _SEGMENT.match(operation)):
            raise _Malformed(f"payload.operation must be 1 to 128 letters, digits, '_' or '-', got {_shown(operation)}")
        full = ".".join(part for part in (self.prefix, provider, name, operation) if part is not None)
        return full, provider, operation

    def _request_steps(self, envelope: _Envelope, headers: Mapping[str, str] | None) -> _Steps:
        payload, metadata = envelope.payload, envelope.metadata
        name, _, _ = self._name(payload)
        arguments = _flattened(payload.get("arguments"))
        asserted = _asserted(metadata)
        control = self.control
        answer = _Answers(envelope, name)
        policy = control.loaded_policy
        if policy is None:
            policy = yield _Read(control.load)
        principal = asserted
        if self.identity is not None:
            context = IdentityContext(action=name, environment=policy.environment, headers=headers or {},
                                      agent=asserted.agent, user=asserted.user)
            try:
                principal = answer_of(self.identity, name, (yield _Resolve(self.identity, context)))
            except IdentityError as exc:
                return answer.deny(f"{name}: {exc}", ["no_principal"])
            except Exception as exc:  # noqa: BLE001 - a provider's failure refuses the call
                return answer.deny(str(wrapped(self.identity, name, exc)), ["no_principal"])
            if principal is None:
                if policy.authority is not None:
                    return answer.deny(f"{name}: the request carries no identity the hook trusts", ["no_principal"])
                principal = asserted
        elif policy.authority is not None:
            return answer.deny(f"{name}: the policy has an 'authority:' section and the hook has no identity "
                               f"provider, so nobody it can trust acts", ["no_principal"])
        entry = policy.entry(name)
        presented = None
        if entry is not None:
            found = yield _Read(_resent_call, (control.store, policy, name, arguments, principal))
            if found is not None:
                kind, row = found
                if kind == "pending":
                    return answer.ask(self, row, principal)
                if kind in ("duplicate_effect", "ambiguous_effect"):
                    return answer.settled(kind, row)
                presented = row.approval_id
        hold = entry is not None and entry.effect is not None and not policy.observing
        continuation = CONTINUATION_PREFIX + envelope.request_id

        def executor() -> None:
            if hold:
                raise Suspended(continuation)
            return None  # nothing to hold: allowing it is the whole of its record (docs/acs.md)

        try:
            yield _Call(name, arguments, executor, principal, headers if control.identity is not None else None,
                        presented)
        except Suspended as held:
            return answer.allow(f"{name} is allowed; its effect key {held.effect_key!r} is held until "
                                f"steps/toolCallResult names request_id_ref {envelope.request_id!r}",
                                effect_key=held.effect_key, round=held.round, held=True)
        except ApprovalRequired as exc:
            row = yield _Read(control.store.get_approval, (exc.request_id,))
            return answer.ask(self, row, principal, request_id=exc.request_id)
        except CTRLRunError as exc:
            return answer.refused(exc)
        return answer.allow(f"{name} is allowed (it has no effect key to hold: nothing is reserved)", held=False)

    def _result_steps(self, envelope: _Envelope, headers: Mapping[str, str] | None = None) -> _Steps:
        payload = envelope.payload
        claimed, provider, operation = self._name(payload, partial=True)
        status = payload.get("exit_status")
        if status not in EXIT_STATUSES:
            raise _Malformed(f"payload.exit_status must be one of {', '.join(EXIT_STATUSES)}, got {_shown(status)}")
        outputs = payload.get("outputs")
        if not isinstance(outputs, list):
            raise _Malformed("payload.outputs must be a list (of {value, provenance})")
        reference = payload.get("request_id_ref")
        answer = _Answers(envelope, claimed)
        if reference is None:
            raise _Malformed("steps/toolCallResult names no request_id_ref, so it closes no call this hook "
                             "allowed", NOT_ANSWERED)
        _check_request_id(reference, "payload.request_id_ref")
        prefix, tool = self.prefix, payload["tool"]["name"]
        seen: dict[str, Any] = {}
        policy = self.control.loaded_policy
        if policy is None:
            policy = yield _Read(self.control.load)

        if self.identity is not None:  # the result is the held call's principal's to give, no one else's
            refused = yield from self._not_the_holder(envelope, claimed, policy, headers, reference)
            if refused is not None:
                return refused

        def invoke(action: Any) -> None:
            current = running_attempt.get()
            seen.update(name=action.name, effect_key=current[0] if current else None)
            parts = action.name[len(prefix) + 1:].split(".") if action.name.startswith(prefix + ".") else []
            if len(parts) < 2 or parts[1] != tool or (provider is not None and parts[0] != provider) \
                    or (operation is not None and parts[2:] != [operation]):
                raise _Unknown(f"the result names {claimed}, but request {reference!r} was {action.name}: "
                               f"what ran is unknown")
            if status == "success":
                return None
            if status == "blocked":
                raise NotExecuted(f"{action.name}: the platform reports the call blocked before it ran")
            entry = policy.entry(action.name)
            if status == "failure" and bool(((entry.mcp if entry is not None else None) or {})
                                            .get("not_executed_on_error")):
                raise NotExecuted(f"{action.name}: the tool reported a failure, and the policy says its errors "
                                  f"mean nothing ran (mcp: not_executed_on_error)")
            raise _Unknown(f"{action.name}: the platform reports {status}: the tool may have acted")

        result = "committed"
        try:
            yield _Resume(CONTINUATION_PREFIX + reference, invoke)
        except NotExecuted:
            result = "failed"
        except _Unknown:
            result = "ambiguous"
        except AuthorityDenied as exc:
            return answer.deny(f"{seen.get('name', claimed)}: {exc}; the call is recorded ambiguous",
                               [exc.reason], effect_key=seen.get("effect_key"), result="ambiguous")
        except InvalidArgument as exc:
            if seen:  # the held call was taken and its outcome could not be written
                return _error(envelope.rpc_id, INTERNAL, f"request_id_ref {reference!r}: {exc}")
            return _error(envelope.rpc_id, NOT_ANSWERED, f"request_id_ref {reference!r}: {exc}")
        return answer.allow(f"{seen.get('name', claimed)} is recorded {result} (exit_status {status})",
                            effect_key=seen.get("effect_key"), result=result)


    def _not_the_holder(self, envelope: _Envelope, claimed: str, policy: Any, headers: Mapping[str, str] | None,
                        reference: str) -> _Steps:
        """With an identity provider: ``-32001`` unless this result's credential names the principal the
        held call acts for (checked before the call is taken, so a refused result leaves it held)."""
        metadata = envelope.metadata if isinstance(envelope.metadata, Mapping) else {}
        agent = metadata.get("agent_id") if isinstance(metadata.get("agent_id"), str) else None
        context = IdentityContext(action=claimed, environment=policy.environment, headers=headers or {}, agent=agent)
        try:
            principal = answer_of(self.identity, claimed, (yield _Resolve(self.identity, context)))
        except Exception as exc:  # noqa: BLE001 - a rejected or failing credential closes nothing
            logger.warning("ACS result for %r refused: %s", reference, exc)
            principal = None
        held = yield _Read(self.control.store.held_principal, (CONTINUATION_PREFIX + reference,))
        if held is None:
            return None  # nothing held under it: the resume says so (-32001)
        if principal is None or (principal.agent, principal.user) != (held.agent, held.user):
            return _error(envelope.rpc_id, NOT_ANSWERED, f"request_id_ref {reference!r}: this result's credential "
                          "does not name the principal the held call acts for; the call stays held")
        return None


def _resent_call(store: Any, policy: Any, name: str, arguments: dict[str, Any], principal: Principal) -> Any:
    """One read before a request that needs approval: the pending request to answer ``ask`` with,
    the key that already ran (nobody is asked again), or the answered request to present; else None."""
    if principal.expires_at is not None and principal.expired(store.now()):
        return None  # the kernel refuses it (principal_expired) and records why
    bound = resent.bound(policy, name, arguments, principal)
    if bound is None:
        return None
    try:
        if policy.evaluate(name, canonical_arguments(arguments)).decision.value != "approve":
            return None
    except CTRLRunError:
        return None
    action_hash, key = bound
    found = resent.answered_for(store, action_hash)
    if found is None or found.status != "granted":
        settled = resent.settled(store, key)
        if settled is not None:
            kind, state = settled
            return kind, {"effect_key": key, "state": state}
    if found is None:
        return None
    return ("pending" if found.status == "pending" else "present"), found


# --------------------------------------------------------------------------- answers


class _Answers:
    """The response envelopes of one request (ACS ``response-envelope.json``)."""

    def __init__(self, envelope: _Envelope, name: str) -> None:
        self.envelope, self.name = envelope, name

    def _result(self, decision: str, reasoning: str, codes: list[str] | None = None, **data: Any) -> dict[str, Any]:
        result: dict[str, Any] = {"type": "final", "acs_version": ACS_VERSION, "request_id": self.envelope.request_id,
                                  "decision": decision, "reasoning": reasoning}
        if codes:
            result["reason_codes"] = list(dict.fromkeys(codes))
        data = {"action": self.name or None, **data}
        result["policy_data"] = {"ctrlrun": {k: v for k, v in data.items() if v is not None}}
        return {"jsonrpc": "2.0", "id": self.envelope.rpc_id, "result": result}

    def allow(self, reasoning: str, **data: Any) -> dict[str, Any]:
        return self._result("allow", reasoning, **data)

    def deny(self, reasoning: str, codes: list[str], **data: Any) -> dict[str, Any]:
        return self._result("deny", reasoning, codes, **data)

    def settled(self, kind: str, found: Mapping[str, Any]) -> dict[str, Any]:
        key, state = found["effect_key"], found["state"]
        if kind == "duplicate_effect":
            return self.deny(f"effect {key!r} is {state}: {self.name} will not be asked about again",
                             ["ctrlrun.duplicate_effect", state], effect_key=key, state=state)
        return self.deny(f"effect {key!r} is ambiguous: resolve it before {self.name} runs again",
                         ["ctrlrun.ambiguous_effect"], effect_key=key)

    def ask(self, hook: AcsControlHook, row: Any, principal: Principal, request_id: str | None = None) -> dict[str, Any]:
        approval = row.approval_id if row is not None else request_id
        who = principal.agent + (f" (for {principal.user})" if principal.user else "")
        question = (f"Allow {self.name} requested by {who}? A person answers ctrlrun approval request {approval} "
                    f"('ctrlrun approve {approval}' or the console); the agent then sends the identical call again.")
        context = {"ctrlrun_request_id": approval, "action": self.name, "agent": principal.agent}
        if principal.user:
            context["user"] = principal.user
        if row is not None:
            context.update(action_hash=row.action_hash, expires_at=evidence_time(row.expires_at))
        result = self._result("ask", f"{self.name} needs a person's approval ({approval})", ["approval_required"],
                              request_id=approval)
        result["result"]["ask_details"] = {
            "approver": {"type": "human", "id": hook.approver_id}, "question": question,
            "timeout_seconds": hook.ask_timeout_seconds, "context": context}
        return result

    def refused(self, exc: CTRLRunError) -> dict[str, Any]:
        """The kernel's refusal as a ``deny`` (its reason codes are §E5's)."""
        if isinstance(exc, DuplicateEffect):
            return self.deny(str(exc), ["ctrlrun.duplicate_effect", exc.state], effect_key=exc.effect_key,
                             state=exc.state)
        if isinstance(exc, AmbiguousEffect):
            return self.deny(str(exc), ["ctrlrun.ambiguous_effect"], effect_key=exc.effect_key)
        if isinstance(exc, IdentityError):
            return self.deny(str(exc), ["principal_expired" if "principal_expired" in str(exc) else "no_principal"])
        if isinstance(exc, ActionDenied):
            return self.deny(str(exc), [exc.reason], action_id=exc.action_id,
                             grant_id=getattr(exc, "grant_id", None))
        if isinstance(exc, ApprovalMismatch):
            return self.deny(str(exc), [exc.reason])
        reason = getattr(exc, "reason", None)
        if isinstance(reason, str) and reason:
            return self.deny(str(exc), [reason])
        code = re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()
        return self.deny(str(exc), [code])


def _error(rpc_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}


# --------------------------------------------------------------------------- reading an envelope


def _headers(headers: Any) -> Mapping[str, str] | None:
    if headers is None:
        return None
    if not isinstance(headers, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in headers.items()):
        raise InvalidArgument("AcsControlHook.handle(headers=...) must be a mapping of header name to text value")
    return {name.lower(): value for name, value in headers.items()}


def _rpc_id(envelope: Any) -> Any:
    """The id to echo on an error: the envelope's, when it is one JSON-RPC allows; else null."""
    if isinstance(envelope, Mapping):
        rpc_id = envelope.get("id")
        if isinstance(rpc_id, str) and len(rpc_id) <= 256 or isinstance(rpc_id, int) and not isinstance(rpc_id, bool) \
                and abs(rpc_id) < 2**63:
            return rpc_id
    return None


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return repr(value[:60] + ("..." if len(value) > 60 else ""))
    return "nothing" if value is None else f"a {_json_type(value)}"


def _json_type(value: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


def _check_shape(envelope: Any) -> None:
    """JSON values only, at most MAX_ENVELOPE_DEPTH containers deep and MAX_ENVELOPE_BYTES large;
    walked without recursion (a cycle or a stack bomb is refused, never followed)."""
    budget = MAX_ENVELOPE_BYTES
    stack: list[tuple[Any, int]] = [(envelope, 1)]
    while stack:
        value, depth = stack.pop()
        kind = type(value)
        if kind is dict or kind is list:
            if depth > MAX_ENVELOPE_DEPTH:
                raise _Malformed(f"the envelope nests more than {MAX_ENVELOPE_DEPTH} levels deep")
            items = value.items() if kind is dict else enumerate(value)
            for key, item in items:
                budget -= 2
                if kind is dict:
                    if type(key) is not str:
                        raise _Malformed("the envelope is not JSON: an object key is not a string")
                    budget -= len(key)
                if budget < 0:
                    break
                stack.append((item, depth + 1))
        elif kind is str:
            budget -= len(value)
        elif value is None or kind is bool or kind is int or kind is float:
            budget -= 1
        else:
            raise _Malformed(f"the envelope is not JSON: it holds a {kind.__name__}")
        if budget < 0:
            raise _Malformed(f"the envelope is larger than {MAX_ENVELOPE_BYTES} bytes")


def _check_request_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 200 or _FORBIDDEN.search(value):
        raise _Malformed(f"{where} must be a string of 1 to 200 printable characters (a UUID), got {_shown(value)}")
    return value


def _parse(envelope: Any) -> _Envelope:
    if not isinstance(envelope, dict):
        raise _Malformed(f"an ACS request envelope is a JSON object, not {_shown(envelope)}")
    _check_shape(envelope)
    if envelope.get("jsonrpc") != "2.0":
        raise _Malformed("the envelope's jsonrpc must be \"2.0\"")
    rpc_id = envelope.get("id")
    if rpc_id is None or rpc_id != _rpc_id(envelope):
        raise _Malformed("the envelope's id must be a string or an integer (a notification gets no answer)")
    method = envelope.get("method")
    if not isinstance(method, str):
        raise _Malformed("the envelope's method must be a string")
    if method not in (TOOL_CALL_REQUEST, TOOL_CALL_RESULT):
        raise _Malformed(f"{method[:80]!r} is not a checkpoint this hook answers (it answers {TOOL_CALL_REQUEST} "
                         f"and {TOOL_CALL_RESULT})", NOT_ANSWERED)
    params = envelope.get("params")
    if not isinstance(params, dict):
        raise _Malformed("the envelope's params must be an object")
    version = params.get("acs_version")
    if not isinstance(version, str) or not _VERSION.match(version):
        raise _Malformed(f"params.acs_version must be {ACS_VERSION} (ACS v0.1), got {_shown(version)}")
    request_id = _check_request_id(params.get("request_id"), "params.request_id")
    if not isinstance(params.get("timestamp"), str):
        raise _Malformed("params.timestamp must be a string (an ISO 8601 time)")
    metadata, payload = params.get("metadata"), params.get("payload")
    if not isinstance(metadata, dict):
        raise _Malformed("params.metadata must be an object ({agent_id, session_id, ...})")
    if not isinstance(payload, dict):
        raise _Malformed("params.payload must be an object")
    return _Envelope(rpc_id, method, request_id, metadata, payload)


def _asserted(metadata: Mapping[str, Any]) -> Principal:
    """The principal the envelope asserts: ``metadata.agent_id`` and ``user_context.user_id``."""
    agent = metadata.get("agent_id")
    if not isinstance(agent, str) or not agent.strip():
        raise _Malformed(f"params.metadata.agent_id must name the agent that acts, got {_shown(agent)}")
    context = metadata.get("user_context")
    if context is not None and not isinstance(context, Mapping):
        raise _Malformed("params.metadata.user_context must be an object ({user_id, roles})")
    user = (context or {}).get("user_id")
    if user is not None and (not isinstance(user, str) or not user.strip()):
        raise _Malformed(f"params.metadata.user_context.user_id must be a non-empty string, got {_shown(user)}")
    try:
        return Principal(agent=agent, user=user)
    except InvalidArgument as exc:
        raise _Malformed(f"params.metadata.agent_id / user_context.user_id: {exc}") from None


def _flattened(arguments: Any) -> dict[str, Any]:
    """``{name: {value, provenance}}`` as ``{name: value}``."""
    if not isinstance(arguments, dict):
        raise _Malformed(f"payload.arguments must be an object of argument names to {{value, provenance}}, got "
                         f"{_shown(arguments)}")
    flat: dict[str, Any] = {}
    for name, wrapper in arguments.items():
        if not name or not isinstance(wrapper, dict) or "value" not in wrapper:
            raise _Malformed(f"payload.arguments[{name[:60]!r}] must be an object {{value, provenance}}, got "
                             f"{_shown(wrapper) if not isinstance(wrapper, dict) else 'one without value'}")
        flat[name] = wrapper["value"]
    return flat
