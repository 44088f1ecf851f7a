"""httpx transports with the classification of :mod:`ctrlrun.transport` (the ``httpx`` extra).

Loaded on first use of ``ctrlrun.transport.HTTPTransport`` or ``AsyncHTTPTransport``. They are
httpx's own transports (same constructor, pool, TLS, retries and HTTP/2), subclassed rather than
wrapped around any transport: the classification relies on what httpcore, under httpx's
transports, guarantees.

- httpcore raises ``ConnectError`` / ``ConnectTimeout`` only while it makes a connection (the TCP
  or Unix-socket connect, the TLS handshake); httpx passes them on as ``httpx.ConnectError`` /
  ``httpx.ConnectTimeout``. Those, while the register is clean, become ``NotExecuted``.
- Everything after that is left as it is: ``WriteError`` / ``WriteTimeout`` (part of the request
  may have gone), ``ReadError``, ``ReadTimeout``, ``RemoteProtocolError``, ``ProxyError``.
- Which bytes went out is read from httpcore's documented ``trace`` request extension: every
  traced step other than making a connection (``connect_tcp``, ``connect_unix_socket``,
  ``start_tls``, ``retry``) means the request is being written, so the register is marked as the
  step starts, before its bytes reach the socket. A ``trace`` of your own still gets every event.
"""
from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - exercised by hiding httpx in a test
    raise ModuleNotFoundError("ctrlrun.transport.HTTPTransport and AsyncHTTPTransport need httpx: "
                              "pip install 'httpx>=0.27' (django-ctrlrun's httpx extra)", name="httpx") from exc

from .transport import _connecting, mark_offered

__all__ = ["HTTPTransport", "AsyncHTTPTransport"]

#: httpcore's traced steps that only make a connection; any other step writes the request.
_CONNECTING = frozenset({"connect_tcp", "connect_unix_socket", "start_tls", "retry"})
#: What httpx raises when a connection could not be made; nothing of the request was sent.
_CONNECT_FAILURES = (httpx.ConnectError, httpx.ConnectTimeout)


def _note(event: str) -> None:
    """Mark the register unless ``event`` ("http11.send_request_headers.started"...) only connects."""
    parts = event.split(".")
    if len(parts) < 2 or parts[1] not in _CONNECTING:
        mark_offered()


def _tracer(theirs: Callable[[str, dict], Any] | None) -> Callable[[str, dict], None]:
    def trace(event: str, info: dict) -> None:
        _note(event)
        if theirs is not None:
            theirs(event, info)

    return trace


def _async_tracer(theirs: Callable[[str, dict], Awaitable[Any]] | None) -> Callable[[str, dict], Awaitable[None]]:
    async def trace(event: str, info: dict) -> None:
        _note(event)
        if theirs is not None:
            await theirs(event, info)

    return trace


@contextlib.contextmanager
def _classified(request: httpx.Request, trace: Callable[[str, dict], Any]) -> Iterator[None]:
    """Send ``request`` with ``trace`` as its trace extension (theirs restored afterwards), its connect
    failure classified."""
    extensions = request.extensions
    request.extensions = {**extensions, "trace": trace}
    port = request.url.port or (443 if request.url.scheme == "https" else 80)
    try:
        with _connecting(f"{request.url.host}:{port}", _CONNECT_FAILURES):
            yield
    finally:
        request.extensions = extensions


class HTTPTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` whose pre-send connection failure is ``NotExecuted`` in a scope.

    ``httpx.Client(transport=ctrlrun.transport.HTTPTransport())``; takes httpx's arguments.
    """

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with _classified(request, _tracer(request.extensions.get("trace"))):
            return super().handle_request(request)


class AsyncHTTPTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose pre-send connection failure is ``NotExecuted`` in a scope.

    ``httpx.AsyncClient(transport=ctrlrun.transport.AsyncHTTPTransport())``; takes httpx's arguments.
    """

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        with _classified(request, _async_tracer(request.extensions.get("trace"))):
            return await super().handle_async_request(request)
