"""ctrlrun's views outside the admin: the webhook answer endpoint.

The endpoint verifies the sender (the ``CTRLRun-Signature`` header, HMAC-SHA256 with the shared
secret, inside the replay window), not a browser session, so it is exempt from CSRF and takes only
POST. The secret is ``settings.CTRLRUN_WEBHOOK_SECRET_FILE``, else ``$CTRLRUN_WEBHOOK_SECRET``;
without one every answer is refused (503) and the log says what to set.
"""
from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from . import conf
from .errors import InvalidArgument
from .webhook import MAX_INBOUND_BYTES, SIGNATURE_HEADER, handle_inbound, webhook_secret

logger = logging.getLogger("ctrlrun.webhook")


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
