"""``ctrlrun mcp-operator`` as an OS process on loopback, and the SDK's client talking to it."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from .base import script_environment
from .mcp_servers import Proc, free_port, wait_for_port

__all__ = ["start_operator", "operator_call", "operator_tools"]


def start_operator(folder: Path, policy: str, *flags: str) -> Proc:
    port = free_port()
    env = script_environment(folder, policy)
    proc = subprocess.Popen([sys.executable, "-m", "ctrlrun", "mcp-operator", "--listen", f"127.0.0.1:{port}", *flags],
                            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_port(port, proc)
    return Proc(proc, port)


def operator_call(url: str, tool: str, arguments: dict, headers: dict[str, str] | None = None):
    """One tool call through the SDK's Client (headers on every request): the CallToolResult, or
    the MCPError the server answered."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError

    async def run():
        async with httpx2.AsyncClient(headers=headers or {}, trust_env=False, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                try:
                    return await client.call_tool(tool, arguments)
                except MCPError as exc:
                    return exc

    return asyncio.run(run())


def operator_tools(url: str) -> list[str]:
    from mcp import Client

    async def run():
        async with Client(url) as client:
            return [tool.name for tool in (await client.list_tools()).tools]

    return asyncio.run(run())
