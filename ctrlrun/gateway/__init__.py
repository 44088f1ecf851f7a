"""The MCP gateway (§E1/§E2): a Streamable-HTTP proxy in front of one MCP server that makes every
``tools/call`` a protected call. ``GatewayApp`` is the ASGI application; ``ctrlrun gateway`` and
``manage.py mcp_gateway`` serve it. Named ``ctrlrun.gateway`` (not ``ctrlrun.mcp``) so that it never
shadows the ``mcp`` SDK it is built on; its modules import it absolutely.

Importing this package needs the ``mcp`` extra (``mcp``, ``uvicorn``, ``httpx``).
"""
from __future__ import annotations

try:
    import mcp.types  # noqa: F401  (the SDK: its models frame every message the gateway writes)
except ImportError as exc:  # pragma: no cover - the extra is in the test extra
    from ctrlrun.errors import InvalidArgument

    raise InvalidArgument("the MCP gateway needs the mcp SDK: pip install 'mcp>=2.3' 'uvicorn>=0.30'") from exc

from ctrlrun.gateway.app import GatewayApp, fixed_principal  # noqa: E402
from ctrlrun.gateway.asgi import mount  # noqa: E402

__all__ = ["GatewayApp", "fixed_principal", "mount"]
