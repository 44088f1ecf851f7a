"""MCP servers for the gateway tests, each a real process or socket on loopback.

- ``start_upstream(folder)``: the SDK-built server of ``tests/support/mcp_upstream.py`` in its own
  OS process; its ``log`` holds one line per real execution;
- ``Misbehaving``: a raw HTTP server in a thread that answers each ``tools/call`` the way its tool's
  name says (drops the socket, ``isError``, a JSON-RPC error, HTTP 500, 401 with a challenge ...;
  ``elicit*``: asks for input, ``input_required`` with or without a ``requestState``);
- ``start_gateway(folder, upstream, policy)``: ``ctrlrun gateway`` as an OS process on the test store;
- ``start_hosted(folder, policy)``: the SDK-built server of ``tests/support/mcp_hosted.py``, protected
  in its own process (``ctrlrun.mcp_server``), as an OS process on the test store.
"""
from __future__ import annotations

import asyncio

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .base import REPO, script_environment

__all__ = ["sdk_client_calls", "session_calls", "free_port", "ServedApp", "wait_for_port", "start_upstream",
           "start_gateway", "start_hosted", "Misbehaving", "Proc",
           "mcp_post", "executions", "tools_call"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the process exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


@dataclass
class Proc:
    proc: subprocess.Popen
    port: int
    log: Path | None = None
    stdout: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)


def start_upstream(folder: Path, tool_name: str = "refund", port: int | None = None, variant: str = "",
                   spans: Path | None = None) -> Proc:
    """``variant="reschemed"``: the same tool names, ``refund`` with another description;
    ``variant="elicit"``: ``confirmed_refund`` too, a tool that asks its client two questions. ``spans``: a
    file the upstream writes its OpenTelemetry server spans and the ``traceparent`` headers it got to."""
    port = port or free_port()
    log = folder / "executions.log"
    env = {**os.environ, **({"CTRLRUN_TEST_SPANS": str(spans)} if spans is not None else {})}
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.mcp_upstream", str(port), str(log), tool_name,
                             *([variant] if variant else [])],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_port(port, proc)
    return Proc(proc, port, log)


def executions(upstream: Proc) -> list[str]:
    return upstream.log.read_text().splitlines() if upstream.log and upstream.log.exists() else []


