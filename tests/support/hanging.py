"""An MCP upstream that reads each call and then holds its connection, answering nothing, until the
test lets go (``drop()``: every held connection closed without a word)."""
from __future__ import annotations

import socket
import threading

__all__ = ["HangingUpstream"]


class HangingUpstream:
    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.changed = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def _serve(self) -> None:
        from tests.transport_servers import read_request

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return

            def hold(conn: socket.socket = conn) -> None:
                read_request(conn)
                with self.changed:
                    self.held.append(conn)
                    self.changed.notify_all()

            threading.Thread(target=hold, daemon=True).start()

    def wait_held(self, count: int, timeout: float = 120) -> bool:
        """Whether ``count`` calls have arrived and are held (waiting at most ``timeout`` s for them)."""
        with self.changed:
            return self.changed.wait_for(lambda: len(self.held) >= count, timeout)

    def drop(self) -> None:
        with self.changed:
            for conn in self.held:
                conn.close()
            self.held.clear()

    def close(self) -> None:
        self.drop()
        self.sock.close()
