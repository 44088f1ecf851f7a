"""An MCP server you host yourself, protected in its own process: no gateway, no proxy hop.

``protect_server(server, alias="shop", principal="support-agent")`` takes an ``MCPServer`` of the
official ``mcp`` SDK and routes its tool call path (``MCPServer.call_tool``, which the SDK's
``tools/call`` handler and any direct in-process call go through) through the same pipeline as the
gateway (``ctrlrun.gateway.protected``): every tool, registered before or after, is the action
``mcp.<alias>.<tool>``, decided by the policy, keyed by its ``effect:`` template, approved by a
person when the policy says so (the client re-sends the identical call), run once and recorded with
a receipt; the answer carries ``_meta["com.ctrlrun/receipt"]``, and a refusal is the JSON-RPC error
of §E1 (``-41001`` ...), raised as the SDK's ``MCPError``.

What the tool does decides what is recorded, as for a protected function:

- it returns: ``committed``; an ``isError`` result: ``ambiguous`` (``failed`` with the entry's
  ``mcp: {not_executed_on_error: true}``), relayed;
- it raises ``ctrlrun.NotExecuted``, or the SDK refuses the call before the tool's body ran
  (unknown tool, arguments that fail the tool's schema): ``failed``;
- it raises anything else (``TimeoutError`` ...): ``ambiguous``, and the retry is ``-41005``;
- an ``MCPError`` it raises: ``failed`` for a pre-dispatch code (``-32602`` ...), else ``ambiguous``.

The client gets an ``isError`` result (the SDK's text for it) carrying the receipt, never a broken
session.

Who acts (``principal=``): an agent name or a ``Principal`` for every call; or a callable given
the SDK's ``Context`` of the call (``None`` for a direct ``server.call_tool(...)`` outside a
request), returning a ``Principal``, an agent name or ``None`` (``-41007``), plain or ``async``; or
``None``: the Control's identity provider (``Control(identity=...)``) reads the request's HTTP
headers (``Context.headers``), as ``ctrlrun gateway --principal-header``/``--identity-jwt`` do.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextContent
from pydantic import ValidationError

from ctrlrun.canonical import Principal
from ctrlrun.errors import InvalidArgument, NotExecuted
from ctrlrun.gateway.outcome import PRE_DISPATCH_CODES
from ctrlrun.gateway.protected import Ambiguous, NotRun, protected_tool_call
from ctrlrun.gateway.wire import ALIAS_PATTERN, RECEIPT_META, GatewayError

__all__ = ["protect_server"]

logger = logging.getLogger("ctrlrun.mcp_server")

#: The attribute that marks a server already protected (a second wrap would decide every call twice).
_MARK = "_ctrlrun_protected"


def protect_server(server: MCPServer, *, alias: str, principal: Any = None, control: Any = None) -> MCPServer:
    """Protect every tool of ``server`` (an ``mcp.server.mcpserver.MCPServer``), now and later; returns it.

    ``alias`` names the actions ``mcp.<alias>.<tool>``; ``control`` is the Control the calls run under
    (default: the process's, ``CTRLRUN_POLICY``/``CTRLRUN_DATABASE`` or the standalone store, built at
    the first call); ``principal`` says who acts (see the module's docstring)."""
    if not isinstance(server, MCPServer):
        raise InvalidArgument(f"protect_server takes an mcp.server.mcpserver.MCPServer, not {type(server).__name__}")
    if not isinstance(alias, str) or not ALIAS_PATTERN.match(alias):
        raise InvalidArgument(f"the alias {alias!r} must match {ALIAS_PATTERN.pattern} (it names the actions "
                              f"mcp.<alias>.<tool>)")
    who = _principal_of(principal)
    if getattr(server, _MARK, None) is not None:
        raise InvalidArgument(f"this MCP server is already protected (alias {getattr(server, _MARK)!r}): each call "
                              f"would be decided twice")
    original = server.call_tool  # the SDK's bound method: the tool manager's call, arguments validated there

    async def call_tool(name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        chosen = control
        if chosen is None:
            from ctrlrun.control import default_control

            chosen = default_control()
        request_id = _request_id(context)
        try:
            acting, headers = await who(context, name, alias)

            async def run(not_executed_on_error: bool) -> Any:
                return await _run_tool(original, name, arguments, context, not_executed_on_error)

            finished = await protected_tool_call(chosen, alias=alias, tool=name, arguments=arguments or {},
                                                 principal=acting, run=run, request_id=request_id, headers=headers)
        except GatewayError as refused:
            raise MCPError(refused.code, refused.message, refused.data) from None
        except Exception as exc:  # a fault of ctrlrun's own (the store away ...): said, not a traceback
            logger.exception("tools/call %s failed inside ctrlrun", name)
            raise MCPError(-32603, f"ctrlrun could not complete this call ({type(exc).__name__}: {exc}); do not "
                                   f"retry blindly: look at the receipts first") from None
        if finished.unfinished is None:
            return _stamped(finished.result, finished.meta)
        return _unfinished(finished.unfinished, name, finished.meta)

    server.call_tool = call_tool  # type: ignore[method-assign]
    setattr(server, _MARK, alias)
    return server


# ---------------------------------------------------------------- who acts

def _principal_of(principal: Any) -> Callable[[Any, str, str], Any]:
    """``principal=`` as ``async (context, tool, alias) -> (Principal | None, headers | None)``."""
    if isinstance(principal, str):
        if not principal.strip():
            raise InvalidArgument("protect_server(principal=...) must name the agent that acts")
        principal = Principal(agent=principal)
    if isinstance(principal, Principal):
        fixed = principal

        async def always(context: Any, tool: str, alias: str) -> tuple[Principal, None]:
            return fixed, None  # whoever sends the call: any identity header is ignored
        return always
    if principal is None:
        async def by_headers(context: Any, tool: str, alias: str) -> tuple[None, dict[str, str]]:
            return None, _headers(context)  # the Control's identity provider reads them
        return by_headers
    if not callable(principal):
        raise InvalidArgument(f"protect_server(principal=...) takes an agent name, a ctrlrun.Principal, a callable "
                              f"of the SDK's Context, or None (the Control's identity provider), not "
                              f"{type(principal).__name__}")
    reader = principal

    async def asked(context: Any, tool: str, alias: str) -> tuple[Principal | None, None]:
        try:
            answer = reader(context)
            if inspect.isawaitable(answer):
                answer = await answer
        except Exception:
            logger.exception("mcp.%s.%s: the principal callable raised", alias, tool)
            raise GatewayError.of("no_principal", f"mcp.{alias}.{tool}: credential rejected") from None
        if isinstance(answer, str) and answer.strip():
            return Principal(agent=answer), None
        if answer is None or isinstance(answer, Principal):
            return answer, None
        logger.error("mcp.%s.%s: the principal callable returned %s, not a Principal, a name or None", alias, tool,
                     type(answer).__name__)
        raise GatewayError.of("no_principal", f"mcp.{alias}.{tool}: credential rejected")
    return asked


def _request_context(context: Any) -> Any:
    try:
        return context.request_context if context is not None else None
    except ValueError:  # the SDK's Context outside a request
        return None


def _headers(context: Any) -> dict[str, str]:
    request = getattr(_request_context(context), "request", None)
    headers = getattr(request, "headers", None) or {}
    return {str(name).lower(): str(value) for name, value in headers.items()}


def _request_id(context: Any) -> Any:
    return getattr(_request_context(context), "request_id", None)


# ---------------------------------------------------------------- the tool's own call

def _not_run(exc: ToolError) -> bool:
    """Whether the SDK's ``ToolError`` proves the tool's body never ran: the tool is unknown (no
    cause: the tool manager's own refusal), the arguments failed its schema (the SDK's validation,
    a ``ValidationError`` cause on a deliberate ``ToolError``), or it raised ``ctrlrun.NotExecuted``."""
    cause = exc.__cause__
    if isinstance(cause, NotExecuted):
        return True
    if isinstance(exc, UnexpectedToolError):
        return False
    return cause is None or isinstance(cause, ValidationError)


async def _run_tool(original: Any, name: str, arguments: dict[str, Any], context: Any,
                    not_executed_on_error: bool) -> Any:
    try:
        result = await original(name, arguments, context)
    except MCPError as exc:
        raise (NotRun(exc) if exc.code in PRE_DISPATCH_CODES else Ambiguous(exc)) from exc
    except ToolError as exc:
        raise (NotRun(exc) if _not_run(exc) else Ambiguous(exc)) from exc
    if getattr(result, "is_error", False):
        raise NotRun(result, "the tool answered isError") if not_executed_on_error else \
            Ambiguous(result, "the tool answered isError: part of it may have run")
    if not isinstance(result, CallToolResult):  # input_required: a continuation is not told from a duplicate yet
        raise Ambiguous(result, f"the tool answered {getattr(result, 'result_type', type(result).__name__)!r}, "
                                f"not a complete result")
    return result


def _stamped(result: Any, meta: dict[str, Any]) -> Any:
    """The result with the receipt's stamp in its ``_meta``."""
    return result.model_copy(update={"meta": {**(result.meta or {}), RECEIPT_META: meta}})


def _unfinished(unfinished: Ambiguous | NotRun, name: str, meta: dict[str, Any]) -> Any:
    """What the client is told about a call that did not commit (its receipt says which it was)."""
    payload = unfinished.payload
    if isinstance(payload, MCPError):
        data = payload.error.data
        if data is None or isinstance(data, dict):
            data = {**(data or {}), "_meta": {RECEIPT_META: meta}}
        raise MCPError(payload.code, payload.message, data) from None
    if isinstance(payload, ToolError):
        # As the SDK's own handler would have answered it, logged as it logs it, the receipt added.
        if isinstance(payload, UnexpectedToolError):
            logger.error("tool %r raised an unexpected exception (recorded %s)", name, meta.get("result"),
                         exc_info=payload.__cause__ or payload)
        else:
            logger.info("tool %r failed (recorded %s): %r", name, meta.get("result"), str(payload))
        return CallToolResult(content=[TextContent(type="text", text=str(payload))], is_error=True,
                              _meta={RECEIPT_META: meta})
    return _stamped(payload, meta)
