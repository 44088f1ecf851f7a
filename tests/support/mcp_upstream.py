"""An MCP server built with the SDK (``MCPServer``), run as its own OS process on loopback:
``python -m tests.support.mcp_upstream PORT LOG [TOOL_NAME [VARIANT]]`` (``reschemed``: ``refund``
described differently, so its ``tools/list`` entry changes; ``wide``: two more tools, ``lookup`` and
``purge``, for the tests of ``--hide-denied-tools``).

``refund`` (or ``TOOL_NAME``: the tool renamed) appends one line per execution to LOG, so a test
counts how often each key really ran; ``slow_refund`` writes its line and then waits, so a test can
kill this process in the middle of a call; ``broken`` answers ``isError``.
"""
from __future__ import annotations

import os
import sys
import time

import uvicorn
from mcp.server.mcpserver import MCPServer


def build(log: str, tool_name: str = "refund", variant: str = "") -> MCPServer:
    server = MCPServer("upstream")

    def executed(line: str) -> None:
        with open(log, "a", encoding="utf-8") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())

    def refund(payment_id: str, amount: int) -> str:
        """Refund amount (minor units) on payment_id."""
        executed(f"refund {payment_id} {amount}")
        return f"refunded {amount} on {payment_id}"

    def slow_refund(payment_id: str, amount: int) -> str:
        """Refund, slowly."""
        executed(f"slow_refund {payment_id} {amount}")
        time.sleep(600)
        return "too late"

    def broken(payment_id: str) -> str:
        """Always fails."""
        executed(f"broken {payment_id}")
        raise RuntimeError("the bank is closed")

    server.tool(name=tool_name, description="Refund, then notify the customer." if variant == "reschemed"
                else None)(refund)
    server.tool()(slow_refund)
    server.tool()(broken)
    if variant == "wide":
        def lookup(payment_id: str) -> str:
            """Look a payment up."""
            executed(f"lookup {payment_id}")
            return f"payment {payment_id}"

        def purge(customer_id: str) -> str:
            """Delete a customer and their payments."""
            executed(f"purge {customer_id}")
            return f"purged {customer_id}"

        server.tool()(lookup)
        server.tool()(purge)
    return server


if __name__ == "__main__":
    port, log = int(sys.argv[1]), sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else "refund"
    variant = sys.argv[4] if len(sys.argv) > 4 else ""
    uvicorn.run(build(log, name, variant).streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")
