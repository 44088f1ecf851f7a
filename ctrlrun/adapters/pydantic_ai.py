"""Pydantic AI: ctrlrun enforced at every tool call of a toolset.

``CtrlrunToolset(wrapped, control)`` is a ``WrapperToolset``: each call of a tool of ``wrapped`` goes
through ``control.acall`` (policy, approval, effect key, receipts), and only ctrlrun's consent runs it.

- allow: the tool runs (once per effect key); its value is the tool's result.
- approve: Pydantic AI's ``ApprovalRequired`` is raised with metadata ``{"ctrlrun_request_id": ...,
  "ctrlrun_action_hash": ...}``, so the run ends with ``DeferredToolRequests``. When the run is
  resumed with ``DeferredToolResults(approvals={tool_call_id: True})`` the call runs only under
  ``ctrlrun.with_approval(request_id)``: ctrlrun runs it only if a person granted that exact action
  hash, once. ``ToolApproved(override_args=...)`` with other arguments is refused (``ApprovalMismatch``).
  A request nobody answered yet defers the call again.
- deny, and every refusal (``ActionDenied``, ``ApprovalMismatch``, ``DuplicateEffect``,
  ``AmbiguousEffect``, a resumed call with no known request): the tool does not run and the model
  gets the refusal as the tool's result (a string starting ``ctrlrun refused``), so the agent can
  say so instead of crashing the run. Override ``refusal(...)`` to change the text.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

try:
    from pydantic_ai.exceptions import ApprovalRequired as _FrameworkApprovalRequired
    from pydantic_ai.exceptions import CallDeferred, ModelRetry
    from pydantic_ai.messages import ModelResponse, ToolCallPart
    from pydantic_ai.toolsets import AbstractToolset, WrapperToolset
except ImportError as missing:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "ctrlrun.adapters.pydantic_ai needs Pydantic AI: pip install 'pydantic-ai-slim>=2.68' "
        "(django-ctrlrun's pydantic-ai extra)"
    ) from missing

import ctrlrun
from ctrlrun.canonical import canonical_arguments, canonical_bytes
from ctrlrun.errors import CTRLRunError

__all__ = ["CtrlrunToolset", "REQUEST_ID", "ACTION_HASH", "MAX_PENDING", "pause", "resume_options"]

#: At most this many deferred calls a toolset remembers (``toolset.pending``; the oldest go first).
#: A call leaves the map once it ran or was refused for good; an evicted one is still resumable
#: through the ``DeferredToolResults.metadata`` pointer, and ctrlrun checks its grant either way.
MAX_PENDING = 1024

#: The keys of the metadata of a deferred call (``DeferredToolRequests.metadata[tool_call_id]``).
REQUEST_ID = "ctrlrun_request_id"
ACTION_HASH = "ctrlrun_action_hash"

#: What a tool raises to steer Pydantic AI (retry with other arguments, defer the call), not an outcome.
_FLOW = (ModelRetry, CallDeferred, _FrameworkApprovalRequired)
_REFUSALS = (ctrlrun.ActionDenied, ctrlrun.ApprovalMismatch, ctrlrun.DuplicateEffect, ctrlrun.AmbiguousEffect)


@dataclass(frozen=True)
class _Pending:
    request_id: str
    action_hash: str
    arguments: str | None  # canonical JSON of the arguments the request was made for (None: unknown)


def _final(refusal: CTRLRunError) -> bool:
    """Can the request of a refused resumed call never run it? (Other arguments, or a request not
    answered yet, leave it usable for the call the person read.)"""
    return not (isinstance(refusal, ctrlrun.ApprovalMismatch) and refusal.reason in ("mismatch", "pending"))


#: What arguments that cannot be canonical compare as: never equal to any canonical text.
_UNREADABLE = "\x00unreadable"


def _canonical(arguments: Mapping[str, Any]) -> str:
    """The arguments in ctrlrun's canonical form (the bytes the action hash is taken over)."""
    try:
        return canonical_bytes(canonical_arguments(arguments)).decode("utf-8")
    except CTRLRunError:
        return _UNREADABLE


