"""ctrlrun for LangChain v1 / LangGraph: every tool call enforced where it becomes an effect.

- :class:`CtrlrunMiddleware` - an ``AgentMiddleware`` for ``langchain.agents.create_agent``; its
  ``wrap_tool_call`` / ``awrap_tool_call`` run each tool call through ``Control.call`` / ``acall``.
- :func:`guard_tool` - wraps a ``BaseTool`` given to LangGraph's ``ToolNode`` (or to any graph) the
  same way.
- :func:`resume` - the ``Command(resume=...)`` that continues a paused run once a person answered
  the ctrlrun request (in the console, ``ctrlrun approve`` or ``store.answer_approval``).
- :func:`pause` / :func:`resume_run` - store a paused run's thread beside its ctrlrun request and
  continue it from another process (``ctrlrun.resumption``; the checkpointer is the application's).

The approve band pauses the run with LangGraph's ``interrupt()``; the payload (:func:`payload`
keys: ``ctrlrun_request_id``, ``action_hash``, ``action``, ``tool``, ``arguments``,
``tool_call_id``) names the ctrlrun request a person must answer. On resume the call runs only
inside ``ctrlrun.with_approval(request_id)``: ctrlrun itself checks that a person granted that
request for the exact hash of these arguments, once. A resume value that merely says "approved"
runs nothing. Refusals (``ActionDenied``, ``ApprovalMismatch``, ``DuplicateEffect``,
``AmbiguousEffect``, an expired request, a missing or malformed resume value) come back to the
model as an error ``ToolMessage`` carrying the reason - LangChain's idiom for "the tool did not
do it", which lets the model tell the user - not as a crash.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

try:
    from langchain.agents.middleware import AgentMiddleware
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import BaseTool, StructuredTool, ToolException
    from langgraph.errors import GraphBubbleUp, GraphInterrupt
    from langgraph.types import Command, Interrupt, interrupt
    from pydantic import BaseModel, ValidationError
except ImportError as missing:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"ctrlrun.adapters.langchain needs LangChain v1 and LangGraph ({missing}): "
        "pip install 'langchain>=1.5' (django-ctrlrun's langchain extra)"
    ) from missing

import ctrlrun
from ctrlrun import Decision, messages

__all__ = ["CtrlrunMiddleware", "guard_tool", "resume", "REFUSALS", "PAYLOAD_KIND", "pause", "config_of", "resume_run"]

#: ctrlrun's refusals of one call: each comes back to the model as the tool's (error) result.
REFUSALS = (ctrlrun.ActionDenied, ctrlrun.ApprovalMismatch, ctrlrun.DuplicateEffect, ctrlrun.AmbiguousEffect,
            ctrlrun.ApprovalTimeout, ctrlrun.ApprovalRequired, ctrlrun.InvalidArgument)

#: The ``kind`` of every interrupt payload this adapter raises.
PAYLOAD_KIND = "ctrlrun.approval"


class _Refused(Exception):
    """A call ctrlrun (or a missing/malformed decision) refused; ``text`` is for the model."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


class _ToolError(Exception):
    """The tool came back with an error ToolMessage: recorded as ctrlrun records any exception of
    a function (ambiguous - part of it may have happened); the message itself goes to the model."""

    def __init__(self, message: Any):
        super().__init__(getattr(message, "content", repr(message)))
        self.message = message


def resume(request_id: str, *, approved: bool = True, message: str | None = None) -> Command:
    """The ``Command`` that resumes a run paused on ctrlrun request ``request_id``.

    ``approved=False`` tells the adapter the framework side rejected it: nothing runs, and the model
    reads ``message`` (default: that the call was rejected). ``True`` is no permission by itself -
    the call then runs only if a person granted that request in ctrlrun, for these exact arguments."""
    value: dict[str, Any] = {"ctrlrun_request_id": request_id, "approved": bool(approved)}
    if message:
        value["message"] = str(message)
    return Command(resume=value)


