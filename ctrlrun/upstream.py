"""Upstream pins (policy v8 ``upstream:`` on an action entry, §E3): the MCP server a gateway call
reaches must be the one the policy names.

- ``tool_schema_sha256: "sha256:<64hex>"`` pins the tool's whole ``tools/list`` entry (its name,
  description, input schema ...): ``tool_schema_hash(entry)``.
- ``tls_cert_sha256: ["sha256:<64hex>", ...]`` (a list, for rotation) and ``tls_cert_file``
  (PEM files, each hashing to a listed digest, checked when the policy is read; their text is kept
  as ``tls_cert_pem``) pin the upstream's TLS certificate: ``cert_hash(der)``.
  ``pinned_context(pems)`` is an SSL client context whose only trust anchors are those files.

Observations are per process, keyed by the upstream URL and the **action name**
(``mcp.<alias>.<tool>``), the name the check looks them up under (the reference records a tool's
schema under its bare name and looks it up under the action name, so its schema pins never match).
``check(pin, upstream, action)`` says why a call is refused: ``upstream_unverified`` (nothing
observed) or ``upstream_mismatch`` (a different certificate or schema), or None. Standard
library only.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import ssl
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from .canonical import canonical_bytes

__all__ = ["TOOL_SCHEMA", "PIN_PATTERN", "tool_schema_hash", "cert_hash", "pem_cert_hash", "observe_certificate",
           "observe_tool_schema", "forget", "check", "UNVERIFIED", "MISMATCH", "verified", "is_verified",
           "pinned_context", "certificate_refusal", "pem_first_certificate"]

TOOL_SCHEMA = "ctrlrun.upstream.tool_schema/v1"
PIN_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
UNVERIFIED, MISMATCH = "upstream_unverified", "upstream_mismatch"

_lock = threading.Lock()
_certificates: dict[str, str] = {}
_schemas: dict[tuple[str, str], str] = {}
#: The action whose pins the gateway has just checked (the kernel refuses any other pinned call).
_verified: ContextVar[str | None] = ContextVar("ctrlrun_upstream_verified", default=None)


@contextlib.contextmanager
def verified(action: str) -> Iterator[None]:
    """Within: the gateway checked ``action``'s pins for this call (``check`` returned None)."""
    token = _verified.set(action)
    try:
        yield
    finally:
        _verified.reset(token)


def is_verified(action: str) -> bool:
    return _verified.get() == action


def tool_schema_hash(entry: Mapping[str, Any]) -> str:
    """The pin of one ``tools/list`` entry, as ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(canonical_bytes({"schema": TOOL_SCHEMA, "entry": dict(entry)})).hexdigest()


def cert_hash(der: bytes) -> str:
    """The pin of a DER certificate, as ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(der).hexdigest()


def pem_cert_hash(pem: str) -> str:
    """The pin of a PEM certificate (its first certificate)."""
    return cert_hash(_first_der(pem))


_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.S)


def _first_der(pem: str) -> bytes:
    """The DER bytes of the first certificate of a PEM text (a file may hold a chain: the stdlib's
    ``PEM_cert_to_DER_cert`` reads one certificate only). ``ValueError`` when there is none."""
    found = _PEM_CERTIFICATE.search(pem)
    if found is None:
        raise ValueError("no -----BEGIN CERTIFICATE----- block")
    return base64.b64decode("".join(found.group(1).split()), validate=True)


def pem_first_certificate(pem: str) -> str:
    """The first certificate of a PEM text, alone (the one ``pem_cert_hash`` hashes)."""
    return ssl.DER_cert_to_PEM_cert(_first_der(pem))


def pinned_context(pems: Iterable[str]) -> ssl.SSLContext:
    """A TLS client context whose only trust anchors are the PEM certificates ``pems`` (no system
    store): the server must present one of them, or a chain ending in one
    (``VERIFY_X509_PARTIAL_CHAIN`` lets a pinned certificate that is not a root anchor the chain).
    The host name is still checked against the certificate."""
    pems = [pem for pem in pems if pem.strip()]
    if not pems:
        raise ValueError("pinned_context needs at least one PEM certificate")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata="\n".join(pems))
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def certificate_refusal(pin: Mapping[str, Any] | None, der: bytes | None) -> str | None:
    """Why the certificate ``der`` a connection presented does not satisfy ``pin``'s
    ``tls_cert_sha256`` (None: it does, or nothing pins a certificate)."""
    digests = (pin or {}).get("tls_cert_sha256") or ()
    if not digests:
        return None
    if der is None:
        return "the connection presented no TLS certificate (a certificate pin needs an https:// upstream)"
    digest = cert_hash(der)
    if digest not in digests:
        return f"the connection presented certificate {digest}, which tls_cert_sha256 does not list"
    return None


def observe_certificate(upstream: str, der: bytes | None) -> None:
    with _lock:
        if der is None:
            _certificates.pop(upstream, None)
        else:
            _certificates[upstream] = cert_hash(der)


def observe_tool_schema(upstream: str, action: str, entry: Mapping[str, Any] | None) -> None:
    """Record (or, with None: the tool is gone, forget) what ``action``'s tool looks like now."""
    with _lock:
        if entry is None:
            _schemas.pop((upstream, action), None)
        else:
            _schemas[(upstream, action)] = tool_schema_hash(entry)


def forget(upstream: str | None = None) -> None:
    """Drop the observations of one upstream (or of all)."""
    with _lock:
        for key in [key for key in _certificates if upstream is None or key == upstream]:
            del _certificates[key]
        for key in [key for key in _schemas if upstream is None or key[0] == upstream]:
            del _schemas[key]


def check(pin: Mapping[str, Any] | None, upstream: str | None, action: str) -> str | None:
    """Why a call of ``action`` through ``upstream`` is refused under ``pin``, or None (no pin, or
    every pin holds). In-process (``upstream`` None) a pinned action is always unverified."""
    if not pin:
        return None
    if upstream is None:
        return UNVERIFIED
    with _lock:
        certificate = _certificates.get(upstream)
        schema = _schemas.get((upstream, action))
    digests = pin.get("tls_cert_sha256") or ()
    if digests:
        if certificate is None:
            return UNVERIFIED
        if certificate not in digests:
            return MISMATCH
    wanted = pin.get("tool_schema_sha256")
    if wanted:
        if schema is None:
            return UNVERIFIED
        if schema != wanted:
            return MISMATCH
    return None
