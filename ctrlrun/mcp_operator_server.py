"""The SDK's ``MCPServer`` of ``ctrlrun mcp-operator``: the eight tools over ``mcp_operator.Operator``.

Imported only when the operator is served (the ``mcp`` extra); the store calls run in a worker
thread (``sync_to_async``), never on the event loop.
"""
from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from mcp.server.mcpserver import Context, MCPServer

from .errors import CTRLRunError
from .mcp_operator import INSTRUCTIONS, SERVER_NAME, Operator, _invalid, _limit, _result

__all__ = ["build"]


def build(operator: Operator) -> MCPServer:
    """The SDK's ``MCPServer`` with the eight tools."""
    server = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS)

    async def run(fn: Any, *args: Any) -> Any:
        try:
            return _result(await sync_to_async(fn, thread_sensitive=True)(*args))
        except CTRLRunError as exc:
            raise _invalid(str(exc)) from None

    @server.tool()
    async def list_pending_approvals(limit: int | None = None) -> Any:
        """Pending approval requests, oldest first (limit 1..200, default 50)."""
        return await run(operator.list_pending, _limit(limit, 50))

    @server.tool()
    async def inspect_action(action_id: str) -> Any:
        """One action: its receipts and approval requests (ctrlrun.inspection/v2)."""
        return await run(operator.inspect, action_id)

    @server.tool()
    async def receipts(limit: int | None = None, control: str | None = None) -> Any:
        """The latest receipts (limit 1..200, default 20), optionally only those citing a control."""
        return await run(operator.receipts, _limit(limit, 20), control)

    @server.tool()
    async def effects(state: str | None = None) -> Any:
        """Effect records, optionally in one state (e.g. ambiguous)."""
        return await run(operator.effects, state)

    @server.tool()
    async def stats(since: str | None = None) -> Any:
        """Counts of decisions and outcomes since a time (e.g. 24h) (ctrlrun.stats/v1)."""
        return await run(operator.stats, since)

    @server.tool()
    async def approve(request_id: str, ctx: Context) -> Any:
        """Grant a pending approval request as the verified person of this request's credential."""
        principal, roles = operator.person(ctx.headers, "approve")
        return await run(operator.answer, request_id, True, principal, roles)

    @server.tool()
    async def deny(request_id: str, ctx: Context) -> Any:
        """Deny a pending approval request as the verified person of this request's credential."""
        principal, roles = operator.person(ctx.headers, "deny")
        return await run(operator.answer, request_id, False, principal, roles)

    @server.tool()
    async def resolve(effect_key: str, outcome: str, reason: str, ctx: Context) -> Any:
        """Say what happened to an AMBIGUOUS effect: outcome committed or failed, with the reason you checked."""
        principal, _roles = operator.person(ctx.headers, "resolve")
        return await run(operator.resolve, effect_key, outcome, reason, principal)

    return server