def _refusal_text(tool: str, exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    what = type(exc).__name__
    detail = f"{exc}" if not reason or reason in str(exc) else f"{reason}: {exc}"
    return f"ctrlrun refused {tool} ({what}): {detail}. The tool did not run."


def _read_resume(tool: str, answer: Any) -> str:
    """The request id a resume value names; a missing or malformed one refuses (fails closed)."""
    if isinstance(answer, str) and answer.startswith("apr_"):
        return answer
    if isinstance(answer, Mapping):
        approved = answer.get("approved", True)
        request_id = answer.get("ctrlrun_request_id", answer.get("request_id"))
        if approved is False:
            told = answer.get("message")
            raise _Refused(f"{tool}: {told}" if isinstance(told, str) and told
                           else f"{tool} was rejected when the run was resumed; the tool did not run.")
        if approved is True and isinstance(request_id, str) and request_id:
            return request_id
    raise _Refused(
        f"{tool} was resumed without a usable decision ({answer!r}); resume with "
        "ctrlrun.adapters.langchain.resume(request_id) after a person answered the ctrlrun request. "
        "The tool did not run."
    )


def _request(control: Any, request_id: str) -> Any:
    return control.read(control.store.get_approval, request_id)


async def _arequest(control: Any, request_id: str) -> Any:
    return await control.aread(control.store.get_approval, request_id)


def _payload(request: Any, tool: str, action: str, arguments: Mapping[str, Any], tool_call_id: str | None,
             request_id: str) -> dict[str, Any]:
    return {
        "kind": PAYLOAD_KIND,
        "ctrlrun_request_id": request_id,
        "action_hash": request.action_hash if request is not None else None,
        "action": action,
        "tool": tool,
        "arguments": dict(arguments),
        "tool_call_id": tool_call_id,
        "message": f"{action} needs a person's approval: answer ctrlrun request {request_id} "
                   f"(console or {messages.command(f'approve {request_id}')}), then resume with "
                   f"resume('{request_id}')",
    }


class _Guard:
    """What the middleware and the wrapped tools share: one tool call through one Control."""

    def __init__(self, control: Any, *, effects: Mapping[str, str] | None, actions: Mapping[str, str] | None,
                 principal: Any):
        if control is None or not hasattr(control, "call"):
            raise TypeError("the ctrlrun adapter needs a ctrlrun.Control (e.g. ctrlrun.Control.from_file(...))")
        self.control = control
        self.effects = dict(effects or {})
        self.actions = dict(actions or {})
        self.principal = principal

    def _options(self, tool: str) -> dict[str, Any]:
        options: dict[str, Any] = {"principal": self.principal}
        if tool in self.effects:
            options["effect"] = self.effects[tool]
        return options

    def _arguments(self, tool: str, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, Mapping):
            raise _Refused(f"{tool}: the tool call's arguments are not an object ({arguments!r}); the tool did not run.")
        return dict(arguments)

    def _needs_approval(self, action: str, arguments: Mapping[str, Any]) -> bool:
        try:
            return self.control.evaluate(action, arguments).decision is Decision.APPROVE
        except ctrlrun.CTRLRunError:
            return False  # control.call decides (and records) it

    def run(self, tool: str, arguments: Any, tool_call_id: str | None, executor: Callable[[], Any]) -> Any:
        """Run ``executor`` under ctrlrun; ``_Refused`` carries a refusal for the model."""
        arguments = self._arguments(tool, arguments)
        action = self.actions.get(tool, tool)
        options = self._options(tool)
        try:
            if not self._needs_approval(action, arguments):
                return self.control.call(action, arguments, executor, **options)
            try:
                answer = _probe(tool, arguments)
            except GraphInterrupt as paused:
                # Not resumed: ask ctrlrun (it records the request), then pause carrying it.
                try:
                    return self.control.call(action, arguments, executor, **options)
                except ctrlrun.ApprovalRequired as asked:
                    raise _pause(paused, _payload(_request(self.control, asked.request_id), tool, action, arguments, tool_call_id,
                                               asked.request_id)) from None
            request_id = _read_resume(tool, answer)
            with ctrlrun.with_approval(request_id):
                return self.control.call(action, arguments, executor, **options)
        except ctrlrun.CTRLRunError as error:
            _for_the_model(tool, error)
            raise

    async def arun(self, tool: str, arguments: Any, tool_call_id: str | None,
                   executor: Callable[[], Any]) -> Any:
        arguments = self._arguments(tool, arguments)
        action = self.actions.get(tool, tool)
        options = self._options(tool)
        try:
            if not self._needs_approval(action, arguments):
                return await self.control.acall(action, arguments, executor, **options)
            try:
                answer = _probe(tool, arguments)
            except GraphInterrupt as paused:
                try:
                    return await self.control.acall(action, arguments, executor, **options)
                except ctrlrun.ApprovalRequired as asked:
                    request = await _arequest(self.control, asked.request_id)
                    body = _payload(request, tool, action, arguments, tool_call_id, asked.request_id)
                    raise _pause(paused, body) from None
            request_id = _read_resume(tool, answer)
            with ctrlrun.with_approval(request_id):
                return await self.control.acall(action, arguments, executor, **options)
        except ctrlrun.CTRLRunError as error:
            _for_the_model(tool, error)
            raise


def _for_the_model(tool: str, error: ctrlrun.CTRLRunError) -> None:
    """Raise what a ctrlrun error from a tool call becomes: the tool's own ``interrupt()`` again
    (LangGraph pauses the run), or a refusal for the model. Anything else - the store unreachable,
    say - returns, and the caller re-raises it as it is."""
    if isinstance(error, ctrlrun.NotExecuted) and isinstance(error.__cause__, GraphBubbleUp):
        raise error.__cause__ from None
    if isinstance(error, REFUSALS):
        raise _Refused(_refusal_text(tool, error)) from error


def _probe(tool: str, arguments: Mapping[str, Any]) -> Any:
    """The resume value of this call's interrupt, if the run was resumed; else GraphInterrupt."""
    try:
        return interrupt({"kind": PAYLOAD_KIND, "tool": tool, "arguments": dict(arguments)})
    except RuntimeError as outside:  # no LangGraph run around the call: nobody could resume it
        raise _Refused(f"{tool} needs a person's approval, which pauses a LangGraph run (with a checkpointer); "
                       f"called outside one ({outside}), the tool did not run.") from None


def _pause(paused: GraphInterrupt, payload: dict[str, Any]) -> GraphInterrupt:
    """The same interrupt (same id, so ``Command(resume=...)`` finds it) carrying the ctrlrun request."""
    (first, *rest) = paused.args[0]
    return GraphInterrupt((Interrupt(value=payload, id=first.id), *rest))


def _as_the_tool_runs_them(tool: Any, name: str, arguments: Any) -> Any:
    """``arguments`` as ``tool`` will run them: validated and coerced by the tool's own schema, its
    defaults filled in. ctrlrun must decide on, hash, and show the approver exactly what runs - a
    model's ``"900000"`` that the tool coerces to ``900000`` is 900000 to the policy too. Arguments
    the tool refuses are refused here, before ctrlrun records anything (nothing ran). A tool with a
    JSON-schema (not pydantic) schema, or no tool, gets the arguments as given."""
    schema = getattr(tool, "tool_call_schema", None) if tool is not None else None
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)) or not isinstance(arguments, Mapping):
        return arguments
    try:
        return schema.model_validate(dict(arguments)).model_dump(mode="json")
    except ValidationError as invalid:
        first = invalid.errors()[0] if invalid.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ())) or "arguments"
        raise _Refused(f"{name}: the arguments do not fit the tool ({where}: {first.get('msg', invalid)}); "
                       f"the tool did not run.") from None


