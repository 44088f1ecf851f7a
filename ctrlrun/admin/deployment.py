"""The console's deployment check: ``verify`` (docs/verify.md) graded on demand and shown as a page.

GET says what the check reads and offers the button; POST grades the deployment now (a full,
read-only chain check and the other reads of ``verify``) and shows the report: one row per
guarantee, its status, why, and the evidence that fails it. Nothing is recorded (the command's
``--json`` is the artefact to keep). Visible with ``ctrlrun.run_verify``: the report names the
database role, the guard's state and where the signing key comes from.
"""
from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext as _g

from .. import conf, verify
from ..display import reveal
from ..errors import CTRLRunError

RUN_VERIFY = "ctrlrun.run_verify"
#: The counterexamples a row shows (the command's --json has them all).
SHOWN_COUNTEREXAMPLES = 5
STATUS_LABELS = {verify.PASS: "pass", verify.FAIL: "FAIL", verify.NOT_APPLICABLE: "not applicable",
                 verify.SKIPPED: "skipped"}


def allowed(request: HttpRequest) -> bool:
    return request.user.is_active and request.user.has_perm(RUN_VERIFY)


def _rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for item in document["guarantees"]:
        examples = item.get("counterexample") or []
        rows.append({
            "id": item["id"], "title": item["title"], "status": item["status"],
            "label": STATUS_LABELS[item["status"]], "reason": reveal(str(item["reason"]), multiline=True),
            "subject": reveal(str(item.get("action") or item.get("grant_id") or "")),
            "detail": reveal(str(item["detail"]), multiline=True) if item.get("detail") else "",
            "counterexample": [reveal(json.dumps(e, sort_keys=True, default=str), multiline=True)
                               for e in examples[:SHOWN_COUNTEREXAMPLES]],
            "more": max(0, len(examples) - SHOWN_COUNTEREXAMPLES)})
    return rows


def deployment_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """The page, hosted by the receipts' admin (``receipt/deployment/``)."""
    if not allowed(request):
        raise PermissionDenied("grading the deployment needs the permission ctrlrun.run_verify")
    context: dict[str, Any] = {"title": _g("Deployment check"), "docs": conf.docs_url("verify.md")}
    if request.method == "POST":
        try:
            document = verify.run()
        except verify.Refused as exc:
            context["refused"] = reveal(str(exc))
        except (CTRLRunError, DatabaseError) as exc:
            context["refused"] = reveal(f"the report could not be made: {type(exc).__name__}: {exc}")
        else:
            context.update(document=document, summary=document["summary"], rows=_rows(document),
                           status=verify.exit_status(document), policy=document["policy"],
                           authority=document["authority"])
    return model_admin.console_page(request, "admin/ctrlrun/receipt/deployment.html", context)
