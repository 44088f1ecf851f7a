"""The approval inbox: a request as the person reads it, and the answer given through the store."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Case, F, IntegerField, Q, Value, When
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timeuntil
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import store
from .console import (
    badge, call_link, change_url, cited_by, controls_html, effect_link, policy_link, reason_html, shown,
    tampered_badge, when, when_text,
)
from ..approvers import distinct, load_approvers, tally
from ..display import dumps, dumps_html, reveal, warning
from ..errors import CTRLRunError
from ..identity import same_person
from ..models import Approval
from ..states import ApprovalStatus, effective_approval_status
from .base import (
    DECIDE, EvidenceAdmin, RevealedValuesFilter, _ago, _approval_fields, _at, _clock, _now, _object_key,
    _policy_document, _pre, _principal_html, _receipt_rows, refusal_text,
)
from .notifications import deliveries_html, link_view
from .paused import _paused_run_line
from .policychange import proposal_context
from . import verified


# --------------------------------------------------------------------------- approvals


class DecisionForm(forms.Form):
    note = forms.CharField(label=_("Note"), required=False, max_length=4000, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                           help_text=_("Optional: why, kept with the answer and in the event."))


def _own_request_message(approval: Any, username: str) -> str:
    """Why the viewer cannot answer: the request was made on their behalf (however the name is written)."""
    if approval.user == username:  # word for word as the store says it
        return (f"this request for {reveal(approval.action)} was made on behalf of user {reveal(username)}, who "
                f"cannot answer it; another person must")
    return (f"this request for {reveal(approval.action)} was made on behalf of user '{reveal(approval.user)}', the "
            f"same person as you ({reveal(username)}) written another way, who cannot answer it; another person must")


class ApprovalStatusFilter(admin.SimpleListFilter):
    """Status as it is now: "waiting" excludes requests past their expiry, "expired" includes them."""

    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("pending", _("waiting for a person")), ("granted", _("granted, not yet used")),
                ("consumed", _("used")), ("denied", _("denied")), ("expired", _("expired"))]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value, now = self.value(), _now()
        if value == "pending":
            return queryset.filter(status=ApprovalStatus.PENDING, expires_at__gt=now)
        if value == "expired":
            return queryset.filter(Q(status=ApprovalStatus.EXPIRED)
                                   | Q(status__in=[ApprovalStatus.PENDING, ApprovalStatus.GRANTED], expires_at__lte=now))
        if value == "granted":
            return queryset.filter(status=ApprovalStatus.GRANTED, expires_at__gt=now)
        if value in ("consumed", "denied"):
            return queryset.filter(status=value)
        return queryset


def _stored_effect_link(site: str, effect_key: str | None) -> SafeString:
    """An approval's effect key: a link once its record exists; before (the approved call makes it
    when it runs) the key as text, saying so, never a link to a page that says "doesn't exist"."""
    if not effect_key:
        return shown(None)
    if store.get_effect(effect_key) is not None:
        return effect_link(site, effect_key)
    return format_html('{} <span class="ctrlrun-since">{}</span>', shown(effect_key),
                       _g("no effect record yet: the approved call makes it when it runs"))


@admin.register(Approval)
class ApprovalAdmin(EvidenceAdmin):
    list_display = ("request", "shown_status", "shown_action", "key_arguments", "principal", "age", "expiry")
    list_display_links = ("request",)
    list_filter = (ApprovalStatusFilter, ("action", RevealedValuesFilter), ("agent", RevealedValuesFilter))
    search_fields = ("approval_id", "action", "agent", "user", "effect_key", "action_hash")
    list_per_page = 50
    fieldsets = [
        (_("What the human is authorising"), {"fields": (
            "shown_action", "canonical_arguments", "principal", "resource", "environment", "action_hash",
            "shown_effect_key", "shown_preconditions")}),
        (_("Why it needs a person"), {"fields": ("shown_reason", "cited_controls", "shown_policy")}),
        (_("The request"), {"fields": (
            "approval_id", "shown_status", "asked_by_call", "at_created_at", "at_expires_at", "shown_approver",
            "shown_note", "at_answered_at", "at_consumed_at", "used_by_call", "given_back")}),
        (_("Who was told"), {"fields": ("mailed",)}),
    ]
    readonly_fields = ("shown_action", "canonical_arguments", "principal", "resource", "environment",
                       "shown_effect_key", "shown_reason", "cited_controls", "shown_policy", "shown_status",
                       "asked_by_call",
                       "at_created_at", "at_expires_at", "shown_approver", "shown_note", "at_answered_at",
                       "at_consumed_at", "used_by_call", "given_back", "shown_preconditions", "mailed")
    change_form_template = "admin/ctrlrun/approval/change_form.html"

    at_created_at = _at("created_at", _("asked at"))
    at_answered_at = _at("answered_at", _("answered at"))
    at_consumed_at = _at("consumed_at", _("used at"))

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).annotate(waiting=self._waiting())

    @staticmethod
    def _waiting() -> Case:
        return Case(When(status=ApprovalStatus.PENDING, expires_at__gt=_now(), then=Value(0)), default=Value(1),
                    output_field=IntegerField())

    def get_ordering(self, request: HttpRequest) -> list[Any]:
        # Requests still waiting first, the soonest to expire at the top; then the rest, newest first.
        # The change list orders by this before the queryset's own order.
        soonest = Case(When(status=ApprovalStatus.PENDING, expires_at__gt=_now(), then=F("expires_at")))
        return [self._waiting().asc(), soonest.asc(nulls_last=True), "-created_at"]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if "status__exact" in request.GET:  # an older link (the front page's before this filter): same meaning now
            query = request.GET.copy()
            query["status"] = query.pop("status__exact")[-1]
            return HttpResponseRedirect(f"{request.path}?{query.urlencode()}")
        return super().changelist_view(request, extra_context)

    def has_decide_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(DECIDE)

    @admin.display(description=_("request"), ordering="approval_id")
    def request(self, obj: Approval) -> str:
        return format_html('<span title="{}">{}…</span>', obj.approval_id, obj.approval_id[:12])

    @admin.display(description=_("status"), ordering="status")
    def shown_status(self, obj: Approval) -> SafeString:
        if not store.approval_signature_ok(obj):
            return tampered_badge(_g("this row does not carry ctrlrun's signature: nobody can answer or use it"))
        now = _now()
        status = effective_approval_status(obj.status, obj.expires_at, now)
        if status == ApprovalStatus.EXPIRED and obj.status == ApprovalStatus.PENDING:
            return badge(status, title=_g("not answered before %(at)s") % {"at": when_text(obj.expires_at)})
        if status == ApprovalStatus.EXPIRED and obj.status == ApprovalStatus.GRANTED:
            return badge(status, title=_g("granted, but not used before %(at)s") % {"at": when_text(obj.expires_at)})
        if status == ApprovalStatus.PENDING and obj.approvals_required > 1:  # M-of-N: how far it is
            recorded = len(distinct(load_approvers(obj.approvers)))
            return format_html("{} <span class=\"ctrlrun-tally\">{}</span>", badge(status),
                               tally(recorded, obj.approvals_required))
        return badge(status)

    @admin.display(description=_("action"), ordering="action")
    def shown_action(self, obj: Approval) -> SafeString:
        return shown(obj.action)

    @admin.display(description=_("effect key"))
    def shown_effect_key(self, obj: Approval) -> SafeString:
        return _stored_effect_link(self.site, obj.effect_key)

    @admin.display(description=_("approver"))
    def shown_approver(self, obj: Approval) -> SafeString:
        return shown(obj.approver)

    @admin.display(description=_("note"))
    def shown_note(self, obj: Approval) -> SafeString:
        return shown(obj.note, multiline=True)

    @admin.display(description=_("policy decision"))
    def shown_reason(self, obj: Approval) -> SafeString:
        return reason_html(_policy_document(obj.policy_hash), obj.action, obj.decision_reason)

    @admin.display(description=_("controls cited"))
    def cited_controls(self, obj: Approval) -> SafeString:
        """The controls the call would cite: the stored policy evaluated again on the approval's action."""
        document = _policy_document(obj.policy_hash)
        action = json.loads(obj.action_json)
        ids = cited_by(document, obj.action, action.get("arguments", {}) if isinstance(action, dict) else None)
        if ids is None:
            return format_html("{}", _g("unknown: the policy document of this request is not stored here, or "
                                        "unreadable"))
        return controls_html(ids, document)

    @admin.display(description=_("policy document"))
    def shown_policy(self, obj: Approval) -> SafeString:
        return policy_link(self.site, obj.policy_hash)

    @admin.display(description=_("asked by the call"))
    def asked_by_call(self, obj: Approval) -> SafeString:
        return call_link(self.site, obj.action_id, short=None)

    @admin.display(description=_("used by the call"))
    def used_by_call(self, obj: Approval) -> SafeString:
        return call_link(self.site, obj.consumed_by, short=None)

    @admin.display(description=_("preconditions"))
    def shown_preconditions(self, obj: Approval) -> str:
        """The fingerprint of the state the call saw when it asked (``protect(preconditions=...)``)."""
        if not obj.precondition_fingerprint:
            return _g("none: the call reads no state of the world")
        return _g("%(fingerprint)s: the state when this was asked; the approval is used only if the state is the "
                  "same then") % {"fingerprint": obj.precondition_fingerprint}

    @admin.display(description=_("given back"))
    def given_back(self, obj: Approval) -> str:
        """How often an attempt that provably did nothing (NotExecuted, a hook's not_executed) gave the
        approval back (``returned``, under the row's signature; the events are APPROVAL_RETURNED)."""
        if not obj.returned:
            return _g("never")
        return ngettext("given back %(n)d time: an attempt that provably did nothing used it (APPROVAL_RETURNED)",
                        "given back %(n)d times: attempts that provably did nothing used it (APPROVAL_RETURNED)",
                        obj.returned) % {"n": obj.returned}

    @admin.display(description=_("mail"))
    def mailed(self, obj: Approval) -> SafeString:
        return deliveries_html(obj.approval_id)  # ctrlrun.notify's deliveries (admin/notifications.py)

    @admin.display(description=_("arguments"))
    def key_arguments(self, obj: Approval) -> SafeString:
        """``key=value, ...`` cut at about 60 visible characters, escapes highlighted; a badge when any hide."""
        arguments = json.loads(obj.action_json).get("arguments", {})
        plain_length, pieces = 0, []
        for k, v in sorted(arguments.items()):
            plain = f"{reveal(k)}={dumps(v)}"
            separator = ", " if pieces else ""
            if plain_length + len(separator) + len(plain) > 60:
                if not pieces:  # one long argument: its start, as text
                    pieces.append(format_html("{}", plain[:57]))
                pieces.append(mark_safe("…"))
                break
            pieces.append(format_html("{}{}={}", separator, shown(k), mark_safe(dumps_html(v))))
            plain_length += len(separator) + len(plain)
        text = mark_safe("".join(pieces))
        hidden = _approval_fields(obj)
        if hidden:
            return format_html('<span class="ctrlrun-hidden-badge" title="{}">{}</span> {}', warning(hidden),
                               _g("hidden characters"), text)
        return text

    @admin.display(description=_("principal"))
    def principal(self, obj: Approval) -> SafeString:
        return _principal_html(obj.agent, obj.user)

    @admin.display(description=_("asked"), ordering="created_at")
    def age(self, obj: Approval) -> str:
        return _ago(obj.created_at)

    @admin.display(description=_("expires"), ordering="expires_at")
    def expiry(self, obj: Approval) -> SafeString:
        now = _now()
        if obj.status not in (ApprovalStatus.PENDING, ApprovalStatus.GRANTED):
            return format_html("{}", "-")
        if obj.expires_at <= now:
            return format_html('<span title="{}">{}</span>', when_text(obj.expires_at), _g("expired"))
        return format_html('<span title="{}">{}</span>', when_text(obj.expires_at),
                           _g("in %(time)s") % {"time": timeuntil(obj.expires_at, now)})

    @admin.display(description=_("expires at"), ordering="expires_at")
    def at_expires_at(self, obj: Approval) -> SafeString:
        return format_html("{} ({})", when(obj.expires_at), _ago(obj.expires_at))

    @admin.display(description=_("arguments (canonical)"))
    def canonical_arguments(self, obj: Approval) -> str:
        return _pre(json.loads(obj.action_json).get("arguments", {}))

    @admin.display(description=_("resource"))
    def resource(self, obj: Approval) -> SafeString:
        return shown(json.loads(obj.action_json).get("resource"))

    @admin.display(description=_("environment"))
    def environment(self, obj: Approval) -> SafeString:
        return shown(json.loads(obj.action_json).get("environment"))

    def get_urls(self) -> list[Any]:
        decide = self.admin_site.admin_view(self.decide_view)
        link = self.admin_site.admin_view(lambda request, object_id, token: link_view(self, request, object_id, token))
        return [path("<str:object_id>/decide/<str:answer>/", decide, name="ctrlrun_approval_decide"),
                path("<str:object_id>/link/<str:token>/", link, name="ctrlrun_approval_link"), *super().get_urls()]

    def _answerable(self, request: HttpRequest, approval: Any) -> str | None:
        """Why ``request.user`` cannot answer ``approval`` now, or None when they can."""
        now = _now()
        status = effective_approval_status(approval.status, approval.expires_at, now)
        if not approval.signature_ok:
            return _g("Request %(id)s was changed outside ctrlrun (its row does not carry ctrlrun's signature): "
                      "nobody can answer it") % {"id": approval.approval_id}
        if status == ApprovalStatus.EXPIRED:
            return _g("Request %(id)s expired at %(at)s without an answer; the agent must ask again") % {
                "id": approval.approval_id, "at": when_text(approval.expires_at)}
        if status != ApprovalStatus.PENDING:
            return _g("Request %(id)s is already %(status)s%(by)s; only a pending request can be answered") % {
                "id": approval.approval_id, "status": status,
                "by": f" ({_g('answered by')} {reveal(approval.approver)})" if approval.approver else ""}
        if same_person(approval.user, request.user.get_username()):
            return _own_request_message(approval, request.user.get_username())
        return None

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        approval = store.get_approval(_object_key(object_id))  # the admin's URLs quote the pk (apr_5F...)
        context: dict[str, Any] = dict(extra_context or {})
        if approval is not None:
            now = _now()
            status = effective_approval_status(approval.status, approval.expires_at, now)
            tampered = not approval.signature_ok
            pending = status == ApprovalStatus.PENDING and not tampered
            # The same person however the name is written (case, spaces, invisible characters, look-alikes).
            own = same_person(approval.user, request.user.get_username())
            hidden = _approval_fields(approval)
            receipts = store.receipts_for_action(approval.consumed_by) if approval.consumed_by else []
            context = {
                "can_decide": pending and self.has_decide_permission(request) and not own,  # pending: not tampered
                "tampered": tampered,
                "own_request": own,
                "is_pending": pending,
                "status_now": status,
                "lapsed_unanswered": status == ApprovalStatus.EXPIRED and approval.approver is None,
                "expired_at": when(approval.expires_at),
                "expires_in": timeuntil(approval.expires_at, now) if approval.expires_at > now else None,
                "hidden_warning": warning(hidden) if hidden else None,
                "shown_user": shown(approval.user),
                "shown_approver": shown(approval.approver),
                "asked_by": call_link(self.site, approval.action_id, short=None),
                "used_by": call_link(self.site, approval.consumed_by, short=None) if approval.consumed_by else None,
                "used_receipts": _receipt_rows(self.site, receipts),
                "effect": _stored_effect_link(self.site, approval.effect_key) if approval.effect_key else None,
                "paused_run": _paused_run_line(self.site, approval.approval_id),
                **proposal_context(self.site, request, approval),  # a policy change: diff and replay (§D7)
                "verified": verified.box(approval, request.user) if not tampered else None,
                **context,
            }
        return super().change_view(request, object_id, form_url, context)

    def decide_view(self, request: HttpRequest, object_id: str, answer: str) -> HttpResponse:
        if answer not in ("approve", "deny"):
            raise Http404(_g("unknown answer: approve or deny"))
        if not self.has_decide_permission(request):
            raise PermissionDenied(_g("deciding approvals needs the ctrlrun.decide_approval permission"))
        request.current_app = self.site
        _clock.value = None  # expiry is judged on the clock of this request, never a second-old one
        object_id = _object_key(object_id)
        approval = store.get_approval(object_id)
        if approval is None:
            raise Http404(_g("no approval request %(id)s") % {"id": reveal(object_id)})
        change = change_url(self.site, "approval", object_id)
        refusal = self._answerable(request, approval)
        if refusal is not None and request.method != "POST":
            # Refused before the form is shown: nobody is asked to confirm what cannot be answered.
            self.message_user(request, refusal, messages.ERROR)
            return HttpResponseRedirect(change)
        username = request.user.get_username()
        if same_person(approval.user, username):
            self.message_user(request, _own_request_message(approval, username), messages.ERROR)
            return HttpResponseRedirect(change)
        cannot = verified.refusal(approval, request.user) if answer == "approve" else None
        if cannot is not None:
            self.message_user(request, cannot, messages.ERROR)
            return HttpResponseRedirect(change)
        form = DecisionForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            note = form.cleaned_data["note"] or None
            try:  # the store decides (it also moves a request past its expiry to expired)
                result = store.answer_approval(object_id, answer == "approve", by=username, note=note,
                                               person=request.user)  # the console verifies who answers
            except CTRLRunError as exc:
                self.message_user(request, reveal(refusal_text(exc)), messages.ERROR)
                return HttpResponseRedirect(change)
            verb = ("granted" if result.status != ApprovalStatus.PENDING else "approved") if answer == "approve" \
                else "denied"
            self.log_change(request, Approval(approval_id=result.approval_id, action=result.action,
                                              status=result.status),
                            f"{verb} {object_id}" + (f": {note}" if note else ""))
            self.message_user(request, self._answered_message(result, verb), messages.SUCCESS)
            return HttpResponseRedirect(change)
        action = approval.canonical_action
        hidden = _approval_fields(approval)
        now = _now()
        return self.console_page(request, "admin/ctrlrun/approval/decide.html", {
            "title": f"{_g('Approve') if answer == 'approve' else _g('Deny')} {reveal(approval.action)}?",
            "approval": approval,
            "shown": {
                "action": shown(approval.action),
                "arguments": mark_safe(dumps_html(approval.arguments, indent=2, sort_keys=True)),
                "principal": _principal_html(approval.agent, approval.user),
                "effect_key": shown(approval.effect_key),
                "resource": shown(action.get("resource")),
                "environment": shown(action.get("environment")),
                "reason": reason_html(_policy_document(approval.policy_hash), approval.action,
                                      approval.decision_reason),
                "expires_at": when(approval.expires_at),
            },
            "hidden_warning": warning(hidden) if hidden else None,
            "verified": verified.box(approval, request.user),
            "answer": answer,
            "form": form,
            "change_url": change,
            "expires_in": timeuntil(approval.expires_at, now) if approval.expires_at > now else None,
        })

    @staticmethod
    def _answered_message(result: Any, verb: str) -> str:
        """What an operator needs to know once they answered: what happens to the agent's call now."""
        # Not starting with the id: the admin capitalises a message's first letter (Apr_...).
        if result.status == ApprovalStatus.PENDING:
            return verified.recorded_message(result)
        if result.status == ApprovalStatus.GRANTED:
            return _g("Request %(id)s granted. The agent's call of %(action)s with exactly these arguments may now "
                      "run, once, until %(at)s; any other call is refused.") % {
                "id": result.approval_id, "action": reveal(result.action), "at": when_text(result.expires_at)}
        return _g("Request %(id)s denied. The agent's call of %(action)s will not run; a retry under this "
                  "request is refused.") % {"id": result.approval_id, "action": reveal(result.action)}
