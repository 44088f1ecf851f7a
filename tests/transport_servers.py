"""Real local TCP servers for the transport tests (no mocked sockets): one that answers with a
status, one that reads the request and closes without a word, one that closes before reading
anything; and a port where nothing listens.

Each server accepts on 127.0.0.1 in a thread of its own and hands every connection to its
behaviour on another thread; ``requests`` holds the raw requests it read, in order.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, read, closed): a connect is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_request(conn: socket.socket) -> bytes:
    """The request's head and (by Content-Length) body; what arrived if the client stopped short."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class Server:
    """A real server on 127.0.0.1; ``behaviour(server, conn)`` runs for each accepted connection."""

    def __init__(self, behaviour: Callable[[Server, socket.socket], None]) -> None:
        self.behaviour = behaviour
        self.requests: list[bytes] = []
        self.closed = threading.Event()  # a behaviour has closed a connection
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(10)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                self.behaviour(self, conn)
            except OSError:
                pass  # the client went away first: nothing to answer
        self.closed.set()

    def stop(self) -> None:
        self._stopping.set()
        self._accepting.join(timeout=10)
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=10)


def answering(status: int, body: bytes = b"ok") -> Callable[[Server, socket.socket], None]:
    """Read the request, answer ``status`` with ``body``, close."""

    def behaviour(server: Server, conn: socket.socket) -> None:
        server.requests.append(read_request(conn))
        conn.sendall(b"HTTP/1.1 %d Status\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (status, len(body), body))

    return behaviour


def reading_then_closing(server: Server, conn: socket.socket) -> None:
    """Read the whole request, then close without a byte of reply."""
    server.requests.append(read_request(conn))


def closing_at_once(server: Server, conn: socket.socket) -> None:
    """Close the moment the connection is accepted, before reading anything."""


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Server, socket.socket], None]], Server]]:
    """Start servers for one test (``serve(answering(200))``); all stopped when it ends."""
    started: list[Server] = []

    def start(behaviour: Callable[[Server, socket.socket], None]) -> Server:
        server = Server(behaviour)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
