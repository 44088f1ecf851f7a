"""OpenTelemetry at the gateway (``--otel``): one span per ``tools/call``, continuing the client's trace
and carried on to the upstream.

``GatewaySpans`` is the action sink of ``ctrlrun.otel`` (``OTelEventSink``: the driver's
``around_function`` hook opens the span live around the upstream exchange, the §F4 status mapping,
the ``ctrlrun.*`` attributes, ``ctrlrun.argument.*`` only with ``arguments=True``), registered for the
process but opening spans only for its own gateway's calls. Each span is a ``SERVER`` span named
after the action (``mcp.<alias>.<tool>``), whose parent is the client's W3C trace context
(``params._meta.traceparent`` first, as OpenTelemetry's MCP conventions say, else the HTTP
``traceparent`` header, linked when both are there and differ), with OpenTelemetry's MCP / GenAI /
JSON-RPC attributes. While the upstream exchange runs the span is current, and its context replaces
the client's in the HTTP headers and in ``params._meta`` of what is sent on, so the upstream's spans
are its children. The span ends once the client's answer is known: ``rpc.response.status_code``
names a JSON-RPC error the client got, ``error.type`` the error of a call whose span is ``ERROR``.
A call with no receipt (waiting for a person) ends its span then too; one the gateway answered before
any action was recorded gets a span of its own (``CallTrace.answered``): every call has one.

``environment_provider()`` is the ``ctrlrun gateway --otel`` exporter set-up from the standard
``OTEL_*`` variables.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from ctrlrun import observers
from ctrlrun.otel import SPAN_NAME, MissingDependency, OTelEventSink
from ctrlrun.gateway.wire import shown_url

logger = logging.getLogger("ctrlrun.otel")

__all__ = ["GatewaySpans", "CallTrace", "traced", "environment_provider", "NEEDS", "SEMCONV"]

#: The attribute names of OpenTelemetry's semantic conventions used here (MCP, GenAI, JSON-RPC, RPC,
#: network, client, error), as ``opentelemetry-semantic-conventions`` names them (tests compare).
MCP_METHOD_NAME, MCP_PROTOCOL_VERSION, MCP_SESSION_ID = "mcp.method.name", "mcp.protocol.version", "mcp.session.id"
JSONRPC_REQUEST_ID, RPC_RESPONSE_STATUS_CODE, ERROR_TYPE = "jsonrpc.request.id", "rpc.response.status_code", "error.type"
GEN_AI_OPERATION_NAME, GEN_AI_TOOL_NAME = "gen_ai.operation.name", "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
NETWORK_TRANSPORT, NETWORK_PROTOCOL_NAME = "network.transport", "network.protocol.name"
CLIENT_ADDRESS, CLIENT_PORT = "client.address", "client.port"
SEMCONV = {
    "mcp_attributes": {"MCP_METHOD_NAME": MCP_METHOD_NAME, "MCP_PROTOCOL_VERSION": MCP_PROTOCOL_VERSION,
                       "MCP_SESSION_ID": MCP_SESSION_ID},
    "jsonrpc_attributes": {"JSONRPC_REQUEST_ID": JSONRPC_REQUEST_ID},
    "rpc_attributes": {"RPC_RESPONSE_STATUS_CODE": RPC_RESPONSE_STATUS_CODE},
    "error_attributes": {"ERROR_TYPE": ERROR_TYPE},
    "gen_ai_attributes": {"GEN_AI_OPERATION_NAME": GEN_AI_OPERATION_NAME, "GEN_AI_TOOL_NAME": GEN_AI_TOOL_NAME,
                          "GEN_AI_TOOL_CALL_ARGUMENTS": GEN_AI_TOOL_CALL_ARGUMENTS},
    "network_attributes": {"NETWORK_TRANSPORT": NETWORK_TRANSPORT, "NETWORK_PROTOCOL_NAME": NETWORK_PROTOCOL_NAME},
    "client_attributes": {"CLIENT_ADDRESS": CLIENT_ADDRESS, "CLIENT_PORT": CLIENT_PORT},
}

#: What ``--otel`` needs installed (the otel extra is the API and the SDK; OTLP's exporter is apart).
NEEDS = "pip install 'django-ctrlrun[otel]' opentelemetry-exporter-otlp-proto-http"

#: Trace-context keys the gateway writes itself on what it sends on (the client's are replaced).
_CONTEXT_KEYS = ("traceparent", "tracestate")
_ERROR_RESULTS = frozenset({"failed", "ambiguous"})
#: ctrlrun's refusals (-41001 ... -41016): not errors of the call (§F4 leaves them UNSET).
_REFUSAL_CODES = frozenset(range(-41016, -41000))

_call: ContextVar[CallTrace | None] = ContextVar("ctrlrun_gateway_trace", default=None)


class CallTrace:
    """One traced ``tools/call``: the client's context, the span's attributes, the actions whose spans it
    opened and the spans their receipts closed (ended once the answer is known)."""

    def __init__(self, sink: GatewaySpans, name: str, parent: Any, links: list[Any], attributes: dict[str, Any]) -> None:
        self.sink, self.name, self.parent, self.links, self.attributes = sink, name, parent, links, attributes
        self.held: list[tuple[Any, dict[str, Any], int | None]] = []
        self.opened: list[str] = []
        self.started, self.done = time.time_ns(), False

    def outgoing(self, body: bytes, message: dict[str, Any], headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        """The body and headers to send on, carrying the current span's context (called inside the span);
        ``body`` and ``headers`` as they are if that fails (logged)."""
        try:
            from opentelemetry import propagate

            from ctrlrun.gateway.wire import dumps

            sent = {k: v for k, v in headers.items() if k.lower() not in _CONTEXT_KEYS}
            propagate.inject(sent)
            params = dict(message.get("params") or {})
            meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
            meta = {k: v for k, v in meta.items() if k not in _CONTEXT_KEYS}
            propagate.inject(meta)
            if meta or "_meta" in params:
                params["_meta"] = meta
            return dumps({**message, "params": params}), sent
        except Exception:
            logger.exception("the trace context could not be added to the upstream call")
            return body, headers

    def answered(self, body: Any) -> None:
        """End the call's spans, the last with what the client was told (a failure is logged). A span
        with no receipt yet (a call waiting for a person) ends here too; a call the gateway answered
        before any action was recorded (a re-sent call still waiting, a missing principal) gets a span
        of its own, so every ``tools/call`` has one."""
        if self.done:
            return
        self.done = True
        held, opened = self.held, self.opened
        try:
            with self.sink._lock:
                unreceipted = [self.sink._spans.pop(action_id) for action_id in opened if action_id in self.sink._spans]
                for action_id in opened:
                    self.sink._live.pop(action_id, None)
            if not held and not unreceipted and not opened:
                unreceipted = [self.sink._tracer.start_span(self.name, context=self.parent, kind=self.sink._kind,
                                                            attributes=self.attributes, links=self.links,
                                                            start_time=self.started)]
            ends = [(span, receipt.get("result"), end_time) for span, receipt, end_time in held]
            ends += [(span, None, None) for span in unreceipted]
        except Exception:
            logger.exception("a gateway span could not be ended")
            return
        for index, (span, result, end_time) in enumerate(ends):
            try:
                if index == len(ends) - 1:
                    attributes = _answer_attributes(body, result)
                    span.set_attributes(attributes)
                    if result is None and ERROR_TYPE in attributes:
                        from opentelemetry.trace import Status, StatusCode

                        error = body.get("error") or {}
                        span.set_status(Status(StatusCode.ERROR, str(error.get("message", ""))))
                span.end(end_time=end_time)
            except Exception:
                logger.exception("a gateway span could not be ended")


def _answer_attributes(body: Any, result: Any) -> dict[str, str]:
    """``rpc.response.status_code`` for a JSON-RPC error; ``error.type`` where the span is an error: a
    ``failed`` or ``ambiguous`` call, or (no receipt) an error that is not one of ctrlrun's refusals."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), int):
        code = str(error["code"])
        failed = result in _ERROR_RESULTS or result is None and error["code"] not in _REFUSAL_CODES
        return {RPC_RESPONSE_STATUS_CODE: code, **({ERROR_TYPE: code} if failed else {})}
    answer = body.get("result") if isinstance(body, dict) else None
    if isinstance(answer, dict) and answer.get("isError") is True and result in _ERROR_RESULTS:
        return {ERROR_TYPE: "tool_error"}
    return {}


