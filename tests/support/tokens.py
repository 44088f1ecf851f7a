"""Signed tokens and the loopback servers identity tests talk to: a JWKS endpoint and a revocation
feed, each a real ``http.server`` in a thread on 127.0.0.1, counting the requests it answered.
"""
from __future__ import annotations

import base64
import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["rsa_key", "public_pem", "jwk_of", "sign", "Served", "serve", "set_line", "ISSUER", "AUDIENCE"]

ISSUER = "https://idp.example.test"
AUDIENCE = "ctrlrun-api"


def rsa_key():
    from cryptography.hazmat.primitives.asymmetric import rsa

    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def jwk_of(key, kid: str, **extra) -> dict:
    from jwt.algorithms import RSAAlgorithm

    return {**json.loads(RSAAlgorithm.to_jwk(key.public_key())), "kid": kid, **extra}


def sign(claims: dict, key, *, alg: str = "RS256", kid: str | None = None, typ: str | None = "at+jwt") -> str:
    import jwt

    headers = {"typ": typ}  # None: no typ at all (PyJWT would otherwise add "JWT")
    if kid is not None:
        headers["kid"] = kid
    return jwt.encode(claims, key, algorithm=alg, headers=headers)


def set_line(subject: dict, event: str = "caep/event-type/session-revoked", iss: str = ISSUER) -> str:
    """One Security Event Token's payload (as a compact unsigned-looking JWT line) revoking ``subject``."""
    payload = {"iss": iss, "jti": "set-1", "iat": 1,
               "events": {f"https://schemas.openid.net/secevent/{event}": {"subject": subject}}}
    part = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJub25lIn0.{part}.sig"


class Served:
    """What a loopback server serves (``body``, bytes) and how many requests it answered (``hits``)."""

    def __init__(self, body: bytes = b"") -> None:
        self.body, self.hits, self.status = body, 0, 200
        self.url = ""


@contextlib.contextmanager
def serve(served: Served) -> Iterator[Served]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            served.hits += 1
            self.send_response(served.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(served.body)))
            self.end_headers()
            self.wfile.write(served.body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