def start_gateway(folder: Path, upstream_url: str, policy: str, *extra: str, alias: str = "pay",
                  identity: tuple[str, ...] = ("--principal", "agent-1"), port: int | None = None,
                  env: dict[str, str] | None = None) -> Proc:
    """``identity``: the flags saying who acts (default ``--principal agent-1``); ``port`` to listen
    on (default a free one); ``env`` added to the process's environment."""
    port = port or free_port()
    env = {**script_environment(folder, policy), **(env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "ctrlrun", "gateway", "--upstream", upstream_url, "--alias", alias,
                             *identity, "--listen", f"127.0.0.1:{port}", *extra],
                            cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_port(port, proc)
    return Proc(proc, port)


def start_hosted(folder: Path, policy: str, mode: str = "fixed") -> Proc:
    """``mode``: ``fixed`` (every call acts for ``agent-1``) or ``header`` (the ``x-agent`` header says)."""
    port = free_port()
    log = folder / "executions.log"
    env = script_environment(folder, policy)
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.mcp_hosted", str(port), str(log), mode],
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_port(port, proc)
    return Proc(proc, port, log)


class ServedApp:
    """An ASGI application (a ``GatewayApp``) served by uvicorn on loopback in a thread of this process,
    so the test reads what it keeps in memory (spans); ``stop()`` ends it."""

    def __init__(self, app: object) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for_port(self.port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def mcp_post(url: str, body: object | bytes, *, headers: dict[str, str] | None = None, timeout: float = 60):
    """One raw POST to the gateway (for what the SDK's client would never send), at the current
    revision with its mirror headers unless ``headers`` say otherwise (a ``None`` drops one):
    (status, JSON or text)."""
    import httpx

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"content-type": "application/json", "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28"}
    if isinstance(body, dict):  # the current revision's mirror headers, as the SDK's client sends them
        sent["mcp-method"] = body.get("method", "")
        if body.get("method") == "tools/call":
            sent["mcp-name"] = body.get("params", {}).get("name", "")
    sent.update(headers or {})
    sent = {k: v for k, v in sent.items() if v is not None}
    response = httpx.post(url, content=data, headers=sent, timeout=timeout)
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, response.text


def tools_call(tool: str, arguments: dict, request_id: int = 1) -> dict:
    """A tools/call at the current revision, with the request metadata the SDK's client sends."""
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw-test", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta}}


class Misbehaving:
    """A raw HTTP/1.1 server: ``tools/call`` of tool NAME answers as NAME says; ``calls`` counts them,
    ``seen`` keeps each call's params.

    ``elicit`` asks its client ``arguments.rounds`` times (``input_required``, ``requestState``
    ``up-1``, ``up-2`` ...), then answers complete naming the state and the client's answer it got;
    ``elicit_no_state`` asks without a ``requestState``; ``elicit_then_drop`` and
    ``elicit_then_refuse`` ask once, then drop the socket or answer ``-32602`` on the continuation."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.calls: list[str] = []
        self.seen: list[dict] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def close(self) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        from tests.transport_servers import read_request

        with conn:
            raw = read_request(conn)
            body = json.loads(raw.partition(b"\r\n\r\n")[2] or b"{}")
            tool = body.get("params", {}).get("name", "")
            self.calls.append(tool)
            self.seen.append(body.get("params", {}))
            rid = body.get("id")
            if tool == "drop":
                return  # read the call, closed without a word
            params = body.get("params", {})
            state = params.get("requestState")
            if tool.startswith("elicit"):
                if state is not None and tool == "elicit_then_drop":
                    return
                asked = int(state[3:]) if isinstance(state, str) and state.startswith("up-") else 0
                wanted = (params.get("arguments") or {}).get("rounds", 1) if tool == "elicit" else 1
                if state is not None and tool == "elicit_then_refuse":
                    payload = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "bad params"}}
                elif asked >= wanted:
                    answer = json.dumps({"state": state, "answers": params.get("inputResponses")}, sort_keys=True)
                    payload = {"jsonrpc": "2.0", "id": rid, "result": {
                        "content": [{"type": "text", "text": answer}], "resultType": "complete"}}
                else:
                    question = {"method": "elicitation/create", "params": {
                        "mode": "form", "message": f"question {asked + 1}?",
                        "requestedSchema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}
                    result = {"resultType": "input_required", "inputRequests": {f"q{asked + 1}": question}}
                    if tool != "elicit_no_state":
                        result["requestState"] = f"up-{asked + 1}"
                    payload = {"jsonrpc": "2.0", "id": rid, "result": result}
                data = json.dumps(payload).encode()
                conn.sendall(f"HTTP/1.1 200 X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                             f"Connection: close\r\n\r\n".encode() + data)
                return
            status, headers, payload = 200, {}, {"jsonrpc": "2.0", "id": rid,
                                                 "result": {"content": [{"type": "text", "text": "ok"}],
                                                            "resultType": "complete"}}
            if tool == "is_error" or tool == "is_error_not_run":
                payload["result"]["isError"] = True
            elif tool == "no_result_type":  # the current revision's unknown outcome
                del payload["result"]["resultType"]
            elif tool == "rpc_invalid_params":
                payload = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "bad params"}}
            elif tool == "rpc_internal":
                payload = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": "boom"}}
            elif tool == "http_500":
                status, payload = 500, {"detail": "server error"}
            elif tool == "http_401":
                status, headers = 401, {"WWW-Authenticate": 'Bearer realm="upstream"'}
                payload = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32001, "message": "unauthorized"}}
            elif tool == "sse":
                text = (f"id: 7\nevent: message\ndata: " + json.dumps(
                    {"jsonrpc": "2.0", "id": rid, "result": {"content": [], "isError": False, "resultType": "complete"}}) + "\n\n").encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "
                             + str(len(text)).encode() + b"\r\nConnection: close\r\n\r\n" + text)
                return
            elif tool == "huge":
                payload["result"]["content"][0]["text"] = "x" * (3 * 1024 * 1024)
            data = json.dumps(payload).encode()
            head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                         f"{head}Connection: close\r\n\r\n".encode() + data)


def sdk_client_calls(url: str, *calls: tuple[str, dict], headers: dict[str, str] | None = None) -> list:
    """Each call through the SDK's Client (sending ``headers`` on every request): the tool names it
    listed, then each call's CallToolResult, or the MCPError it raised."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError

    async def run():
        answers = []
        target = url if headers is None else streamable_http_client(
            url, http_client=create_mcp_http_client(headers=headers))
        async with Client(target) as client:
            answers.append([tool.name for tool in (await client.list_tools()).tools])
            for name, arguments in calls:
                try:
                    answers.append(await client.call_tool(name, arguments))
                except MCPError as exc:
                    answers.append(exc)
        return answers

    return asyncio.run(run())


def session_calls(url: str, *calls: tuple[str, dict], client_name: str = "ctrlrun-tests",
                  client_version: str = "7.1", headers: dict[str, str] | None = None) -> list:
    """The SDK's ``ClientSession`` over its streamable-HTTP transport (the initialize handshake, a
    session id): the names ``tools/list`` gives (every page, following ``nextCursor``), then each
    call's CallToolResult or the MCPError it raised."""
    from mcp import ClientSession, types
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client
    from mcp.shared.exceptions import MCPError

    async def run():
        answers: list = []
        async with create_mcp_http_client(headers=headers) as http, \
                streamable_http_client(url, http_client=http) as (read, write), \
                ClientSession(read, write, client_info=types.Implementation(name=client_name, version=client_version)) as session:
            await session.initialize()
            names, cursor = [], None
            for _ in range(50):
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                names += [tool.name for tool in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    break
            answers.append(names)
            for name, arguments in calls:
                try:
                    answers.append(await session.call_tool(name, arguments))
                except MCPError as exc:
                    answers.append(exc)
        return answers

    return asyncio.run(run())
