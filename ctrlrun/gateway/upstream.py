"""One exchange with the upstream MCP server, on a fresh connection.

A fresh connection per intercepted call makes "never connected" provable: a refused TCP connect
means no byte of the call left. The answer is read up to a bound; a Server-Sent-Events answer is
read for this request's JSON-RPC response (event ``id:`` lines are not kept: the gateway answers
with one JSON body, so a stream it cannot see cannot be resumed around it).

A call whose entry pins certificates (``upstream: tls_cert_sha256`` / ``tls_cert_file``) is made
over a connection that must present a pinned certificate: with ``tls_cert_file`` the pinned
certificates are its only trust anchors (``ctrlrun.upstream.pinned_context``), and on the call's own
connection the peer certificate's digest is checked as soon as the TLS handshake completes (httpcore's
``trace`` extension), before a byte of the request is written. Either refusal is
``Observed("unpinned")``: provably not executed.
"""
from __future__ import annotations

import json
import ssl
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from ctrlrun.gateway.outcome import Observed
from ctrlrun.upstream import certificate_refusal, pinned_context

__all__ = ["forward_headers", "exchange", "sse_messages", "list_tools", "relay_verify", "Unpinned"]

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


class Unpinned(Exception):
    """The connection of a pinned call presented a certificate its pins refuse; raised from the
    connection's trace right after the handshake, so no byte of the request was written."""


class _PinnedConnection:
    """The trace of a pinned call's connection: the peer certificate is checked against the pins
    when the TLS handshake completes; a request about to be written on a connection that was not
    checked (no TLS) is refused too."""

    def __init__(self, pins: Mapping[str, Any]) -> None:
        self.pins, self.checked = pins, False

    async def __call__(self, event: str, info: dict[str, Any]) -> None:
        if event == "connection.start_tls.complete":
            stream = info.get("return_value")
            ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
            refusal = certificate_refusal(self.pins, ssl_object.getpeercert(binary_form=True)
                                          if ssl_object is not None else None)
            if refusal is not None:
                raise Unpinned(refusal)
            self.checked = True
        elif event.endswith(".send_request_headers.started") and not self.checked:
            raise Unpinned(certificate_refusal(self.pins, None) or "the connection was not checked")


def _verify(pins: Mapping[str, Any] | None) -> ssl.SSLContext:
    """httpx's ``verify`` for a call under ``pins``: the pinned files as the only trust anchors, or
    the usual verification."""
    pems = tuple((pins or {}).get("tls_cert_pem") or ())
    if not pems:
        return _usual()
    if pems not in _pinned_contexts:
        _pinned_contexts[pems] = pinned_context(pems)
    return _pinned_contexts[pems]


_pinned_contexts: dict[tuple[str, ...], ssl.SSLContext] = {}
_usual_context: list[ssl.SSLContext] = []


def _usual() -> ssl.SSLContext:
    """httpx's own default verification (certifi's anchors), made once: an httpx client left to make
    its own loads the bundle again each time, and the gateway makes a client per exchange (a fresh
    connection per call)."""
    if not _usual_context:
        import certifi

        _usual_context.append(ssl.create_default_context(cafile=certifi.where()))
    return _usual_context[0]


def _untrusted(exc: BaseException) -> str | None:
    """The certificate verification failure under an httpx connect error, if that is what it was."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"the TLS handshake refused the upstream's certificate ({seen.verify_message or seen})"
        seen = seen.__cause__ or seen.__context__
    return None


_relay_contexts: dict[tuple[str, ...], ssl.SSLContext] = {}


def relay_verify(pems: Iterable[str]) -> ssl.SSLContext:
    """httpx's ``verify`` for the messages the gateway relays (initialize, tools/list ...): the usual
    trust anchors, and the certificate files some of the alias's tools pin."""
    pems = tuple(sorted(set(pems)))
    if not pems:
        return _usual()
    if pems not in _relay_contexts:
        import certifi

        context = ssl.create_default_context(cafile=certifi.where())
        context.load_verify_locations(cadata="\n".join(pems))
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        _relay_contexts[pems] = context
    return _relay_contexts[pems]


async def exchange(url: str, body: bytes, headers: Mapping[str, str], request_id: Any, *, timeout: float,
                   max_bytes: int, revision: str, pins: Mapping[str, Any] | None = None) -> Observed:
    """POST one JSON-RPC request; what came back, as the outcome table reads it. Under certificate
    ``pins`` the connection must present a pinned certificate before the request is written."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=0)
    pinned = bool((pins or {}).get("tls_cert_sha256"))
    extensions = {"trace": _PinnedConnection(pins)} if pinned and pins is not None else None
    try:
        async with httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False, trust_env=False,
                                     verify=_verify(pins)) as client:
            async with client.stream("POST", url, content=body, headers=dict(headers),
                                     extensions=extensions) as response:
                chunks, size = [], 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        return Observed("lost", f"the answer exceeded {max_bytes} bytes", revision=revision)
                    chunks.append(chunk)
    except Unpinned as exc:
        return Observed("unpinned", str(exc), revision=revision)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        untrusted = _untrusted(exc) if pinned else None
        if untrusted is not None:
            return Observed("unpinned", untrusted, revision=revision)
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
                     revision: str, pins: Mapping[str, Any] | None = None,
                     ) -> tuple[list[dict[str, Any]] | None, bytes | None, str | None]:
    """The upstream's ``tools/list`` now (every page, on fresh connections), the TLS certificate it
    presented (DER; None over plain HTTP) and, when the handshake refused it under the pinned trust
    anchors, why: what a pinned call is checked against. ``(None, certificate, None)`` when the list
    could not be read whole."""
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
                                         trust_env=False, verify=_verify(pins)) as client:
                async with client.stream("POST", url, content=body, headers=sent) as response:
                    certificate = _peer_certificate(response) if certificate is None else certificate
                    raw = await response.aread()
        except httpx.HTTPError as exc:
            return None, certificate, _untrusted(exc) if pins else None
        if len(raw) > max_bytes or response.status_code != 200:
            return None, certificate, None
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        try:
            text = raw.decode("utf-8")
            messages = sse_messages(text) if kind == "text/event-stream" else [json.loads(text)]
        except ValueError:
            return None, certificate, None
        message = _response_to(messages, request_id)
        result = message.get("result") if message else None
        if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
            return None, certificate, None
        tools.extend(tool for tool in result["tools"] if isinstance(tool, dict))
        cursor = result.get("nextCursor")
        if not cursor:
            return tools, certificate, None
    return None, certificate, None


def _peer_certificate(response: httpx.Response) -> bytes | None:
    stream = response.extensions.get("network_stream")
    ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
    return ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