def _as_the_tool_gets_it(request: Any) -> Any:
    """The middleware's tool call, its arguments as the tool will run them (the handler gets those)."""
    call = request.tool_call
    arguments = _as_the_tool_runs_them(getattr(request, "tool", None), call.get("name"), call.get("args"))
    return request if arguments is call.get("args") else request.override(tool_call={**call, "args": arguments})


@contextlib.contextmanager
def _steering(tool: str | None) -> Iterator[None]:
    """A tool that calls LangGraph's ``interrupt()`` itself pauses the run (``GraphBubbleUp``): not an
    outcome. It is recorded as not executed - the node re-runs the tool from its start on resume, as
    LangGraph does for any interrupt - and re-raised to LangGraph by the guard."""
    try:
        yield
    except GraphBubbleUp as pausing:
        raise ctrlrun.NotExecuted(f"{tool}: the tool paused the run ({type(pausing).__name__}); recorded as not "
                                  f"executed, it runs again from its start when the run resumes") from pausing


def _record_of(message: Any) -> Any:
    """What the receipt keeps of a tool's result (the ToolMessage's content)."""
    if isinstance(message, ToolMessage):
        if message.status == "error":
            raise _ToolError(message)
        return {"tool_call_id": message.tool_call_id, "content": message.content}
    return repr(message)


