"""ctrlrun for the OpenAI Agents SDK: a ``FunctionTool`` whose every call goes through ``Control.acall``.

``guarded_tool(control, "stripe.refund", refund)`` (or the decorator ``ctrlrun_tool(control,
"stripe.refund")``) turns a plain or ``async def`` function into an ``agents.FunctionTool``:

- the JSON schema is the SDK's own (``function_tool`` reads the signature and docstring);
- ``needs_approval`` asks ctrlrun's policy (``control.evaluate``); in observe mode it never interrupts
  (nobody is asked: the call runs and its receipt says ``observed``). In the approve band it creates the
  ctrlrun approval request for these exact arguments and returns True, so the SDK interrupts the run
  with a ``ToolApprovalItem``; ``request_for(tool, item)`` names the ctrlrun request (id and action
  hash) a person answers in the console or with ``ctrlrun approve``;
- every invocation runs inside ``Control.acall`` (policy, effect key, receipts), under
  ``ctrlrun.with_approval(request_id)`` when a request was made for that tool call: after
  ``RunState.approve()`` the tool runs only if ctrlrun holds a grant, by a person, for the exact
  action hash of the arguments being executed, once;
- a refusal (``ActionDenied``, ``ApprovalRequired``, ``ApprovalMismatch``, ``DuplicateEffect``,
  ``AmbiguousEffect``, a bad argument) comes back to the model as the tool's output, a string
  starting ``ctrlrun refused``: the SDK's idiom for a tool that did not act (``RunState.reject``
  does the same), so the run goes on and the model can tell the user. Nothing ran.
"""
from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

try:
    from agents import FunctionTool, RunContextWrapper, function_tool
    from agents.function_schema import function_schema
    from agents.items import ToolApprovalItem
except ImportError as missing:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "ctrlrun.adapters.openai_agents needs the OpenAI Agents SDK: pip install 'openai-agents>=0.24' "
        "(django-ctrlrun's openai-agents extra)"
    ) from missing

import ctrlrun
from ctrlrun.errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    DuplicateEffect,
    NotExecuted,
)
from ctrlrun.policy import Decision

__all__ = ["CtrlrunRequest", "guarded_tool", "ctrlrun_tool", "request_for", "refusal_text", "pause", "resume",
           "MAX_REQUESTS"]

REFUSED = "ctrlrun refused"

#: At most this many ``{call id: CtrlrunRequest}`` entries a tool keeps (the oldest go first): a
#: long-running process does not grow the map without limit. An evicted entry fails closed: its
#: resumed call is refused ("approval required"), never run without a grant.
MAX_REQUESTS = 1024


class _Requests(OrderedDict):
    """The tool's request map, bounded at ``limit`` entries (least recently set or read go first)."""

    def __init__(self, entries: Mapping[str, Any] | None = None, *, limit: int | None = None):
        super().__init__()
        self.limit = limit or MAX_REQUESTS
        for key, value in (entries or {}).items():
            self[key] = value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)


@dataclass(frozen=True)
class CtrlrunRequest:
    """The ctrlrun approval request behind one SDK interruption."""

    request_id: str
    action_hash: str
    call_id: str
    arguments: dict[str, Any]
    effect_key: str | None = None


def refusal_text(name: str, error: BaseException) -> str:
    """What the model reads when ctrlrun refused the call (nothing ran)."""
    if isinstance(error, ApprovalRequired):
        why = f"approval required: ctrlrun request {error.request_id} is waiting for a person"
    elif isinstance(error, ApprovalMismatch):
        why = f"approval does not authorise this call ({error.reason}): {error}"
    elif isinstance(error, ActionDenied):
        why = f"denied ({error.reason}): {error}"
    elif isinstance(error, DuplicateEffect):
        why = f"duplicate effect {error.effect_key} ({error.state}): it already happened or is happening"
    elif isinstance(error, AmbiguousEffect):
        why = f"effect {error.effect_key} is ambiguous: a person or a reconcile hook must resolve it first"
    else:
        why = f"{type(error).__name__}: {error}"
    return f"{REFUSED} {name}: {why}. The tool did not run."


#: What is refused before the tool runs, and so comes back to the model as the tool's output.
_REFUSALS = (ctrlrun.ActionDenied, ctrlrun.ApprovalRequired, ApprovalMismatch, DuplicateEffect, ctrlrun.AmbiguousEffect,
             ctrlrun.ApprovalTimeout, ctrlrun.InvalidArgument)


