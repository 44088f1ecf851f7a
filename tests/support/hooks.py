"""A webhook receiver on loopback (§D6): records each POST (its headers and body)."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Receiver"]


class Receiver:
    """An HTTP server on loopback recording each POST; answers with ``status`` (and ``location``)."""

    def __init__(self, status: int = 204, location: str | None = None, fail_first: int = 0) -> None:
        self.posts: list[tuple[dict, bytes]] = []
        self.status, self.location, self.fail_first = status, location, fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.posts.append((dict(self.headers), body))
                code = 500 if len(outer.posts) <= outer.fail_first else outer.status
                self.send_response(code)
                if outer.location:
                    self.send_header("Location", outer.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