class CtrlrunMiddleware(AgentMiddleware):
    """``create_agent(model, tools, middleware=[CtrlrunMiddleware(control, ...)])``: every tool
    call of the agent goes through ``control.call`` (sync) or ``control.acall`` (async).

    ``effects`` maps a tool name to an effect-key template (``{"refund": "refund:{payment_id}"}``;
    the policy's own ``effect:`` applies otherwise); ``actions`` maps a tool name to the policy's
    action name (default: the tool's name); ``principal`` is who acts (a ``ctrlrun.Principal`` or
    an agent name; default ``ctrlrun.context()``).
    """

    def __init__(self, control: Any, *, effects: Mapping[str, str] | None = None,
                 actions: Mapping[str, str] | None = None, principal: Any = None):
        super().__init__()
        self._guard = _Guard(control, effects=effects, actions=actions, principal=principal)

    @staticmethod
    def _refused(request: Any, text: str) -> ToolMessage:
        call = request.tool_call
        return ToolMessage(content=text, tool_call_id=call.get("id") or "", name=call.get("name"), status="error")

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        box: list[Any] = []
        try:
            request = _as_the_tool_gets_it(request)
            call = request.tool_call

            def executor() -> Any:
                with _steering(call.get("name")):
                    box.append(handler(request))
                return _record_of(box[-1])

            self._guard.run(call["name"], call.get("args"), call.get("id"), executor)
        except _Refused as refused:
            return self._refused(request, refused.text)
        except _ToolError as failed:
            return failed.message
        return box[-1]

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        box: list[Any] = []
        try:
            request = _as_the_tool_gets_it(request)
            call = request.tool_call

            async def executor() -> Any:
                with _steering(call.get("name")):
                    box.append(await handler(request))
                return _record_of(box[-1])

            await self._guard.arun(call["name"], call.get("args"), call.get("id"), executor)
        except _Refused as refused:
            return self._refused(request, refused.text)
        except _ToolError as failed:
            return failed.message
        return box[-1]


def guard_tool(control: Any, tool: BaseTool, *, effect: str | None = None, action: str | None = None,
               principal: Any = None) -> BaseTool:
    """A tool like ``tool`` (same name, description and arguments) whose every call goes through
    ``control.call`` / ``acall``; give it to LangGraph's ``ToolNode`` (or ``create_agent``).

    A refusal comes back as the tool's error result (``ToolException``, ``handle_tool_error=True``:
    the model reads the reason); the approve band pauses the graph with ``interrupt()``.
    """
    if not isinstance(tool, BaseTool):
        raise TypeError(f"guard_tool needs a LangChain BaseTool, not {type(tool).__name__}")
    guard = _Guard(control, effects={tool.name: effect} if effect else None,
                   actions={tool.name: action} if action else None, principal=principal)

    def run(**given: Any) -> Any:
        try:
            arguments = _as_the_tool_runs_them(tool, tool.name, given)
            def executor() -> Any:
                with _steering(tool.name):
                    return tool.invoke(arguments)

            return guard.run(tool.name, arguments, None, executor)
        except _Refused as refused:
            raise ToolException(refused.text) from None

    async def arun(**given: Any) -> Any:
        try:
            arguments = _as_the_tool_runs_them(tool, tool.name, given)

            async def executor() -> Any:
                with _steering(tool.name):
                    return await tool.ainvoke(arguments)

            return await guard.arun(tool.name, arguments, None, executor)
        except _Refused as refused:
            raise ToolException(refused.text) from None

    return StructuredTool.from_function(
        func=run, coroutine=arun, name=tool.name, description=tool.description, args_schema=tool.args_schema,
        infer_schema=False, handle_tool_error=True, return_direct=tool.return_direct,
    )