@dataclass
class CtrlrunToolset(WrapperToolset):
    """Guard every tool call of ``wrapped`` with ``control`` (a ``ctrlrun.Control``; default: the
    process-wide one).

    ``effects``: ``{tool_name: "refund:{payment_id}"}``, an effect key template per tool (else the
    policy entry's). ``actions``: ``{tool_name: "stripe.refund"}``, the policy's action name for a tool
    (default: the tool's name). ``principal``: a ``ctrlrun.Principal``, an agent name, or a function of
    the ``RunContext`` returning one; ``None`` acts for ``ctrlrun.context()``.
    """

    control: Any = None
    effects: Mapping[str, str] = field(default_factory=dict, kw_only=True)
    actions: Mapping[str, str] = field(default_factory=dict, kw_only=True)
    principal: Any = field(default=None, kw_only=True)
    #: ``{tool_call_id: request}`` of calls deferred for approval in this process.
    pending: dict[str, _Pending] = field(default_factory=dict, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        if self.control is None:
            self.control = ctrlrun.Control()
        if not isinstance(self.wrapped, AbstractToolset):
            raise ctrlrun.InvalidArgument("CtrlrunToolset wraps a Pydantic AI toolset (e.g. FunctionToolset([...]))")
        for option in ("effects", "actions"):
            value = getattr(self, option)
            if not isinstance(value, Mapping) or not all(isinstance(v, str) and v for v in value.values()):
                raise ctrlrun.InvalidArgument(f"CtrlrunToolset({option}=...) must map tool names to strings")

    # -- the guard ------------------------------------------------------------------------------------

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: Any, tool: Any) -> Any:
        action = self.actions.get(name, name)
        options: dict[str, Any] = {}
        if name in self.effects:
            options["effect"] = self.effects[name]
        principal = self.principal(ctx) if callable(self.principal) else self.principal

        async def executor() -> Any:
            try:
                return await self.wrapped.call_tool(name, tool_args, ctx, tool)
            except _FLOW as flow:
                # The tool asked Pydantic AI to retry or defer it: that is not an outcome. Recorded as
                # not executed (the key stays free for the call the model makes next), re-raised below.
                raise ctrlrun.NotExecuted(f"{name}: the tool raised {type(flow).__name__} (Pydantic AI's control "
                                          f"flow), recorded as not executed") from flow

        call_id = ctx.tool_call_id
        try:
            if ctx.tool_call_approved:
                pending = self._pending_for(ctx, name)
                if pending is None:
                    return self.refusal(action, ctrlrun.ApprovalMismatch(
                        f"{action}: approved in Pydantic AI, but no ctrlrun approval request is known for tool call "
                        f"{call_id!r}; nothing ran", reason="no_request"))
                if pending.arguments is not None and pending.arguments != _canonical(tool_args):
                    return self.refusal(action, ctrlrun.ApprovalMismatch(
                        f"{action}: the approval {pending.request_id} was asked for other arguments than these; "
                        "nothing ran", reason="mismatch", approval_id=pending.request_id))
                try:
                    with ctrlrun.with_approval(pending.request_id):
                        result = await self.control.acall(action, tool_args, executor, principal=principal, **options)
                except ctrlrun.ApprovalMismatch as error:
                    if error.reason == "pending":  # nobody answered in ctrlrun yet: ask again, same request
                        raise self._defer(pending) from None
                    raise
                self.pending.pop(call_id, None)
                return result
            return await self.control.acall(action, tool_args, executor, principal=principal, **options)
        except ctrlrun.ApprovalRequired as asked:
            approval = await self.control.aread(self.control.store.get_approval, asked.request_id)
            if approval is None:  # pragma: no cover - ctrlrun just wrote it
                return self.refusal(action, ctrlrun.ApprovalMismatch(
                    f"{action}: approval request {asked.request_id} not found", reason="unknown"))
            pending = _Pending(asked.request_id, approval.action_hash, _canonical(tool_args))
            if call_id:
                self._remember(call_id, pending)
            raise self._defer(pending) from None
        except ctrlrun.NotExecuted as not_run:
            if isinstance(not_run.__cause__, _FLOW):
                raise not_run.__cause__ from None
            raise
        except _REFUSALS as refused:
            if ctx.tool_call_approved and call_id and _final(refused):
                self.pending.pop(call_id, None)  # refused for good: this request can never run it
            return self.refusal(action, refused)

    def _remember(self, call_id: str, pending: _Pending) -> None:
        self.pending.pop(call_id, None)
        self.pending[call_id] = pending
        while len(self.pending) > MAX_PENDING:
            self.pending.pop(next(iter(self.pending)))

    def refusal(self, action: str, error: CTRLRunError) -> str:
        """What the model reads as the tool's result when ctrlrun refused the call (nothing ran)."""
        kind = type(error).__name__
        reason = getattr(error, "reason", None) or getattr(error, "state", None) or ""
        return f"ctrlrun refused {action} ({kind}{': ' + reason if reason else ''}): {error}"

    # -- helpers --------------------------------------------------------------------------------------

    @staticmethod
    def _defer(pending: _Pending) -> _FrameworkApprovalRequired:
        return _FrameworkApprovalRequired(metadata={REQUEST_ID: pending.request_id, ACTION_HASH: pending.action_hash})

    def _pending_for(self, ctx: Any, name: str) -> _Pending | None:
        """The request a resumed call presents: this toolset's own record of the deferred call, else
        the ``ctrlrun_request_id`` the caller passed back in ``DeferredToolResults.metadata`` (another
        process resuming). In the second case the arguments are compared with the model's call in the
        message history; either way ctrlrun itself checks the grant against the executed arguments."""
        known = self.pending.get(ctx.tool_call_id)
        if known is not None:
            return known
        metadata = ctx.tool_call_metadata
        request_id = metadata.get(REQUEST_ID) if isinstance(metadata, Mapping) else None
        if not isinstance(request_id, str) or not request_id.startswith("apr_"):
            return None
        original = _model_arguments(ctx, name)
        return _Pending(request_id, str(metadata.get(ACTION_HASH, "")), original)


