"""The gateway's wire values (§E1): error codes and tokens, protocol revisions, request checks.

Frozen interface: the codes ``-41001..-41016``, their ``data.error`` tokens and HTTP statuses,
``_meta["com.ctrlrun/receipt"]`` and the accepted protocol revisions are what clients and
dashboards match on. The JSON-RPC framing itself is the ``mcp`` SDK's (``mcp.types``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from mcp.types import JSONRPCError, JSONRPCResponse

__all__ = ["ERRORS", "GatewayError", "CURRENT_REVISION", "REVISIONS", "RECEIPT_META", "ALIAS_PATTERN",
           "MAX_DEPTH", "error_body", "find_unrepresentable", "check_mirror_headers", "depth_exceeds"]

#: The receipt stamp on every intercepted answer that reached the upstream.
RECEIPT_META = "com.ctrlrun/receipt"

CURRENT_REVISION = "2026-07-28"
#: Accepted revisions; a request without ``MCP-Protocol-Version`` is the oldest (the spec's default).
REVISIONS = (CURRENT_REVISION, "2025-11-25", "2025-06-18", "2025-03-26")
DEFAULT_REVISION = "2025-03-26"

ALIAS_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

#: Deeper JSON than this is refused before it is parsed into an action (a stack bomb is cheap to send).
MAX_DEPTH = 64

#: name -> (code, token, HTTP status)
ERRORS: dict[str, tuple[int, str, int]] = {
    "denied": (-41001, "ctrlrun.denied", 403),
    "approval_required": (-41002, "ctrlrun.approval_required", 403),
    "approval_denied": (-41003, "ctrlrun.approval_denied", 403),
    "duplicate_effect": (-41004, "ctrlrun.duplicate_effect", 409),
    "ambiguous_effect": (-41005, "ctrlrun.ambiguous_effect", 409),
    "blocked": (-41006, "ctrlrun.blocked", 409),
    "no_principal": (-41007, "ctrlrun.no_principal", 403),
    "unrepresentable_argument": (-41008, "ctrlrun.unrepresentable_argument", 400),
    "unknown_continuation": (-41009, "ctrlrun.unknown_continuation", 400),
    "upstream_ambiguous": (-41010, "ctrlrun.upstream_ambiguous", 502),
    "upstream_not_executed": (-41011, "ctrlrun.upstream_not_executed", 502),
    "unauthorized": (-41012, "ctrlrun.unauthorized", 403),
    "not_a_human": (-41013, "ctrlrun.not_a_human", 403),
    "principal_expired": (-41014, "ctrlrun.principal_expired", 403),
    "not_entitled": (-41015, "ctrlrun.not_entitled", 403),
    "upstream_unpinned": (-41016, "ctrlrun.upstream_unpinned", 403),
}

#: JSON-RPC's own codes the gateway answers with (the SDK names some of them; these are the values).
PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022


@dataclass
class GatewayError(Exception):
    """A refusal the gateway answers itself: a JSON-RPC error with an HTTP status."""

    code: int
    message: str
    status: int
    data: dict[str, Any] | None = None
    request_id: Any = None

    @classmethod
    def of(cls, name: str, message: str, rpc_id: Any = None, /, **data: Any) -> GatewayError:
        """The error ``name`` of the table; ``data`` joins its ``data.error`` token."""
        code, token, status = ERRORS[name]
        return cls(code, message, status, {"error": token, **data}, rpc_id)

    def body(self) -> dict[str, Any]:
        return error_body(self.request_id, self.code, self.message, self.data)


def error_body(request_id: Any, code: int, message: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON-RPC error object, built and checked by the SDK's model."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    model = JSONRPCError.model_validate({"jsonrpc": "2.0", "id": request_id, "error": error})
    return model.model_dump(by_alias=True, exclude_none=True, mode="json") | {"id": request_id}


def result_body(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    JSONRPCResponse.model_validate({"jsonrpc": "2.0", "id": request_id, "result": result})
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def depth_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Does this JSON text nest deeper than ``limit``? Counted on the bytes, outside strings,
    before ``json.loads`` recurses into it."""
    depth, in_string, escaped = 0, False, False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def _pointer_token(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def find_unrepresentable(value: Any, pointer: str = "") -> str | None:
    """The JSON pointer (``/amount``) of the first value ctrlrun's canonical form cannot hold
    exactly (a float: ``1.5``, ``1e3``), else None."""
    if isinstance(value, float):
        return pointer or "/"
    if isinstance(value, dict):
        for key, item in value.items():
            found = find_unrepresentable(item, f"{pointer}/{_pointer_token(str(key))}")
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = find_unrepresentable(item, f"{pointer}/{index}")
            if found:
                return found
    return None


def _header_value(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    return None


def check_mirror_headers(headers: dict[str, str], message: dict[str, Any], revision: str) -> None:
    """The ``Mcp-Method`` / ``Mcp-Name`` / ``Mcp-Param-*`` mirrors agree with the body (every
    revision, when present); the current revision requires ``Mcp-Method`` (and ``Mcp-Name`` on a
    call). A disagreement is ``-32020 HeaderMismatch``."""
    request_id = message.get("id")
    method = message.get("method")
    params = message.get("params") if isinstance(message.get("params"), dict) else {}
    mirrored = {"mcp-method": method}
    if method == "tools/call":
        mirrored["mcp-name"] = params.get("name")
    elif method in ("resources/read",):
        mirrored["mcp-name"] = params.get("uri")
    elif method in ("prompts/get",):
        mirrored["mcp-name"] = params.get("name")

    def mismatch(text: str) -> GatewayError:
        return GatewayError(HEADER_MISMATCH, f"HeaderMismatch: {text}", 400, None, request_id)

    if revision == CURRENT_REVISION:
        if "mcp-method" not in headers:
            raise mismatch("the Mcp-Method header is required on protocol revision " + CURRENT_REVISION)
        if method == "tools/call" and "mcp-name" not in headers:
            raise mismatch("the Mcp-Name header is required on a tools/call at revision " + CURRENT_REVISION)
    for header, expected in mirrored.items():
        if header in headers and headers[header] != _header_value(expected):
            raise mismatch(f"{header} is {headers[header]!r} but the body says {expected!r}")
    arguments = params.get("arguments") if isinstance(params.get("arguments"), dict) else {}
    for header, given in headers.items():
        if header.startswith("mcp-param-"):
            name = header[len("mcp-param-"):]
            match = next((k for k in arguments if k.lower() == name), None)
            if match is None or _header_value(arguments[match]) != given:
                raise mismatch(f"{header} is {given!r} but the body's argument is "
                               f"{arguments.get(match) if match else 'absent'!r}")


def dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def shown_url(url: str) -> str:
    """An upstream's URL as evidence and traces show it: without credentials or a query (a token
    there is for the upstream, not for the event chain or a tracing backend)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # a port that is not a number: keep the scheme, say nothing more
        return url.split(":", 1)[0] + "://"
    host = f"[{host}]" if ":" in host else host
    return urlunsplit((parts.scheme, host + (f":{port}" if port else ""), parts.path, "", ""))
