"""One exchange with the upstream MCP server, on a fresh connection.

A fresh connection per intercepted call makes "never connected" provable: a refused TCP connect
means no byte of the call left. The answer is read up to a bound; a Server-Sent-Events answer is
read for this request's JSON-RPC response (event ``id:`` lines are not kept: the gateway answers
with one JSON body, so a stream it cannot see cannot be resumed around it).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx

from ctrlrun.gateway.outcome import Observed

__all__ = ["forward_headers", "exchange", "sse_messages", "list_tools"]

#: Not relayed either way: hop-by-hop headers and what the gateway recomputes.
_HOP = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
                  "te", "trailer", "proxy-authorization", "proxy-connection", "accept-encoding",
                  "content-encoding"})


def forward_headers(headers: Mapping[str, str], *, drop: frozenset[str] = frozenset()) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _HOP and k.lower() not in drop}


def sse_messages(text: str) -> list[Any]:
    """The JSON data of each event of an SSE body (comments, ``id:``, ``retry:`` dropped)."""
    found, data = [], []
    for line in text.splitlines() + [""]:
        if not line:
            if data:
                try:
                    found.append(json.loads("\n".join(data)))
                except ValueError:
                    found.append(None)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" ") if line.startswith("data: ") else line[5:])
    return found


def _response_to(messages: list[Any], request_id: Any) -> dict[str, Any] | None:
    for message in messages:
        if isinstance(message, dict) and message.get("id") == request_id and ("result" in message or "error" in message):
            return message
    return None


async def exchange(url: str, body: bytes, headers: Mapping[str, str], request_id: Any, *, timeout: float,
                   max_bytes: int, revision: str) -> Observed:
    """POST one JSON-RPC request; what came back, as the outcome table reads it."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=0)
    try:
        async with httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False, trust_env=False) as client:
            async with client.stream("POST", url, content=body, headers=dict(headers)) as response:
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        return Observed("lost", f"the answer exceeded {max_bytes} bytes", revision=revision)
                    chunks.append(chunk)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return Observed("never_connected", f"{type(exc).__name__}: {exc}", revision=revision)
    except httpx.HTTPError as exc:
        return Observed("lost", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, revision=revision)
    raw = b"".join(chunks)
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        text = raw.decode("utf-8")
        messages = sse_messages(text) if kind == "text/event-stream" else ([json.loads(text)] if text.strip() else [])
    except ValueError:
        messages = []
    message = _response_to(messages, request_id)
    headers_seen = {k: v for k, v in response.headers.items() if k.lower() not in _HOP}
    return Observed(None, status=response.status_code, headers=headers_seen, message=message, revision=revision)


#: The most ``tools/list`` pages read to find a pinned tool.
MAX_LIST_PAGES = 20


async def list_tools(url: str, headers: Mapping[str, str], meta: Any, *, timeout: float, max_bytes: int,
                     revision: str) -> tuple[list[dict[str, Any]] | None, bytes | None]:
    """The upstream's ``tools/list`` now (every page, on fresh connections), and the TLS
    certificate it presented (DER; None over plain HTTP): what a pinned call is checked against.
    ``(None, certificate)`` when the list could not be read whole."""
    sent = {k: v for k, v in headers.items() if k.lower() not in ("mcp-method", "mcp-name", "content-length")}
    sent["mcp-method"] = "tools/list"
    tools: list[dict[str, Any]] = []
    cursor, certificate = None, None
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=0)
    for page in range(MAX_LIST_PAGES):
        params: dict[str, Any] = {"_meta": meta} if isinstance(meta, dict) else {}
        if cursor is not None:
            params["cursor"] = cursor
        request_id = f"ctrlrun-pin-{page}"
        body = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params}).encode()
        try:
            async with httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False,
                                         trust_env=False) as client:
                async with client.stream("POST", url, content=body, headers=sent) as response:
                    certificate = _peer_certificate(response) if certificate is None else certificate
                    raw = await response.aread()
        except httpx.HTTPError:
            return None, certificate
        if len(raw) > max_bytes or response.status_code != 200:
            return None, certificate
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            text = raw.decode("utf-8")
            messages = sse_messages(text) if kind == "text/event-stream" else [json.loads(text)]
        except ValueError:
            return None, certificate
        message = _response_to(messages, request_id)
        result = message.get("result") if message else None
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return None, certificate
        tools.extend(tool for tool in result["tools"] if isinstance(tool, dict))
        cursor = result.get("nextCursor")
        if not cursor:
            return tools, certificate
    return None, certificate


def _peer_certificate(response: httpx.Response) -> bytes | None:
    stream = response.extensions.get("network_stream")
    ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
    return ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
