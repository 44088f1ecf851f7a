"""The approval page's mail parts (``ctrlrun.notify``): who was told and how sending went, and the page a
mail's link opens. Hosted by ``ApprovalAdmin`` (its "who was told" field, ``approval/<id>/link/<token>/``)."""
from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _g

from .. import notify, store
from ..display import reveal
from ..errors import InvalidArgument
from ..times import when_text
from .console import badge, change_url, shown, tampered_badge, when

#: The HTTP status of each refusal: nothing is answered on any of these pages.
_STATUS = {"tampered": 400, "not_yours": 403, "used": 410, "expired": 410}


def deliveries_html(approval_id: str) -> SafeString:
    """The request's mail deliveries as a table: recipient, address, why, status, attempts, last error,
    next try; a row changed outside ctrlrun says so and shows nothing it claims."""
    rows = store.notifications.deliveries_for(approval_id)
    if not rows:
        return format_html('<span class="ctrlrun-since">{}</span>', _g(
            "nobody was mailed (notifications are off, or nobody with an email may answer it: docs/approvals.md)"))
    body = []
    for d in rows:
        if not d.signature_ok:
            body.append(format_html('<tr class="ctrlrun-delivery"><td>{}</td><td colspan="6">{}</td></tr>',
                                    shown(d.recipient), tampered_badge(_g(
                                        "this delivery does not carry ctrlrun's signature: it is never sent"))))
            continue
        status = badge(d.status)
        body.append(format_html(
            '<tr class="ctrlrun-delivery" data-recipient="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            '<td>{}</td><td>{}</td><td>{}</td></tr>',
            d.recipient, shown(d.recipient), shown(d.address), notify.basis_text(d.basis).replace("you ", "they ", 1),
            status, d.attempts, shown(d.last_error) if d.last_error else "-",
            _moment(d)))
    head = format_html_join("", "<th>{}</th>", ((h,) for h in (
        _g("recipient"), _g("address"), _g("why"), _g("status"), _g("attempts"), _g("last error"),
        _g("when"))))
    return format_html('<table class="ctrlrun-deliveries" id="ctrlrun-deliveries"><thead><tr>{}</tr></thead>'
                       '<tbody>{}</tbody></table>', head, format_html_join("", "{}", ((r,) for r in body)))


def _moment(d: Any) -> SafeString:
    if d.sent_at:
        return format_html("{} {}", _g("sent"), when(d.sent_at))
    if d.next_try and d.status == "pending":
        return format_html("{} {}", _g("next try"), when(d.next_try))
    return format_html("{}", "-")


def link_view(model_admin: Any, request: HttpRequest, object_id: str, token: str) -> HttpResponse:
    """A mail's link, opened by a signed-in user: once, by its addressee, before it expires, it leads to
    the request's page (where answering still takes a click and a confirmation); otherwise a page says
    why, and nothing is answered or recorded."""
    from django.contrib.admin.utils import unquote

    approval_id = unquote(object_id)
    if store.get_approval(approval_id) is None:
        raise Http404(_g("no approval request %(id)s") % {"id": reveal(approval_id)})
    username = request.user.get_username()
    try:
        found = notify.check_link(approval_id, token, username)
    except InvalidArgument as exc:
        found, problem = None, str(exc)
    else:
        problem = None
    page = change_url(model_admin.site, "approval", approval_id)
    if found is not None and found.outcome == "ok":
        model_admin.message_user(request, _g(
            "Opened from the mail sent to %(user)s. Read the request, then approve or deny it below; the "
            "link has now been used.") % {"user": reveal(username)}, messages.INFO)
        return HttpResponseRedirect(page)
    return _refusal(model_admin, request, approval_id, found, problem, page)


def _refusal(model_admin: Any, request: HttpRequest, approval_id: str, found: Any, problem: str | None,
             page: str) -> HttpResponse:
    outcome = found.outcome if found is not None else "settings"
    response = model_admin.console_page(request, "admin/ctrlrun/approval/link.html", {
        "title": _g("This link answers nothing"),
        "approval_id": approval_id,
        "outcome": outcome,
        "heading": {"tampered": _g("Not a link ctrlrun sent"), "not_yours": _g("This link is someone else's"),
                    "used": _g("This link was already used"), "expired": _g("This link expired")}.get(
            outcome, _g("Mail links are not set up here")),
        "explanation": problem or _explain(found, request.user.get_username()),
        "change_url": page,
    })
    response.status_code = _STATUS.get(outcome, 400)
    return response


def _explain(found: Any, username: str) -> str:
    if found.outcome == "tampered":
        return _g("This link is not one ctrlrun sent for request %(id)s (its signature does not hold, or it names "
                  "another request or person). Nothing was answered or recorded. Open the request from the "
                  "console's list of approvals.") % {"id": found.approval_id}
    if found.outcome == "not_yours":
        return _g("This link was sent to %(addressee)s, and you are signed in as %(user)s. Nothing was answered "
                  "or recorded, and the link still works for %(addressee)s. Sign in as them, or open the request "
                  "from the console's list of approvals.") % {"addressee": reveal(found.addressee),
                                                                "user": reveal(username)}
    if found.outcome == "used":
        use = found.use
        return _g("This link was already used, at %(at)s by %(user)s: a mail's link works once. Nothing was "
                  "answered. Open the request from the console's list of approvals.") % {
            "at": when_text(use.used_at), "user": reveal(use.used_by)}
    return _g("This link expired at %(at)s. Nothing was answered or recorded. Open the request from the "
              "console's list of approvals.") % {"at": when_text(found.expired_at)}
