"""TLS on loopback for the gateway's certificate pins: self-signed certificates made with
``cryptography``, and a TLS-terminating proxy in front of a plain upstream.

- ``self_signed(folder, name, issuer=None)``: a certificate for ``127.0.0.1``/``localhost`` and its
  key, written as PEM files, self-signed or signed by ``issuer``'s key; ``.pin`` is its ``sha256:``
  digest (``ctrlrun.upstream.cert_hash``);
- ``TLSProxy(target_port, certificates)``: accepts TLS on a loopback port and pipes the decrypted
  bytes to ``127.0.0.1:target_port``. Connection N presents ``certificates[N]`` (the last one for
  every later connection), so a test can give the gateway's pin check one certificate and the
  call's own connection another. ``served`` lists the certificate name of each handshake begun.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Certificate", "self_signed", "TLSProxy"]


@dataclass(frozen=True)
class Certificate:
    name: str
    cert_file: Path
    key_file: Path
    pin: str


def self_signed(folder: Path, name: str, issuer: Certificate | None = None) -> Certificate:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from ctrlrun.upstream import cert_hash

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"upstream {name}")])
    signer, issuer_name = key, subject
    if issuer is not None:
        signer = serialization.load_pem_private_key(issuer.key_file.read_bytes(), None)
        issuer_name = x509.load_pem_x509_certificate(issuer.cert_file.read_bytes()).subject
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
            .sign(signer, hashes.SHA256()))
    cert_file, key_file = folder / f"{name}.pem", folder / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Certificate(name, cert_file, key_file, cert_hash(cert.public_bytes(serialization.Encoding.DER)))


class TLSProxy:
    def __init__(self, target_port: int, certificates: list[Certificate]) -> None:
        self.target_port = target_port
        self.contexts = []
        for certificate in certificates:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certificate.cert_file, certificate.key_file)
            self.contexts.append((certificate.name, context))
        self.served: list[str] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/mcp"

    def close(self) -> None:
        self.sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            name, context = self.contexts[min(len(self.served), len(self.contexts) - 1)]
            self.served.append(name)
            threading.Thread(target=self._pipe, args=(conn, context), daemon=True).start()

    def _pipe(self, conn: socket.socket, context: ssl.SSLContext) -> None:
        try:
            tls = context.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):  # the client refused the certificate: nothing is forwarded
            conn.close()
            return
        try:
            target = socket.create_connection(("127.0.0.1", self.target_port))
        except OSError:
            tls.close()
            return

        def copy(source: socket.socket, sink: socket.socket) -> None:
            try:
                while data := source.recv(65536):
                    sink.sendall(data)
            except OSError:
                pass
            finally:
                for side in (source, sink):
                    try:
                        side.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

        threading.Thread(target=copy, args=(target, tls), daemon=True).start()
        copy(tls, target)
