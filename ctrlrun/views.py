"""ctrlrun's views outside the admin: the webhook answer endpoint, and the ACS endpoint a project mounts.

The endpoint verifies the sender (the ``CTRLRun-Signature`` header, HMAC-SHA256 with the shared
secret, inside the replay window), not a browser session, so it is exempt from CSRF and takes only
POST. The secret is ``settings.CTRLRUN_WEBHOOK_SECRET_FILE``, else ``$CTRLRUN_WEBHOOK_SECRET``;
without one every answer is refused (503) and the log says what to set.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from . import conf
from .errors import InvalidArgument
from .webhook import MAX_INBOUND_BYTES, SIGNATURE_HEADER, handle_inbound, webhook_secret

logger = logging.getLogger("ctrlrun.webhook")
logger_acs = logging.getLogger("ctrlrun.acs")


@csrf_exempt
@require_POST
def webhook_answer(request: HttpRequest, request_id: str) -> HttpResponse:
    try:
        secret = webhook_secret(conf.webhook_secret_file())
    except InvalidArgument as exc:
        logger.error("webhook answer to %s refused: %s", request_id, exc)
        return HttpResponse("webhook answers are not configured on this server\n", status=503,
                            content_type="text/plain; charset=utf-8")
    length = request.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > MAX_INBOUND_BYTES:
        return HttpResponse(f"the answer is larger than {MAX_INBOUND_BYTES} bytes\n", status=400,
                            content_type="text/plain; charset=utf-8")
    status, text = handle_inbound(request_id, request.body, request.headers.get(SIGNATURE_HEADER), secret=secret,
                                  replay_window=conf.webhook_replay_window())
    if status != 200:
        logger.warning("webhook answer to %s refused: %s", request_id, text)
    return HttpResponse(text + "\n", status=status, content_type="text/plain; charset=utf-8")


def acs_endpoint(hook: Any = None, *, max_body_bytes: int | None = None, **options: Any) -> Callable[..., HttpResponse]:
    """A view answering ACS v0.1.0 envelopes POSTed as JSON with the hook's answer (docs/acs.md).

    Mount it yourself (it is not in ``ctrlrun.urls``: an endpoint that decides agents' calls is
    opened on purpose): ``path("ctrlrun/acs", acs_endpoint())``. ``hook``: an ``AcsControlHook``;
    without one, each request is answered by ``AcsControlHook(default_control(), **options)``. The
    body is bounded (``max_body_bytes``, default ``ctrlrun.acs.MAX_ENVELOPE_BYTES``: larger is HTTP
    413); a body that is not JSON is a ``-32002`` answer; every answer is JSON-RPC on HTTP 200.
    """
    from .acs import MALFORMED, MAX_ENVELOPE_BYTES

    limit = MAX_ENVELOPE_BYTES if max_body_bytes is None else max_body_bytes
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1024:
        raise InvalidArgument(f"acs_endpoint(max_body_bytes=...) must be a whole number of at least 1024, got {limit!r}")

    def error(status: int, code: int, message: str) -> JsonResponse:
        return JsonResponse({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}, status=status)

    @csrf_exempt
    @require_POST
    def acs_view(request: HttpRequest) -> HttpResponse:
        length = request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > limit:
            return error(413, MALFORMED, f"the envelope is larger than {limit} bytes")
        raw = request.read(limit + 1)
        if len(raw) > limit:
            return error(413, MALFORMED, f"the envelope is larger than {limit} bytes")
        try:
            envelope = json.loads(raw, parse_constant=_not_json)
        except (ValueError, RecursionError) as exc:
            return error(200, MALFORMED, f"the body is not JSON: {str(exc)[:200]}")
        answering = hook
        if answering is None:
            from .acs import AcsControlHook
            from .control import default_control
            from .errors import CTRLRunError

            try:
                answering = AcsControlHook(default_control(), **options)
            except CTRLRunError as exc:
                logger_acs.error("the ACS endpoint cannot answer: %s", exc)
                return error(503, -32603, f"ctrlrun cannot answer ACS here: {exc}")
        headers = {name.lower(): value for name, value in request.headers.items()}
        return JsonResponse(answering.handle(envelope, headers=headers))

    return acs_view


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")
