"""The gateway inside a Django project's ASGI application.

``mount(application, gateway)`` answers the gateway's path with ``gateway`` and every other path
with ``application`` (Django's ``get_asgi_application()``): one server process, one database, the
same console, approvers and signals. Serve it with gunicorn's uvicorn workers::

    gunicorn yourproject.asgi:application -k uvicorn.workers.UvicornWorker

The gateway's calls run under the process's default Control (``CTRLRUN_POLICY``,
``CTRLRUN_DATABASE``), unless the ``GatewayApp`` was given a Control of its own. ``mount(...,
otel=True)`` makes a span of each call (docs/observability.md), through the project's tracer provider.
"""
from __future__ import annotations

from typing import Any

from ctrlrun.errors import InvalidArgument
from ctrlrun.gateway.app import GatewayApp

__all__ = ["mount"]


def mount(application: Any, gateway: GatewayApp, *, otel: bool = False, otel_arguments: bool = False,
          tracer_provider: Any = None, hide_denied_tools: bool | None = None) -> Any:
    """An ASGI application: ``gateway`` at ``gateway.path``, ``application`` everywhere else.

    ``otel=True`` traces the gateway's calls (``GatewayApp.trace``: a span per ``tools/call``, through
    ``tracer_provider`` or OpenTelemetry's global one), ``otel_arguments=True`` with argument values.
    ``hide_denied_tools=True`` is ``--hide-denied-tools`` (the same as ``GatewayApp(hide_denied_tools=True)``):
    ``tools/list`` leaves out the tools the policy denies outright. None keeps the gateway's own setting."""
    if not isinstance(gateway, GatewayApp):
        raise InvalidArgument(f"mount(application, gateway): gateway must be a ctrlrun.gateway.GatewayApp, not "
                              f"{type(gateway).__name__}")
    if hide_denied_tools is not None:
        if not isinstance(hide_denied_tools, bool):
            raise InvalidArgument(f"mount(..., hide_denied_tools=...) must be True or False, got {hide_denied_tools!r}")
        gateway.hide_denied_tools = hide_denied_tools
    if not callable(application):
        raise InvalidArgument("mount(application, gateway): application must be an ASGI application (e.g. "
                              "django.core.asgi.get_asgi_application())")
    if otel or otel_arguments:
        gateway.trace(otel=otel, arguments=otel_arguments, tracer_provider=tracer_provider)
    path = gateway.path

    async def dispatch(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (scope.get("path", "").rstrip("/") or "/") == path:
            await gateway(scope, receive, send)
        else:
            await application(scope, receive, send)

    return dispatch