def _model_arguments(ctx: Any, name: str) -> str | None:
    """The canonical arguments the model gave this call, from the run's messages (None if not found)."""
    for message in reversed(getattr(ctx, "messages", None) or []):
        if not isinstance(message, ModelResponse):
            continue
        for part in message.parts:
            if isinstance(part, ToolCallPart) and part.tool_call_id == ctx.tool_call_id and part.tool_name == name:
                try:
                    return _canonical(part.args_as_dict())
                except Exception:  # noqa: BLE001 - malformed args: cannot compare, so refuse
                    return _UNREADABLE
    return None


# --------------------------------------------------------------------------- resumption


def pause(result: Any, *, resume_with: str) -> Any:
    """Store the run ``result`` ended deferred on (``DeferredToolRequests`` with one ctrlrun
    request) beside that request (``ctrlrun.resumption.pause``): the message history as JSON and the
    deferred call's id and metadata, so a resumer in another process can continue it with
    ``agent.run_sync(**resume_options(paused, answer))``."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter
    from pydantic_ai.tools import DeferredToolRequests

    from ctrlrun import resumption

    output = getattr(result, "output", None)
    if not isinstance(output, DeferredToolRequests):
        raise ctrlrun.InvalidArgument("pause: the run did not end deferred (its output is not DeferredToolRequests)")
    ours = [call for call in output.approvals
            if isinstance(output.metadata.get(call.tool_call_id), Mapping)
            and str(output.metadata[call.tool_call_id].get(REQUEST_ID, "")).startswith("apr_")]
    if len(ours) != 1 or len(output.approvals) != 1 or output.calls:
        raise ctrlrun.InvalidArgument(f"pause: the run deferred {len(output.approvals) + len(output.calls)} call(s), "
                                      f"{len(ours)} of them ctrlrun requests; a paused run is stored for exactly one")
    (call,) = ours
    metadata = dict(output.metadata[call.tool_call_id])
    state = {"messages": json.loads(ModelMessagesTypeAdapter.dump_json(result.all_messages())),
             "tool_call_id": call.tool_call_id, "metadata": metadata}
    return resumption.pause(metadata[REQUEST_ID], "pydantic-ai", state, resume_with=resume_with)


def resume_options(paused: Any, answer: Any) -> dict[str, Any]:
    """``message_history`` and ``deferred_tool_results`` that continue a paused run after the
    person's ``answer``: granted, the call is approved at Pydantic AI's level (ctrlrun still checks
    its grant against the executed arguments); denied or expired, it is denied with the answer's
    message, which the model reads."""
    from pydantic_ai.messages import ModelMessagesTypeAdapter
    from pydantic_ai.tools import DeferredToolResults, ToolDenied

    try:
        data = json.loads(paused.state)
        call_id, metadata = data["tool_call_id"], data["metadata"]
        history = ModelMessagesTypeAdapter.validate_python(data["messages"])
        if not isinstance(call_id, str) or not isinstance(metadata, Mapping):
            raise ValueError("tool_call_id or metadata of the wrong type")
    except Exception as exc:  # noqa: BLE001 - pydantic's validation errors too, as one line
        raise ctrlrun.InvalidArgument(f"paused run {paused.id}: the stored state does not parse as a Pydantic AI "
                                      f"run ({type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from None
    decision: Any = True if answer.approved else ToolDenied(answer.message())
    return {"message_history": history,
            "deferred_tool_results": DeferredToolResults(approvals={call_id: decision},
                                                         metadata={call_id: dict(metadata)})}