# --------------------------------------------------------------------------- resumption


def pause(result: Mapping[str, Any], config: Mapping[str, Any], *, resume_with: str) -> Any:
    """Store the run ``result`` paused at (its ``__interrupt__``) beside its ctrlrun request
    (``ctrlrun.resumption.pause``): the thread id and checkpoint namespace of ``config``. The paused
    graph itself stays in the application's checkpointer, which the resumer's graph must share (a
    database one - ``SqliteSaver``, ``PostgresSaver`` - for another process). One ctrlrun request
    per paused run."""
    from ctrlrun import resumption

    ours = [item for item in (result.get("__interrupt__") or ()) if isinstance(getattr(item, "value", None), Mapping)
            and item.value.get("kind") == PAYLOAD_KIND and item.value.get("ctrlrun_request_id")]
    if len(ours) != 1:
        raise ctrlrun.InvalidArgument(f"pause: the run is paused on {len(ours)} ctrlrun request(s); a paused run is "
                                      "stored for exactly one")
    configurable = dict((config or {}).get("configurable") or {})
    thread_id = configurable.get("thread_id")
    if not isinstance(thread_id, str) or not thread_id:
        raise ctrlrun.InvalidArgument("pause: the config has no configurable.thread_id (a paused LangGraph run "
                                      "lives in a checkpointer thread)")
    (paused,) = ours
    state = {"thread_id": thread_id, "checkpoint_ns": str(configurable.get("checkpoint_ns", "")),
             "interrupt_id": paused.id, "tool": paused.value.get("tool"), "action": paused.value.get("action")}
    return resumption.pause(paused.value["ctrlrun_request_id"], "langgraph", state, resume_with=resume_with)


def config_of(paused: Any) -> dict[str, Any]:
    """The ``config`` of the thread a paused run (a ``PausedRunView``) is in."""
    try:
        data = json.loads(paused.state)
        thread_id = data["thread_id"]
        if not isinstance(thread_id, str) or not thread_id:
            raise ValueError("no thread id")
    except (ValueError, KeyError, TypeError) as exc:
        raise ctrlrun.InvalidArgument(f"paused run {paused.id}: the stored state does not parse as a LangGraph "
                                      f"thread ({type(exc).__name__}: {exc})") from None
    configurable = {"thread_id": thread_id}
    if data.get("checkpoint_ns"):
        configurable["checkpoint_ns"] = str(data["checkpoint_ns"])
    return {"configurable": configurable}


def resume_run(paused: Any, answer: Any, graph: Any) -> Any:
    """Continue a paused run after the person's ``answer`` (``graph.invoke``): granted, the call runs
    if ctrlrun holds the grant for its exact arguments; denied or expired, the model reads why."""
    command = resume(paused.approval_id, approved=answer.approved,
                     message=None if answer.approved else answer.message())
    return graph.invoke(command, config_of(paused))


async def aresume_run(paused: Any, answer: Any, graph: Any) -> Any:
    """:func:`resume_run` for an async graph (``graph.ainvoke``)."""
    command = resume(paused.approval_id, approved=answer.approved,
                     message=None if answer.approved else answer.message())
    return await graph.ainvoke(command, config_of(paused))
