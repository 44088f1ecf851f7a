"""The gateway as an ASGI application: Streamable HTTP in front of one upstream MCP server.

``GatewayApp(upstream=..., alias=..., principal=...)`` is mounted by a Django project's ASGI
entry (served by gunicorn with uvicorn workers, or uvicorn alone), or run by ``ctrlrun gateway``.
Every ``tools/call`` is a protected call (``ctrlrun.gateway.calls``); every other message is relayed
unchanged, its answer streamed back. Refused before anything else: a body over the limit (413),
a batch (``-32600``), JSON that does not parse (``-32700``) or nests deeper than ``MAX_DEPTH``
(``-32600``), an unsupported protocol revision (``-32022``), mirror headers that contradict the
body (``-32020``). An upstream's ``input_required`` suspends the call until the client answers it
(``ctrlrun.gateway.elicitation``): the suspension lasts the Control's ``suspend_timeout`` (the
``elicitation_timeout``), at most ``max_elicitation_rounds`` times per call.

With ``webhook_secret`` (``--webhook-url``) the gateway also takes the signed answers to webhook
approval requests at ``POST /ctrlrun/approvals/<request_id>`` (``ctrlrun.webhook.handle_inbound``,
on the store's threads): the ``respond_to`` of the requests it delivers under ``--public-url``.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ctrlrun.canonical import Principal
from ctrlrun.errors import CTRLRunError, InvalidArgument
from ctrlrun.gateway import upstream as wire_upstream
from ctrlrun.gateway.calls import intercept
from ctrlrun.gateway.elicitation import MAX_ELICITATION_ROUNDS
from ctrlrun.gateway.listing import Malformed, without_hidden
from ctrlrun.gateway.origin import Sessions, client_info
from ctrlrun.gateway.origin import origin as origin_of
from ctrlrun.gateway.tracing import traced
from ctrlrun.kernel.context import call_origin
from ctrlrun.gateway.wire import (
    ALIAS_PATTERN,
    DEFAULT_REVISION,
    INVALID_REQUEST,
    MAX_DEPTH,
    PARSE_ERROR,
    REVISIONS,
    UNSUPPORTED_VERSION,
    GatewayError,
    check_mirror_headers,
    depth_exceeds,
    dumps,
    error_body,
)

__all__ = ["GatewayApp", "fixed_principal", "DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_RESPONSE_BYTES"]

logger = logging.getLogger("ctrlrun.gateway")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024
DEFAULT_UPSTREAM_TIMEOUT = 30.0

#: Where the gateway takes signed webhook answers (the ``respond_to`` path, as ``ctrlrun.urls`` serves it).
_ANSWERS = "/ctrlrun/approvals/"

#: Request headers the gateway keeps to itself (identity headers are for the gateway, not the tool).
_NOT_FORWARDED = frozenset({"origin", "cookie"})


def fixed_principal(agent: str, user: str | None = None) -> Callable[[Request], Principal | None]:
    """``--principal NAME``: every request acts for this agent."""
    principal = Principal(agent=agent, user=user)
    return lambda request: principal


class GatewayApp:
    """An ASGI application serving ``path`` (default ``/mcp``)."""

    def __init__(self, *, upstream: str, alias: str, principal: Callable[[Request], Principal | None] | None = None,
                 control: Any = None, private_headers: tuple[str, ...] = (), path: str = "/mcp", upstream_timeout: float = DEFAULT_UPSTREAM_TIMEOUT,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
                 allow_origins: tuple[str, ...] = (), otel: bool = False, otel_arguments: bool = False,
                 tracer_provider: Any = None, webhook_secret: bytes | None = None,
                 webhook_replay_window: float = 300, max_elicitation_rounds: int = MAX_ELICITATION_ROUNDS,
                 hide_denied_tools: bool = False) -> None:
        if not isinstance(upstream, str) or not upstream.startswith(("http://", "https://")):
            raise InvalidArgument(f"the upstream must be an http:// or https:// URL of an MCP server, not {upstream!r}")
        if not isinstance(alias, str) or not ALIAS_PATTERN.match(alias):
            raise InvalidArgument(f"the alias {alias!r} must match {ALIAS_PATTERN.pattern} (it names the actions "
                                  f"mcp.<alias>.<tool>)")
        if not path.startswith("/") or path.rstrip("/").startswith("/ctrlrun") and (
                path.rstrip("/") == "/ctrlrun" or path.startswith("/ctrlrun/")):
            raise InvalidArgument(f"the path {path!r} must start with '/' and may not be under /ctrlrun/ "
                                  f"(the console's)")
        for name, value in (("max_body_bytes", max_body_bytes), ("max_response_bytes", max_response_bytes)):
            if not isinstance(value, int) or value < 1024:
                raise InvalidArgument(f"{name} must be an integer of at least 1024 bytes, got {value!r}")
        if isinstance(max_elicitation_rounds, bool) or not isinstance(max_elicitation_rounds, int) \
                or max_elicitation_rounds < 1:
            raise InvalidArgument(f"max_elicitation_rounds must be a whole number of at least 1, got "
                                  f"{max_elicitation_rounds!r}")
        if not isinstance(hide_denied_tools, bool):
            raise InvalidArgument(f"hide_denied_tools must be True or False, got {hide_denied_tools!r}")
        if not upstream_timeout or upstream_timeout <= 0:
            raise InvalidArgument(f"the upstream timeout must be a positive number of seconds, got {upstream_timeout!r}")
        self.upstream, self.alias, self.principal = upstream, alias, principal
        self.path = path.rstrip("/") or "/"
        self.upstream_timeout, self.max_body_bytes = float(upstream_timeout), max_body_bytes
        self.max_response_bytes, self.allow_origins = max_response_bytes, tuple(allow_origins)
        self.max_elicitation_rounds = max_elicitation_rounds
        self._control = control
        if webhook_secret is not None:
            from ctrlrun.webhook import MIN_SECRET_BYTES

            if not isinstance(webhook_secret, bytes) or len(webhook_secret) < MIN_SECRET_BYTES:
                raise InvalidArgument(f"webhook_secret must be bytes, at least {MIN_SECRET_BYTES} of them "
                                      f"(ctrlrun.webhook.webhook_secret reads one)")
        self.webhook_secret, self.webhook_replay_window = webhook_secret, float(webhook_replay_window)
        #: ``--hide-denied-tools``: tools/list answers leave out what the policy denies outright.
        self.hide_denied_tools = hide_denied_tools
        #: The clientInfo of the sessions whose initialize this gateway relayed (for each call's origin).
        self.sessions = Sessions()
        # Headers an identity provider reads are the gateway's: never passed on to the tool.
        self._not_forwarded = _NOT_FORWARDED | {name.strip().lower() for name in private_headers}
        self._tracing: Any = None
        if otel or otel_arguments:
            self.trace(otel=otel, arguments=otel_arguments, tracer_provider=tracer_provider)

    def trace(self, *, otel: bool = True, arguments: bool = False, tracer_provider: Any = None) -> None:
        """``--otel``: a span per ``tools/call`` (``ctrlrun.gateway.tracing``), through ``tracer_provider``
        (default: OpenTelemetry's global one); ``arguments``: with the argument values (``--otel-arguments``)."""
        if not isinstance(otel, bool) or not isinstance(arguments, bool):
            raise InvalidArgument(f"otel and otel_arguments are True or False, got {otel!r} and {arguments!r}")
        if arguments and not otel:
            raise InvalidArgument("otel_arguments=True (--otel-arguments) goes with otel=True (--otel): argument "
                                  "values are sent only on the gateway's spans")
        from ctrlrun.gateway.tracing import GatewaySpans

        self.close()
        if otel:
            self._tracing = GatewaySpans(tracer_provider=tracer_provider, arguments=arguments)

    def close(self) -> None:
        """Stop tracing (the spans' sink is unregistered); the gateway goes on serving without."""
        if self._tracing is not None:
            self._tracing.close()
            self._tracing = None

    @property
    def control(self) -> Any:
        if self._control is None:
            from ctrlrun.control import default_control

            self._control = default_control()
        return self._control

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        response = await self.handle(request)
        await response(scope, receive, send)

    # ------------------------------------------------------------------ one HTTP request

    async def handle(self, request: Request) -> Response:
        if self.webhook_secret is not None and request.url.path.startswith(_ANSWERS):
            return await self._webhook_answer(request)
        if (request.url.path.rstrip("/") or "/") != self.path:
            return Response(f"not found: the MCP endpoint is {self.path}\n", status_code=404, media_type="text/plain")
        origin = request.headers.get("origin")
        if origin is not None and not self._origin_ok(origin):
            return _json(403, error_body(None, INVALID_REQUEST, f"origin {origin!r} is not allowed (--allow-origin)"))
        if request.method == "DELETE":  # the client ends its session
            self.sessions.forget(request.headers.get("mcp-session-id"))
        if request.method != "POST":
            return await self._relay(request, b"")
        try:
            body = await self._body(request)
            message, revision = self._message(request, body)
        except GatewayError as refused:
            return _json(refused.status, refused.body())
        if message.get("method") == "initialize":  # its clientInfo names the session's later calls
            params = message.get("params")
            response = await self._relay(request, body)
            self.sessions.remember(response.headers.get("mcp-session-id"),
                                   client_info(params.get("clientInfo")) if isinstance(params, dict) else None)
            return response
        if message.get("method") == "tools/list" and "id" in message and self.hide_denied_tools:
            return await self._listed(request, body, message["id"])
        if message.get("method") != "tools/call" or "id" not in message:
            return await self._relay(request, body)
        with traced(self._tracing, request, message, revision, self.alias, self.upstream) as call:
            status, answer, extra = await self._tools_call(request, body, message, revision, call)
            if call is not None:
                call.answered(answer)
        return _json(status, answer, extra)

    async def _tools_call(self, request: Request, body: bytes, message: dict[str, Any], revision: str,
                          call: Any) -> tuple[int, Any, dict[str, str] | None]:
        headers = wire_upstream.forward_headers(request.headers, drop=self._not_forwarded)
        request_id = message.get("id")

        async def send(pins: Any, params: dict[str, Any] | None = None) -> Any:
            # A continuation leg sends the client's message with the upstream's own requestState.
            outgoing = message if params is None else {**message, "params": params}
            raw = body if params is None else dumps(outgoing)
            sent, sent_headers = call.outgoing(raw, outgoing, headers) if call is not None else (raw, headers)
            return await wire_upstream.exchange(self.upstream, sent, sent_headers, request_id,
                                                timeout=self.upstream_timeout, max_bytes=self.max_response_bytes,
                                                revision=revision, pins=pins)

        params = message.get("params") if isinstance(message.get("params"), dict) else {}

        async def tools(pins: Any) -> Any:
            return await wire_upstream.list_tools(self.upstream, headers, params.get("_meta"),
                                                  timeout=self.upstream_timeout, max_bytes=self.max_response_bytes,
                                                  revision=revision, pins=pins)

        try:
            # With a principal callable it says who acts; without one the Control's identity
            # provider does, reading this request's headers (Control.acall(headers=...)).
            principal = self.principal(request) if self.principal is not None else None
            identity_headers = None if self.principal is not None else {
                name.lower(): value for name, value in request.headers.items()}
            came_from = origin_of(alias=self.alias, upstream=self.upstream, meta=params.get("_meta"),
                                  session_id=request.headers.get("mcp-session-id"),
                                  user_agent=request.headers.get("user-agent"), sessions=self.sessions)
            with call_origin(came_from):  # recorded in the call's ACTION_PROPOSED event
                status, answer, extra = await intercept(self.control, alias=self.alias, request_id=request_id,
                                                        params=params, principal=principal, send=send,
                                                        headers=identity_headers, upstream=self.upstream,
                                                        tools=tools, max_elicitation_rounds=self.max_elicitation_rounds)
        except GatewayError as refused:
            if refused.request_id is None:
                refused.request_id = request_id
            return refused.status, refused.body(), None
        except Exception as exc:  # a fault of the gateway's own (the store away ...): said, not a traceback
            logger.exception("tools/call %s failed inside the gateway", params.get("name"))
            return 500, error_body(request_id, -32603, f"the gateway could not complete this call "
                                                       f"({type(exc).__name__}: {exc}); do not retry blindly: "
                                                       f"look the call up in the console"), None
        return status, answer, extra

    async def _webhook_answer(self, request: Request) -> Response:
        """One signed answer to a webhook approval request (``ctrlrun.webhook.handle_inbound``)."""
        from ctrlrun.webhook import MAX_INBOUND_BYTES, SIGNATURE_HEADER, handle_inbound

        request_id = request.url.path[len(_ANSWERS):]
        if not request_id or "/" in request_id:
            return _text(404, "not found: answers go to /ctrlrun/approvals/<request_id>")
        if request.method != "POST":
            return _text(405, "an answer is a POST")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_INBOUND_BYTES:
                return _text(400, f"the answer is larger than {MAX_INBOUND_BYTES} bytes")
            chunks.append(chunk)
        status, text = await self.control.aread(handle_inbound, request_id, b"".join(chunks),
                                                request.headers.get(SIGNATURE_HEADER), secret=self.webhook_secret,
                                                replay_window=self.webhook_replay_window)
        if status != 200:
            logger.warning("webhook answer to %s refused: %s", request_id, text)
        return _text(status, text)

    def _pinned_files(self) -> list[str]:
        """The certificates this alias's entries pin as files (``tls_cert_file``): the relay trusts
        them besides the usual anchors, so an upstream with a self-signed pinned certificate can be
        initialized and listed through the gateway."""
        try:
            policy = self.control.read_policy()  # in memory; read again only when its file changed
        except CTRLRunError:  # a policy that cannot be read: the relay trusts the usual anchors only
            return []
        prefix = f"mcp.{self.alias}."
        return [pem for name in policy.actions if name.startswith(prefix)
                for pem in ((policy.entry(name).upstream or {}).get("tls_cert_pem") or ())]

    def _origin_ok(self, origin: str) -> bool:
        if origin in self.allow_origins:
            return True
        host = origin.split("://", 1)[-1].split(":", 1)[0].strip("[]")
        return host in ("127.0.0.1", "localhost", "::1")

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise self._too_large()
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self) -> GatewayError:
        return GatewayError(INVALID_REQUEST, f"the request body is larger than the gateway's limit of "
                                             f"{self.max_body_bytes} bytes (--max-body-bytes)", 413)

    def _message(self, request: Request, body: bytes) -> tuple[dict[str, Any], str]:
        if depth_exceeds(body):
            raise GatewayError(INVALID_REQUEST, f"the request nests deeper than {MAX_DEPTH} levels", 400)
        try:
            message = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise GatewayError(PARSE_ERROR, f"the body is not JSON: {exc}", 400) from None
        if isinstance(message, list):
            raise GatewayError(INVALID_REQUEST, "batches are refused: send one JSON-RPC message per request", 400)
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            raise GatewayError(INVALID_REQUEST, "the body must be one JSON-RPC 2.0 message (an object with "
                                                "\"jsonrpc\": \"2.0\")", 400)
        revision = request.headers.get("mcp-protocol-version", DEFAULT_REVISION)
        if revision not in REVISIONS:
            raise GatewayError(UNSUPPORTED_VERSION, f"protocol revision {revision!r} is not supported; the gateway "
                                                    f"speaks {', '.join(REVISIONS)}", 400,
                               {"supported": list(REVISIONS), "requested": revision}, message.get("id"))
        headers = {k.lower(): v for k, v in request.headers.items()}
        check_mirror_headers(headers, message, revision)
        return message, revision

    async def _listed(self, request: Request, body: bytes, request_id: Any) -> Response:
        """A ``tools/list`` under ``hide_denied_tools``: relayed, its answer read whole (within the
        response bound) and sent back without the tools the policy in force denies outright. The
        policy is the one the next call would be decided by (read again when its file changed), so
        the list follows it. An answer that is not a readable list is relayed unchanged."""
        headers = wire_upstream.forward_headers(request.headers, drop=self._not_forwarded)
        try:
            async with httpx.AsyncClient(timeout=self.upstream_timeout, trust_env=False, follow_redirects=False,
                                         verify=wire_upstream.relay_verify(self._pinned_files())) as client:
                async with client.stream("POST", self.upstream, content=body, headers=headers,
                                         params=request.query_params) as upstream:
                    chunks, size = [], 0
                    async for chunk in upstream.aiter_bytes():
                        size += len(chunk)
                        if size > self.max_response_bytes:
                            logger.warning("the upstream's tools/list answer exceeded %d bytes; not relayed",
                                           self.max_response_bytes)
                            return _json(502, error_body(request_id, -32603, f"the upstream's tools/list answer is "
                                                         f"larger than {self.max_response_bytes} bytes "
                                                         f"(--max-response-bytes)"))
                        chunks.append(chunk)
        except httpx.HTTPError as exc:
            return _json(502, error_body(None, -32603, f"the upstream {self.upstream} could not be reached: "
                                                       f"{type(exc).__name__}"))
        raw, kept = b"".join(chunks), wire_upstream.forward_headers(upstream.headers)
        if upstream.status_code != 200:
            return Response(raw, status_code=upstream.status_code, headers=kept)
        kind = upstream.headers.get("content-type", "").split(";")[0].strip().lower()
        prefix = f"mcp.{self.alias}."
        try:
            control = self.control
            policy = control.loaded_policy or await control.aread(control.load)
            raw, hidden = without_hidden(raw, kind, request_id, lambda tool: policy.denies_outright(prefix + tool))
        except Malformed as exc:
            logger.warning("the upstream's tools/list answer is relayed unchanged (nothing hidden): %s", exc)
        except Exception as exc:  # the policy cannot be read: the list is a courtesy, each call still decides
            logger.warning("the upstream's tools/list answer is relayed unchanged (nothing hidden): the policy "
                           "could not be read (%s: %s)", type(exc).__name__, exc)
        else:
            if hidden:
                logger.info("tools/list: %d tool(s) the policy denies outright left out: %s", len(hidden),
                            ", ".join(repr(name[:64]) for name in hidden[:20]))
        return Response(raw, status_code=upstream.status_code, headers=kept)

    async def _relay(self, request: Request, body: bytes) -> Response:
        """Any message but a tools/call: sent on, its answer streamed back unchanged (within the
        response bound for a POST's answer)."""
        headers = wire_upstream.forward_headers(request.headers, drop=self._not_forwarded)
        client = httpx.AsyncClient(timeout=httpx.Timeout(self.upstream_timeout, read=None if request.method == "GET"
                                                          else self.upstream_timeout), trust_env=False,
                                   verify=wire_upstream.relay_verify(self._pinned_files()))
        try:
            upstream = await client.send(client.build_request(request.method, self.upstream, content=body,
                                                              headers=headers, params=request.query_params),
                                         stream=True)
        except httpx.HTTPError as exc:
            await client.aclose()
            return _json(502, error_body(None, -32603, f"the upstream {self.upstream} could not be reached: "
                                                       f"{type(exc).__name__}"))
        limit = self.max_response_bytes if request.method == "POST" else None

        async def stream() -> Any:
            size = 0
            try:
                async for chunk in upstream.aiter_raw():
                    size += len(chunk)
                    if limit is not None and size > limit:
                        logger.warning("an upstream answer exceeded %d bytes; cut off", limit)
                        return
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        kept = wire_upstream.forward_headers(upstream.headers)
        return StreamingResponse(stream(), status_code=upstream.status_code, headers=kept)


def _text(status: int, text: str) -> Response:
    return Response(text + "\n", status_code=status, media_type="text/plain; charset=utf-8")


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json", headers=headers or None)
