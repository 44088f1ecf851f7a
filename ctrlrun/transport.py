"""HTTP clients that say ``NotExecuted`` when, and only when, the request never left.

A protected function that calls a REST API and sees an exception cannot, in general, know whether
the remote acted: the request may have arrived and the reply been lost. So ctrlrun records every
exception as ``ambiguous`` and refuses a retry until a reconcile hook or a human answers. One
failure is certain, though, and it is the commonest: the connection failed *before any byte of
the request was offered to the socket* (refused, no route, the name did not resolve, the connect
timed out, the TLS handshake failed). The remote cannot have acted on bytes it never got, so
that failure may be ``NotExecuted`` (the record goes ``failed`` and a retry may run).

This module turns exactly that failure into ``ctrlrun.NotExecuted`` and leaves every other one
as it was (same exception object, same type): a server that read the request and closed, a
reset or a timeout after sending, a reply that cannot be parsed, and every HTTP status (a 500 or
503 may come after the effect happened).

Why a register, not just "this connect failed"
    One request's connect failing proves nothing about the *executor*: it may have made a POST a
    moment earlier that acted. So each run of a protected function gets a register (opened by
    :func:`executor_scope`, which the kernel wraps around every executor call) that notes when any
    request made in it has offered a byte. A connect failure becomes ``NotExecuted`` only while
    the register of the current scope is clean. The register lives in a ``ContextVar``: each
    asyncio task, and each ``asyncio.to_thread`` call, sees the register of the context it was
    started from, so two executors gathered side by side never see each other's bytes.

    Plain threads do not inherit context variables. A send on a thread (or in a task) that is in
    no scope may be working for any executor of the process, so it marks *every* open register:
    a clean register is a promise, a marked one only costs a human's look.

    A ``NotExecuted`` of this module that leaves a scope whose register was marked meanwhile (a
    request of the same executor sent bytes after the failed connect, on another thread or task;
    or an outer protected function had already sent when an inner one failed to connect) is no
    longer true for that scope: it becomes the original connection error again (with a note), so
    the run is recorded ``ambiguous``.

What is "connecting"
    Resolving the name, the TCP connect and the TLS handshake: none of them carries a byte of the
    request, so any ``OSError`` there (``ssl.SSLError`` and certificate failures included) is
    ``never_connected``. A proxy tunnel's ``CONNECT`` line is bytes offered to a socket, so a
    failure after it is left as it is, as is anything after the first byte of the request.

Outside any scope the clients behave exactly as the standard library's: the caller gets the plain
error (``URLError`` and so on) and no ``NotExecuted`` is ever raised.

Only the standard library is imported here. ``HTTPTransport`` and ``AsyncHTTPTransport``, the
same classification for httpx, are loaded on first use (the ``httpx`` extra: ``pip install 'httpx>=0.27'``).
"""
from __future__ import annotations

import contextlib
import enum
import http.client
import socket
import threading
import urllib.request
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from .errors import NotExecuted
from .states import EffectState

__all__ = [
    "Transport",
    "effect_state",
    "executor_scope",
    "mark_offered",
    "urlopen",
    "HTTPConnection",
    "HTTPSConnection",
    "HTTPTransport",
    "AsyncHTTPTransport",
]


class Transport(enum.Enum):
    """What the client saw of a request, from the most certain to the least.

    Only ``never_connected`` proves the remote did not act; see :func:`effect_state`.
    """

    never_connected = "never_connected"  # the connection failed before any request byte was offered
    after_request_sent = "after_request_sent"  # bytes were offered, then no reply came (reset, timeout, close)
    unreadable_response = "unreadable_response"  # a reply came that could not be parsed
    stream_ended_early = "stream_ended_early"  # the reply began, then its body stopped short
    client_disconnected = "client_disconnected"  # our own caller went away while the request was out


def effect_state(observed: Transport | str) -> EffectState:
    """The state an effect is in after ``observed``: ``failed`` for ``never_connected`` only.

    Accepts a member or its value; any other value is a ``ValueError``.
    """
    if Transport(observed) is Transport.never_connected:
        return EffectState.FAILED
    return EffectState.AMBIGUOUS


# --------------------------------------------------------------------------- the register


class _Register:
    """Whether any request of one executor run (or of a run nested in it) has offered a byte."""

    __slots__ = ("parent", "offered")

    def __init__(self, parent: _Register | None) -> None:
        self.parent = parent
        self.offered = False

    def mark(self) -> None:
        register: _Register | None = self
        while register is not None:  # an inner run's request belongs to the outer run too
            register.offered = True
            register = register.parent


_current: ContextVar[_Register | None] = ContextVar("ctrlrun_transport_register", default=None)
_open: set[_Register] = set()
_open_lock = threading.Lock()


