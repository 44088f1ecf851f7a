"""Views that run a protected call with no ``ctrlrun.context()`` of their own, behind
``ctrlrun.middleware.IdentityMiddleware`` (``ROOT_URLCONF`` for tests/integration/test_identity_middleware.py).

The Control is built on first use (an allow-all policy for ``email.send``) with the request's provider.
"""
from __future__ import annotations

import json

from django.http import JsonResponse
from django.urls import path

import ctrlrun
from ctrlrun.middleware import DjangoRequestIdentityProvider

__all__ = ["urlpatterns", "site_control"]

_control = None
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  email.send:
    decision: allow
"""


def site_control() -> ctrlrun.Control:
    global _control
    if _control is None:
        from ctrlrun.policy import parse_policy

        _control = ctrlrun.Control(parse_policy(POLICY), identity=DjangoRequestIdentityProvider())
    return _control


def _answer(ran: str) -> JsonResponse:
    from ctrlrun.models import Receipt

    latest = Receipt.objects.order_by("-seq").first()
    return JsonResponse({"ran": ran, "principal": json.loads(latest.document)["principal"] if latest else None})


def sync_view(request):
    try:
        ran = site_control().call("email.send", {"to": request.GET.get("to", "a@example.com")}, lambda: "sent")
    except ctrlrun.CTRLRunError as exc:
        return JsonResponse({"error": type(exc).__name__, "message": str(exc)}, status=403)
    return _answer(ran)


async def async_view(request):
    from asgiref.sync import sync_to_async

    async def send():
        return "sent"

    try:
        ran = await site_control().acall("email.send", {"to": request.GET.get("to", "b@example.com")}, send)
    except ctrlrun.CTRLRunError as exc:
        return JsonResponse({"error": type(exc).__name__, "message": str(exc)}, status=403)
    return await sync_to_async(_answer)(ran)


urlpatterns = [path("sync/", sync_view), path("async/", async_view)]