class GatewaySpans(OTelEventSink):
    """The gateway's action spans (see the module's text); ``close()`` stops it."""

    def __init__(self, *, tracer_provider: Any = None, arguments: bool = False) -> None:
        super().__init__(tracer_provider=tracer_provider, arguments=arguments)
        from opentelemetry.trace import SpanKind

        self._kind = SpanKind.SERVER
        observers.register(self)

    def close(self) -> None:
        super().close()
        observers.unregister(self)

    def begin(self, request: Any, message: dict[str, Any], revision: str, alias: str, upstream: str) -> CallTrace:
        """The trace of one ``tools/call`` (``request``: the Starlette request)."""
        from opentelemetry import propagate, trace
        from opentelemetry.trace import Link

        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        from_meta = _valid(propagate.extract({k: v for k, v in meta.items() if isinstance(v, str)}), trace)
        from_header = _valid(propagate.extract({k.lower(): v for k, v in request.headers.items()}), trace)
        parent, links = from_meta or from_header, []
        if from_meta is not None and from_header is not None:
            mine, theirs = (trace.get_current_span(c).get_span_context() for c in (from_meta, from_header))
            if (mine.trace_id, mine.span_id) != (theirs.trace_id, theirs.span_id):
                links.append(Link(theirs))
        tool = params.get("name")
        attributes: dict[str, Any] = {
            MCP_METHOD_NAME: "tools/call", GEN_AI_OPERATION_NAME: "execute_tool", MCP_PROTOCOL_VERSION: revision,
            NETWORK_TRANSPORT: "tcp", NETWORK_PROTOCOL_NAME: "http",
            "ctrlrun.gateway.alias": alias, "ctrlrun.gateway.upstream": shown_url(upstream),
        }
        if isinstance(tool, str):
            attributes[GEN_AI_TOOL_NAME] = tool
        if message.get("id") is not None:
            attributes[JSONRPC_REQUEST_ID] = str(message["id"])
        session = request.headers.get("mcp-session-id")
        if session:
            attributes[MCP_SESSION_ID] = session
        if request.client is not None:
            attributes[CLIENT_ADDRESS], attributes[CLIENT_PORT] = request.client.host, request.client.port
        if self.arguments and isinstance(params.get("arguments"), dict):
            attributes[GEN_AI_TOOL_CALL_ARGUMENTS] = json.dumps(params["arguments"], ensure_ascii=False,
                                                                sort_keys=True, default=str)
        name = f"mcp.{alias}.{tool}" if isinstance(tool, str) and tool else "tools/call"
        return CallTrace(self, name, parent, links, attributes)

    # ---------------------------------------------------------------- only this gateway's calls

    def _mine(self) -> CallTrace | None:
        found = _call.get()
        return found if found is not None and found.sink is self else None

    def _known(self, action_id: Any) -> bool:
        with self._lock:
            return action_id in self._spans

    def on_event(self, event: Any) -> None:
        if self._mine() is not None or self._known(event.action_id):
            super().on_event(event)

    def on_receipt(self, receipt: dict[str, Any]) -> None:
        if self._mine() is not None or self._known(receipt.get("action_id")):
            super().on_receipt(receipt)

    def _current(self, action: Any) -> Any:
        return super()._current(action) if self._mine() is not None else nullcontext()

    def _start(self, action_id: str, name: str | None, start_time: int | None) -> Any:
        span = super()._start(action_id, name, start_time)
        call = self._mine()
        if call is not None:
            call.opened.append(action_id)
        return span

    def _new_span(self, start_time: int | None) -> Any:
        call = self._mine()
        if call is None:
            return super()._new_span(start_time)
        return self._tracer.start_span(SPAN_NAME, context=call.parent, kind=self._kind, attributes=call.attributes,
                                       links=call.links, start_time=start_time)

    def _end(self, span: Any, receipt: dict[str, Any], end_time: int | None) -> None:
        call = self._mine()
        if call is None:
            super()._end(span, receipt, end_time)
        else:  # ended by the gateway once the client's answer is known (CallTrace.answered)
            call.held.append((span, receipt, end_time))