@contextlib.contextmanager
def executor_scope() -> Iterator[None]:
    """Open a fresh "bytes offered" register for one run of a protected function.

    The kernel wraps every executor call in it; open one yourself only to run an executor outside
    ``ctrlrun.protect``. Scopes nest: an inner scope starts clean, and what it sends marks the
    outer ones too. Use it as ``with executor_scope():`` in plain and in ``async`` code alike.
    """
    register = _Register(_current.get())
    token = _current.set(register)
    with _open_lock:
        _open.add(register)
    try:
        yield
    except NotExecuted as exc:
        original = exc.__cause__
        if not (register.offered and getattr(exc, "observed", None) is Transport.never_connected
                and isinstance(original, BaseException)):
            raise
        original.add_note("ctrlrun.transport: NotExecuted withdrawn: a request of this executor run offered bytes "
                          "before the run ended, so the run's effect may have happened")
        raise original
    finally:
        with _open_lock:
            _open.discard(register)
        _current.reset(token)


def mark_offered() -> None:
    """Note that a request of the current run has (or may have) reached a remote.

    The clients of this module call it before each send. Call it yourself when an executor also
    acts through something else (another HTTP client, an SDK, a queue) before using these
    clients, so that a later refused connection is not taken for proof that nothing happened.
    Outside any scope it marks every open scope of the process.
    """
    register = _current.get()
    if register is not None:
        register.mark()
        return
    with _open_lock:
        everyone = list(_open)
    for open_register in everyone:
        open_register.offered = True


@contextlib.contextmanager
def _connecting(where: str, failures: tuple[type[BaseException], ...] = (OSError,)) -> Iterator[None]:
    """Around making a connection to ``where``: a ``failures`` exception becomes ``NotExecuted``
    (chaining it) while the current register is clean; otherwise, and outside a scope, it is left as is."""
    try:
        yield
    except failures as exc:
        register = _current.get()
        if register is None or register.offered:
            raise
        error = NotExecuted(f"{where}: no byte of the request was sent before the connection failed "
                            f"({type(exc).__name__}: {exc}); the remote never received it, so it cannot have "
                            f"acted, and a retry is safe")
        error.observed = Transport.never_connected  # type: ignore[attr-defined]
        raise error from exc


# --------------------------------------------------------------------------- http.client and urllib


class _Classifying(http.client.HTTPConnection):
    """``connect`` and ``send`` of both connection classes: classify the one, register the other."""

    def connect(self) -> None:
        try:
            with _connecting(f"{self.host}:{self.port}"):
                super().connect()  # the name, TCP, a proxy tunnel, and for HTTPS the TLS handshake
        except BaseException:
            self.close()  # never leave a half-made socket behind (a plain TCP one under a failed handshake)
            raise

    def send(self, data: Any) -> None:
        if self.sock is None and self.auto_open:
            self.connect()  # before the register is marked: the connect itself sends nothing
        mark_offered()
        super().send(data)


class HTTPConnection(_Classifying, http.client.HTTPConnection):
    """``http.client.HTTPConnection`` whose pre-send connection failure is ``NotExecuted`` in a scope."""


class HTTPSConnection(_Classifying, http.client.HTTPSConnection):
    """``http.client.HTTPSConnection`` whose pre-send failure (TLS handshake included) is ``NotExecuted`` in a scope."""


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: Any) -> None:
        super().__init__(context=context)
        self.tls_context = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(HTTPSConnection, req, context=self.tls_context)


def urlopen(url: str | urllib.request.Request, data: bytes | None = None, *,
            timeout: float | None | object = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
            context: Any = None) -> http.client.HTTPResponse:
    """``urllib.request.urlopen`` for http and https, with this module's classification.

    ``context`` is an ``ssl.SSLContext`` for https (``None``: the default verifying one). The
    environment's proxies, redirects and ``HTTPError`` for a status of 400 and up are urllib's
    own; other schemes (``file:``, ``ftp:``, ``data:``) are refused with urllib's ``URLError``.
    """
    opener = urllib.request.OpenerDirector()
    for handler in (urllib.request.ProxyHandler(), urllib.request.UnknownHandler(), _HTTPHandler(),
                    _HTTPSHandler(context), urllib.request.HTTPDefaultErrorHandler(),
                    urllib.request.HTTPRedirectHandler(), urllib.request.HTTPErrorProcessor()):
        opener.add_handler(handler)
    return opener.open(url, data, timeout)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- httpx, on first use


def __getattr__(name: str) -> Any:
    if name in ("HTTPTransport", "AsyncHTTPTransport"):
        from . import _transport_httpx

        return getattr(_transport_httpx, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
