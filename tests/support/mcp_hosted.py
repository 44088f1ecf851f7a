"""An MCP server built with the SDK and protected in its own process (``ctrlrun.mcp_server``),
served over Streamable HTTP by uvicorn on loopback as its own OS process:
``python -m tests.support.mcp_hosted PORT LOG [fixed|header]``, on the store and policy its
environment names (``script_environment``).

Each tool appends one line per execution of its body to LOG, so a test counts what really ran.
``refund`` and ``delete_customer`` are registered before ``protect_server``; ``slow_refund`` (which
raises ``TimeoutError`` after its line: it may have acted), ``refused_refund`` (raises
``ctrlrun.NotExecuted`` the first time, then succeeds) and ``late_refund`` after it.

``fixed``: every call acts for ``agent-1``. ``header``: a callable reads the request's ``x-agent``
header from the SDK's ``Context`` (``None`` without it: ``-41007``).
"""
from __future__ import annotations

import os
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

import ctrlrun
from ctrlrun.mcp_server import protect_server


def build(log: str, mode: str = "fixed") -> MCPServer:
    server = MCPServer("hosted")

    def executed(line: str) -> None:
        with open(log, "a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    @server.tool()
    def refund(payment_id: str, amount: int) -> str:
        """Refund amount (minor units) on payment_id."""
        executed(f"refund {payment_id} {amount}")
        return f"refunded {amount} on {payment_id}"

    @server.tool()
    def delete_customer(customer_id: str) -> str:
        """Delete a customer."""
        executed(f"delete_customer {customer_id}")
        return f"deleted {customer_id}"

    def from_header(context: Context) -> str | None:
        return (context.headers or {}).get("x-agent")

    protect_server(server, alias="shop", principal="agent-1" if mode == "fixed" else from_header)

    @server.tool()
    def slow_refund(payment_id: str, amount: int) -> str:
        """Refund; the bank does not answer in time."""
        executed(f"slow_refund {payment_id} {amount}")
        raise TimeoutError("the bank did not answer in time")

    refused: list[str] = []

    @server.tool()
    def refused_refund(payment_id: str, amount: int) -> str:
        """Refund; the bank refuses the connection the first time."""
        executed(f"refused_refund {payment_id} {amount}")
        if not refused:
            refused.append(payment_id)
            raise ctrlrun.NotExecuted("the bank refused the connection: nothing was sent")
        return f"refunded {amount} on {payment_id}"

    @server.tool()
    async def late_refund(payment_id: str, amount: int) -> str:
        """Refund, registered after the server was protected."""
        executed(f"late_refund {payment_id} {amount}")
        return f"refunded {amount} on {payment_id}"

    return server


if __name__ == "__main__":
    port, log = int(sys.argv[1]), sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "fixed"
    uvicorn.run(build(log, mode).streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