def guarded_tool(control: ctrlrun.Control, name: str, fn: Callable[..., Any], *, effect: str | None = None,
                 principal: ctrlrun.Principal | str | None = None, tool_name: str | None = None,
                 description: str | None = None, **options: Any) -> FunctionTool:
    """``fn`` as an ``agents.FunctionTool`` guarded by ``control`` as the action ``name``.

    ``tool_name`` is the name the model sees (default ``fn.__name__``: tool names cannot hold dots);
    ``effect``, ``principal`` and ``options`` (``resource``, ``lease``, ``reconcile``, ...) are
    ``Control.call``'s. The tool's ``ctrlrun_requests`` maps an SDK tool call id to the
    ``CtrlrunRequest`` made for it; give it ``requests=`` entries to resume in another process.
    """
    if not isinstance(control, ctrlrun.Control):
        raise ctrlrun.InvalidArgument(f"guarded_tool: control must be a ctrlrun.Control, not {type(control).__name__}")
    requests: _Requests = _Requests(options.pop("requests", None) or {})
    call_options = dict(options)
    if effect is not None:
        call_options["effect"] = effect
    schema = function_schema(fn, name_override=tool_name, description_override=description)
    shell = function_tool(fn, name_override=tool_name, description_override=description)

    def arguments_of(raw: Any) -> tuple[dict[str, Any], list[Any], dict[str, Any]]:
        """The validated arguments: the dict ctrlrun decides and hashes, and what ``fn`` is called with."""
        data = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(data, dict):
            raise ValueError(f"the arguments must be a JSON object, not {type(data).__name__}")
        parsed = schema.params_pydantic_model(**data)
        args, kwargs = schema.to_call_args(parsed)
        return parsed.model_dump(mode="json"), args, kwargs

    async def needs_approval(run_context: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        # Anything but a well-formed allow/deny verdict interrupts the run (fails closed): the
        # invocation still goes through Control.acall, which needs a ctrlrun grant to run.
        try:
            if control.read_policy().observing:
                # Observe mode asks nobody: the call runs, and its receipt says what enforcement would have done.
                return False
            arguments, _, _ = arguments_of(params)
            verdict = control.evaluate(name, arguments)
            decision = verdict.decision
        except Exception:
            return True
        if decision is Decision.ALLOW or decision is Decision.DENY:
            return False  # allow runs; deny comes back to the model as the tool's refusal
        if decision is not Decision.APPROVE:
            return True

        def never() -> None:
            raise NotExecuted("ctrlrun: the approval step never runs the tool")

        try:
            await control.acall(name, arguments, never, principal=principal, **call_options)
        except ApprovalRequired as asked:
            approval = await control.aread(control.store.get_approval, asked.request_id)
            requests[call_id] = CtrlrunRequest(asked.request_id, approval.action_hash, call_id, arguments,
                                               approval.effect_key)
        except Exception:
            pass  # refused or broken: the interruption stands, and the invocation refuses again
        return True

    async def on_invoke_tool(ctx: Any, raw_arguments: str) -> Any:
        call_id = getattr(ctx, "tool_call_id", None)
        try:
            arguments, args, kwargs = arguments_of(raw_arguments)
        except Exception as invalid:
            return f"{REFUSED} {name}: invalid arguments ({invalid}). The tool did not run."
        if schema.takes_context:
            args = [ctx, *args]
        if asyncio.iscoroutinefunction(fn):
            async def executor() -> Any:
                return await fn(*args, **kwargs)
        else:
            def executor() -> Any:
                return fn(*args, **kwargs)
        request = requests.get(call_id) if call_id is not None else None
        try:
            if request is None:
                return await control.acall(name, arguments, executor, principal=principal, **call_options)
            with ctrlrun.with_approval(request.request_id):
                return await control.acall(name, arguments, executor, principal=principal, **call_options)
        except ApprovalMismatch as refused:
            if refused.reason == "consumed" and request is not None and request.effect_key:
                # A resumed run repeating the call its approval already ran: say it is a duplicate.
                effect = await control.aread(control.store.get_effect, request.effect_key)
                if effect is not None and effect.state in ("committed", "reserved", "executing"):
                    duplicate = DuplicateEffect(state=effect.state, effect_key=request.effect_key)
                    return refusal_text(name, duplicate) + f" (approval {request.request_id} was used by it)"
            return refusal_text(name, refused)
        except _REFUSALS as refused:
            # Refused before the tool ran. Anything else - StoreUnavailable after the tool ran (its
            # outcome could not be recorded) - is not a refusal and is raised, never called "did not run".
            return refusal_text(name, refused)

    tool = FunctionTool(
        name=shell.name,
        description=shell.description,
        params_json_schema=shell.params_json_schema,
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=shell.strict_json_schema,
        needs_approval=needs_approval,
    )
    tool.ctrlrun_requests = requests  # type: ignore[attr-defined]
    tool.ctrlrun_action = name  # type: ignore[attr-defined]
    return tool


def ctrlrun_tool(control: ctrlrun.Control, name: str, **options: Any) -> Callable[[Callable[..., Any]], FunctionTool]:
    """Decorator form of ``guarded_tool``: ``@ctrlrun_tool(control, "stripe.refund")``."""

    def wrap(fn: Callable[..., Any]) -> FunctionTool:
        return guarded_tool(control, name, fn, **options)

    return wrap


def request_for(tool: FunctionTool, item: ToolApprovalItem | str) -> CtrlrunRequest | None:
    """The ctrlrun request behind an SDK interruption (a ``ToolApprovalItem`` or its call id)."""
    requests: Mapping[str, CtrlrunRequest] = getattr(tool, "ctrlrun_requests", {})
    if isinstance(item, str):
        return requests.get(item)
    raw = item.raw_item
    call_id = raw.get("call_id") if isinstance(raw, dict) else getattr(raw, "call_id", None)
    return requests.get(call_id) if call_id else None


# --------------------------------------------------------------------------- resumption


def pause(result: Any, tool: FunctionTool, *, resume_with: str) -> Any:
    """Store the run ``result`` stopped at (``result.interruptions``) beside its ctrlrun request
    (``ctrlrun.resumption.pause``): the ``RunState`` JSON and the tool's ``CtrlrunRequest``, so a
    resumer in another process can rebuild it with :func:`resume`. One ctrlrun request per paused run."""
    from ctrlrun import resumption

    interruptions = list(getattr(result, "interruptions", None) or [])
    found = [request for request in (request_for(tool, item) for item in interruptions) if request is not None]
    if len(interruptions) != 1 or len(found) != 1:
        raise ctrlrun.InvalidArgument(
            f"pause: the run stopped at {len(interruptions)} interruption(s), {len(found)} of them ctrlrun "
            "requests of this tool; a paused run is stored for exactly one ctrlrun request")
    (request,) = found
    state = {"run_state": result.to_state().to_json(), "requests": {request.call_id: asdict(request)}}
    return resumption.pause(request.request_id, "openai-agents", state, resume_with=resume_with)


async def resume(paused: Any, answer: Any, agent: Any, tool: FunctionTool, **run_options: Any) -> Any:
    """Continue a paused run (a ``PausedRunView``) after the person's ``answer``: the run's
    interruption approved at the SDK level if the person granted it (ctrlrun still checks the grant
    against the executed arguments), rejected with the answer's message otherwise (denied, expired).
    ``agent`` and ``tool`` are the application's, built as when the run started; ``run_options`` go
    to ``Runner.run``. Returns the ``RunResult``."""
    from agents import Runner, RunState

    try:
        data = json.loads(paused.state)
        run_state, stored = data["run_state"], data["requests"]
        requests = {call_id: CtrlrunRequest(**fields) for call_id, fields in stored.items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise ctrlrun.InvalidArgument(f"paused run {paused.id}: the stored state does not parse as an OpenAI "
                                      f"Agents run ({type(exc).__name__}: {exc})") from None
    for call_id, request in requests.items():
        tool.ctrlrun_requests[call_id] = request  # type: ignore[attr-defined]
    try:
        state = await RunState.from_json(agent, run_state)
    except Exception as exc:  # noqa: BLE001 - the SDK's own parse errors, as one line
        raise ctrlrun.InvalidArgument(f"paused run {paused.id}: the SDK cannot read the stored RunState "
                                      f"({type(exc).__name__}: {' '.join(str(exc).split())})") from None
    for item in state.get_interruptions():
        if answer.approved:
            state.approve(item)
        else:
            state.reject(item, rejection_message=answer.message())
    return await Runner.run(agent, state, **run_options)