def _valid(context: Any, trace: Any) -> Any:
    return context if trace.get_current_span(context).get_span_context().is_valid else None


@contextmanager
def traced(sink: GatewaySpans | None, *args: Any) -> Iterator[CallTrace | None]:
    """The block of one ``tools/call`` (``sink.begin(*args)``; nothing without a sink): its spans end
    on ``answered()``, or as the block is left."""
    call = None
    if sink is not None:
        try:
            call = sink.begin(*args)
        except Exception:  # the call goes on untraced
            logger.exception("the gateway could not trace a tools/call")
    if call is None:
        yield None
        return
    token = _call.set(call)
    try:
        yield call
    finally:
        _call.reset(token)
        call.answered(None)


# ---------------------------------------------------------------- ctrlrun gateway --otel

_OTLP = {"http/protobuf": ("otlp_proto_http", "opentelemetry-exporter-otlp-proto-http"),
         "grpc": ("otlp_proto_grpc", "opentelemetry-exporter-otlp-proto-grpc")}


def environment_provider() -> tuple[Any, list[str]]:
    """A tracer provider from the standard ``OTEL_*`` variables, and the banner's line.

    ``OTEL_TRACES_EXPORTER`` (default ``otlp``; comma-separated; ``none``) names span exporters by
    their entry points (``opentelemetry_traces_exporter``), ``otlp`` taking its protocol from
    ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` (default
    ``http/protobuf``). The exporters read their own variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` ...),
    the provider ``OTEL_TRACES_SAMPLER`` and ``OTEL_SDK_DISABLED``, the resource
    ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (service ``ctrlrun-gateway`` when neither
    names one), the batch processor ``OTEL_BSP_*``, the propagators ``OTEL_PROPAGATORS``. Raises
    ``MissingDependency`` (what to install) when the SDK or a named exporter is not installed."""
    try:
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise MissingDependency(f"--otel needs OpenTelemetry's SDK and an exporter: {NEEDS}") from None
    from importlib.metadata import entry_points

    names = [name.strip().lower() for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if name.strip()]
    exporters, shown = [], []
    for asked in names or ["otlp"]:
        if asked == "none":
            continue
        name, install = asked, "the package that provides it"
        if name in ("otlp", "otlp_proto_http", "otlp_proto_grpc"):
            protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
            if name == "otlp" and protocol not in _OTLP:
                raise MissingDependency(f"--otel: the OTLP protocol {protocol!r} is not supported here; use "
                                        f"{' or '.join(_OTLP)}")
            name = _OTLP[protocol][0] if name == "otlp" else name
            install = "pip install 'django-ctrlrun[otel]' " + next(pkg for entry, pkg in _OTLP.values() if entry == name)
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            raise MissingDependency(f"--otel: the span exporter {name!r} (OTEL_TRACES_EXPORTER={asked}) is not "
                                    f"installed: {install}, or set OTEL_TRACES_EXPORTER to one that is (console "
                                    f"prints the spans)")
        try:
            exporters.append(found[0].load()())
        except Exception as exc:  # a broken install or a variable the exporter refuses: said, not a traceback
            raise MissingDependency(f"--otel: the span exporter {name!r} could not be made: "
                                    f"{type(exc).__name__}: {exc}") from None
        shown.append(name)
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "ctrlrun-gateway"}))
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    where = ", ".join(shown) if shown else "none (OTEL_TRACES_EXPORTER=none: spans are made, not sent)"
    return provider, [f"otel: spans to {where}, service {resource.attributes.get(SERVICE_NAME)}"]
