"""The human console: the approval inbox, the resolution console and the evidence.

Everything a person decides here goes through the same store functions as the commands
(``store.answer_approval``, ``store.resolve``, ``reconcile.ask_now``); the console never
writes ctrlrun's rows itself. Evidence (receipts, events, policy documents) is read-only for
everyone. Deciding approvals and resolving effects need the custom permissions
``ctrlrun.decide_approval`` and ``ctrlrun.resolve_effect``; without them a user sees no buttons
and the action URLs answer 403.
"""
from __future__ import annotations

import datetime as dt
import json
import threading
import time
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters, get_content_type_for_model
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Case, IntegerField, Model, Q, Value, When
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext_lazy as _

from . import conf, reconcile, store
from .canonical import evidence_time, idempotency_token_for
from .display import dumps, dumps_html, hidden_fields, reveal, reveal_html, warning
from .errors import CTRLRunError
from .identity import same_person
from .models import Approval, EffectRecord, Event, PolicyDocument, Receipt
from .report import chain_lines
from .states import ApprovalStatus, EffectState

_clock = threading.local()


def _now() -> Any:
    """The store's clock (the database's, on PostgreSQL) for what a page shows: lapsed, expired, age.

    Read at most once a second per thread, so a list of 100 rows costs one read, not 100.
    """
    if conf.clock_overridden():
        return conf.now()  # a test clock: exact, never cached
    cached = getattr(_clock, "value", None)
    if cached is None or time.monotonic() - cached[0] > 1.0:
        cached = (time.monotonic(), store.now())
        _clock.value = cached
    return cached[1]


DECIDE = "ctrlrun.decide_approval"
RESOLVE = "ctrlrun.resolve_effect"


# --------------------------------------------------------------------------- showing what people read
#
# Every string an agent, a policy or a remote put in a row is shown through ``ctrlrun.display``:
# invisible and direction-changing characters become highlighted escapes, never raw text, and
# the pages that show an action to decide on warn when it holds any.


def _pre(value: Any) -> SafeString:
    return format_html('<pre class="ctrlrun-json">{}</pre>', mark_safe(dumps_html(value, indent=2, sort_keys=True)))


def _shown(text: str | None, *, multiline: bool = False, empty: str = "-") -> SafeString:
    """``text`` as HTML, each hidden character a highlighted escape; ``empty`` when there is none."""
    if text is None or text == "":
        return format_html("{}", empty)
    shown = reveal_html(text, multiline=multiline)
    return mark_safe(shown.replace("\n", "<br>") if multiline else shown)


def _principal_html(agent: str, user: str | None) -> SafeString:
    if user:
        return format_html("{} (user {})", _shown(agent), _shown(user))
    return _shown(agent)


def _object_key(object_id: str) -> str:
    """The primary key in an admin URL, unquoted; a NUL character (which PostgreSQL cannot be
    sent, and no ctrlrun key holds) is a 404."""
    key = unquote(object_id)
    if "\x00" in key:
        raise Http404("no such record: a ctrlrun id or key never contains a NUL character")
    return key


class RevealedValuesFilter(admin.AllValuesFieldListFilter):
    """The admin's filter by distinct values, each value shown with hidden characters escaped."""

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            yield {**choice, "display": reveal(str(choice["display"]))}


class EvidenceAdmin(admin.ModelAdmin):
    """Read-only for everyone, superusers included: evidence is never edited in the console."""

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).using(conf.database_alias())  # CTRLRUN_DATABASE

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        if "\x00" in object_id:  # never stored; PostgreSQL refuses the query itself
            return None
        return super().get_object(request, object_id, from_field)

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """Lookups the database cannot take are the admin's "invalid lookup" redirect (``?e=1``), not a 500."""
        for key, values in request.GET.lists():
            if "\x00" in key or any("\x00" in value for value in values):
                raise IncorrectLookupParameters("a NUL character in the query string")
        if self.date_hierarchy:
            _check_date_hierarchy(request, self.date_hierarchy)
        return super().get_changelist_instance(request)

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], add: bool = False,
                           change: bool = False, form_url: str = "", obj: Any = None) -> Any:
        if obj is not None:  # the page's title, subtitle and breadcrumb name the object: escaped
            context["subtitle"] = reveal(str(obj))
            context["shown_original"] = reveal(str(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> Any:
        obj = self.get_object(request, unquote(object_id))
        context: dict[str, Any] = dict(extra_context or {})
        if obj is not None:
            context.setdefault("title", _("Change history: %s") % reveal(str(obj)))
            context["shown_object"] = reveal(str(obj))
        return super().history_view(request, object_id, context)

    def log_change(self, request: HttpRequest, obj: Model, message: Any) -> LogEntry:
        """As the admin's own, with the object's name and the message escaped (the front page lists them)."""
        return LogEntry.objects.create(
            user_id=request.user.pk, content_type_id=get_content_type_for_model(obj).pk, object_id=str(obj.pk),
            object_repr=reveal(str(obj))[:200], action_flag=CHANGE,
            change_message=reveal(message, multiline=True) if isinstance(message, str) else message,
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _check_date_hierarchy(request: HttpRequest, field: str) -> None:
    """Refuse a year, month or day no calendar holds, before the admin turns them into a datetime
    (which would raise OverflowError, or ValueError past year 9998: both 500s)."""
    parts: dict[str, int] = {}
    for part in ("year", "month", "day"):
        values = request.GET.getlist(f"{field}__{part}")
        if values:
            try:
                parts[part] = int(values[-1])
            except ValueError:
                raise IncorrectLookupParameters(f"{field}__{part} is not a whole number") from None
    if not parts:
        return
    if not 1 <= parts.get("month", 1) <= 12 or not 1 <= parts.get("day", 1) <= 31:
        raise IncorrectLookupParameters(f"{field}: no such month or day")
    if "year" not in parts:
        return
    try:  # the bounds the admin computes, in the same way
        start = dt.datetime(parts["year"], parts.get("month", 1), parts.get("day", 1))
        if "day" in parts:
            end = start + dt.timedelta(days=1)
        elif "month" in parts:
            end = (start + dt.timedelta(days=32)).replace(day=1)
        else:
            end = start.replace(year=start.year + 1)
        timezone.make_aware(start, dt.timezone.utc)
        timezone.make_aware(end, dt.timezone.utc)
    except (ValueError, OverflowError) as exc:
        raise IncorrectLookupParameters(f"{field}: no such date ({exc})") from None


def _approval_fields(approval: Any) -> list[str]:
    """What in an approval request (a row or a store view) holds hidden characters, for the warning."""
    return hidden_fields(json.loads(approval.action_json), approval.effect_key)


# --------------------------------------------------------------------------- approvals


class DecisionForm(forms.Form):
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                           help_text="Optional: why, kept with the answer and in the event.")


def _own_request_message(approval: Any, username: str) -> str:
    """Why the viewer cannot answer: the request was made on their behalf (however the name is written)."""
    if approval.user == username:  # word for word as the store says it
        return (f"this request for {reveal(approval.action)} was made on behalf of user {reveal(username)}, who "
                f"cannot answer it; another person must")
    return (f"this request for {reveal(approval.action)} was made on behalf of user '{reveal(approval.user)}', the "
            f"same person as you ({reveal(username)}) written another way, who cannot answer it; another person must")


@admin.register(Approval)
class ApprovalAdmin(EvidenceAdmin):
    list_display = ("request", "status", "shown_action", "key_arguments", "principal", "age", "expiry")
    list_display_links = ("request",)
    list_filter = ("status", ("action", RevealedValuesFilter), ("agent", RevealedValuesFilter))
    search_fields = ("approval_id", "action", "agent", "user", "effect_key", "action_hash")
    list_per_page = 50
    fieldsets = [
        ("What the human is authorising", {"fields": (
            "shown_action", "canonical_arguments", "principal", "resource", "environment", "action_hash",
            "shown_effect_key")}),
        ("Why it needs a person", {"fields": ("decision_reason", "policy_hash")}),
        ("The request", {"fields": (
            "approval_id", "status", "created_at", "expires_at", "time_left", "shown_approver", "shown_note",
            "answered_at", "consumed_at", "consumed_by", "action_id")}),
    ]
    readonly_fields = ("shown_action", "canonical_arguments", "principal", "resource", "environment",
                       "shown_effect_key", "time_left", "shown_approver", "shown_note")
    change_form_template = "admin/ctrlrun/approval/change_form.html"

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).annotate(
            waiting=Case(When(status=ApprovalStatus.PENDING, then=Value(0)), default=Value(1),
                         output_field=IntegerField())
        ).order_by("waiting", "created_at")

    def get_ordering(self, request: HttpRequest) -> list[Any]:
        # The change list orders by this first and only then by the queryset's own order, so
        # without it Meta.ordering (created_at) would put answered requests among the pending.
        pending_first = Case(When(status=ApprovalStatus.PENDING, then=Value(0)), default=Value(1),
                             output_field=IntegerField())
        return [pending_first.asc(), "created_at"]

    @admin.display(description="request", ordering="approval_id")
    def request(self, obj: Approval) -> str:
        return format_html('<span title="{}">{}…</span>', obj.approval_id, obj.approval_id[:12])

    @admin.display(description=_("action"), ordering="action")
    def shown_action(self, obj: Approval) -> SafeString:
        return _shown(obj.action)

    @admin.display(description=_("effect key"))
    def shown_effect_key(self, obj: Approval) -> SafeString:
        return _shown(obj.effect_key)

    @admin.display(description=_("approver"))
    def shown_approver(self, obj: Approval) -> SafeString:
        return _shown(obj.approver)

    @admin.display(description=_("note"))
    def shown_note(self, obj: Approval) -> SafeString:
        return _shown(obj.note, multiline=True)

    @admin.display(description="arguments")
    def key_arguments(self, obj: Approval) -> SafeString:
        """``key=value, ...`` cut at about 80 visible characters, escapes highlighted; a badge when any hide."""
        arguments = json.loads(obj.action_json).get("arguments", {})
        plain_length, pieces = 0, []
        for k, v in sorted(arguments.items()):
            plain = f"{reveal(k)}={dumps(v)}"
            separator = ", " if pieces else ""
            if plain_length + len(separator) + len(plain) > 80:
                if not pieces:  # one long argument: its start, as text
                    pieces.append(format_html("{}", plain[:77]))
                pieces.append(mark_safe("…"))
                break
            pieces.append(format_html("{}{}={}", separator, _shown(k), mark_safe(dumps_html(v))))
            plain_length += len(separator) + len(plain)
        text = mark_safe("".join(pieces))
        hidden = _approval_fields(obj)
        if hidden:
            return format_html('<span class="ctrlrun-hidden-badge" title="{}">{}</span> {}', warning(hidden),
                               _("hidden characters"), text)
        return text

    @admin.display(description="principal")
    def principal(self, obj: Approval) -> SafeString:
        return _principal_html(obj.agent, obj.user)

    @admin.display(description="age")
    def age(self, obj: Approval) -> str:
        return timesince(obj.created_at, _now())

    @admin.display(description="expires")
    def expiry(self, obj: Approval) -> str:
        now = _now()
        if obj.status != ApprovalStatus.PENDING and obj.status != ApprovalStatus.GRANTED:
            return "-"
        return f"in {timeuntil(obj.expires_at, now)}" if obj.expires_at > now else "expired"

    @admin.display(description="time left")
    def time_left(self, obj: Approval) -> str:
        return self.expiry(obj)

    @admin.display(description="arguments (canonical)")
    def canonical_arguments(self, obj: Approval) -> str:
        return _pre(json.loads(obj.action_json).get("arguments", {}))

    @admin.display(description="resource")
    def resource(self, obj: Approval) -> SafeString:
        return _shown(json.loads(obj.action_json).get("resource"))

    @admin.display(description="environment")
    def environment(self, obj: Approval) -> SafeString:
        return _shown(json.loads(obj.action_json).get("environment"))

    def get_urls(self) -> list[Any]:
        decide = self.admin_site.admin_view(self.decide_view)
        return [path("<str:object_id>/decide/<str:answer>/", decide, name="ctrlrun_approval_decide"), *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        approval = store.get_approval(_object_key(object_id))  # the admin's URLs quote the pk (apr_5F...)
        pending = approval is not None and approval.status == ApprovalStatus.PENDING
        # The same person however the name is written (case, spaces, invisible characters, look-alikes).
        own = approval is not None and same_person(approval.user, request.user.get_username())
        hidden = _approval_fields(approval) if approval is not None else []
        tampered = approval is not None and not approval.signature_ok
        context = {
            "can_decide": pending and request.user.has_perm(DECIDE) and not own and not tampered,
            "tampered": tampered,
            "own_request": own,
            "is_pending": pending,
            "hidden_warning": warning(hidden) if hidden else None,
            "shown_user": _shown(approval.user) if approval is not None else None,
            "shown_approver": _shown(approval.approver) if approval is not None else None,
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def decide_view(self, request: HttpRequest, object_id: str, answer: str) -> HttpResponse:
        if answer not in ("approve", "deny"):
            raise Http404("unknown answer")
        if not request.user.has_perm(DECIDE):
            raise PermissionDenied("deciding approvals needs the ctrlrun.decide_approval permission")
        object_id = _object_key(object_id)
        approval = store.get_approval(object_id)
        if approval is None:
            raise Http404(f"no approval request {object_id}")
        change_url = reverse("admin:ctrlrun_approval_change", args=[quote(object_id)])
        username = request.user.get_username()
        if same_person(approval.user, username):  # refused before the form is even shown
            self.message_user(request, _own_request_message(approval, username), messages.ERROR)
            return HttpResponseRedirect(change_url)
        form = DecisionForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            note = form.cleaned_data["note"] or None
            try:
                result = store.answer_approval(object_id, answer == "approve", by=username, note=note)
            except CTRLRunError as exc:
                self.message_user(request, reveal(str(exc)), messages.ERROR)
                return HttpResponseRedirect(change_url)
            verb = "granted" if answer == "approve" else "denied"
            self.log_change(request, Approval.objects.using(conf.database_alias()).get(pk=object_id),
                            f"{verb} {object_id}" + (f": {note}" if note else ""))
            # Not starting with the id: the admin capitalises a message's first letter (Apr_...).
            self.message_user(request, f"Request {object_id} {verb}. "
                              + (f"The agent may now retry inside ctrlrun.with_approval('{object_id}')."
                                 if result.status == ApprovalStatus.GRANTED else ""), messages.SUCCESS)
            return HttpResponseRedirect(change_url)
        action = approval.canonical_action
        hidden = _approval_fields(approval)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{'Approve' if answer == 'approve' else 'Deny'} {reveal(approval.action)}?",
            "approval": approval,
            "shown": {
                "action": _shown(approval.action),
                "arguments": mark_safe(dumps_html(approval.arguments, indent=2, sort_keys=True)),
                "principal": _principal_html(approval.agent, approval.user),
                "effect_key": _shown(approval.effect_key),
                "resource": _shown(action.get("resource")),
                "environment": _shown(action.get("environment")),
            },
            "hidden_warning": warning(hidden) if hidden else None,
            "answer": answer,
            "form": form,
            "opts": self.model._meta,
            "change_url": change_url,
            "expires_in": timeuntil(approval.expires_at, _now()) if approval.expires_at > _now() else None,
        }
        return TemplateResponse(request, "admin/ctrlrun/approval/decide.html", context)


# --------------------------------------------------------------------------- effects


class ResolveForm(forms.Form):
    outcome = forms.ChoiceField(choices=[("committed", "committed: the remote did act"),
                                         ("failed", "failed: the remote did not act")],
                                widget=forms.RadioSelect)
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             help_text="Required: what you checked, e.g. what the remote's dashboard shows.")
    attempt = forms.IntegerField(widget=forms.HiddenInput)


class NeedsAttentionFilter(admin.SimpleListFilter):
    title = "needs attention"
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("ambiguous", "ambiguous"), ("lapsed", "lease lapsed")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.value() == "ambiguous":
            return queryset.filter(state=EffectState.AMBIGUOUS)
        if self.value() == "lapsed":
            return queryset.filter(state__in=[EffectState.RESERVED, EffectState.EXECUTING],
                                   lease_expires_at__lte=_now())
        return queryset


@admin.register(EffectRecord)
class EffectRecordAdmin(EvidenceAdmin):
    list_display = ("shown_key", "state", "shown_action", "attempt", "age", "last_error", "hook", "lease")
    list_filter = (NeedsAttentionFilter, "state", ("action", RevealedValuesFilter))
    search_fields = ("effect_key", "action_id", "action")
    list_per_page = 50
    fields = ("shown_key", "shown_action", "state", "attempt", "action_id", "lease_expires_at", "shown_error",
              "shown_resolved_by", "reconcile_failures", "reconcile_after", "created_at", "updated_at",
              "idempotency_token", "hook")
    readonly_fields = ("shown_key", "shown_action", "shown_error", "shown_resolved_by", "idempotency_token", "hook")
    change_form_template = "admin/ctrlrun/effectrecord/change_form.html"

    def get_queryset(self, request: HttpRequest) -> Any:
        held = [EffectState.RESERVED, EffectState.EXECUTING]
        return super().get_queryset(request).annotate(
            attention=Case(
                When(state=EffectState.AMBIGUOUS, then=Value(0)),
                When(Q(state__in=held) & Q(lease_expires_at__lte=_now()), then=Value(1)),
                default=Value(2), output_field=IntegerField(),
            )
        ).order_by("attention", "-updated_at")

    @admin.display(description="age")
    def age(self, obj: EffectRecord) -> str:
        return timesince(obj.updated_at, _now())

    @admin.display(description=_("effect key"), ordering="effect_key")
    def shown_key(self, obj: EffectRecord) -> SafeString:
        return _shown(obj.effect_key)

    @admin.display(description=_("action"), ordering="action")
    def shown_action(self, obj: EffectRecord) -> SafeString:
        return _shown(obj.action)

    @admin.display(description=_("error"))
    def shown_error(self, obj: EffectRecord) -> SafeString:
        return _shown(obj.error, multiline=True)

    @admin.display(description=_("resolved by"))
    def shown_resolved_by(self, obj: EffectRecord) -> SafeString:
        return _shown(obj.resolved_by)

    @admin.display(description="last error")
    def last_error(self, obj: EffectRecord) -> str:
        if not obj.error:
            return "-"
        return reveal(obj.error if len(obj.error) <= 70 else obj.error[:67] + "…")

    @admin.display(description="reconcile hook")
    def hook(self, obj: EffectRecord) -> str:
        reconcile.ensure_discovered()
        return "found" if reconcile.hook_for(obj.action) else "none (a human decides)"

    @admin.display(description="lease")
    def lease(self, obj: EffectRecord) -> str:
        if obj.lease_expires_at is None:
            return "-"
        now = _now()
        return "lapsed" if obj.lease_expires_at <= now else f"{timeuntil(obj.lease_expires_at, now)} left"

    @admin.display(description="provider idempotency token (the same for every attempt)")
    def idempotency_token(self, obj: EffectRecord) -> str:
        return (f"{idempotency_token_for(obj.effect_key)}  (this attempt's own, per_attempt=True: "
                f"{idempotency_token_for(obj.effect_key, obj.attempt)})")

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/ask/", view(self.ask_view), name="ctrlrun_effectrecord_ask"),
            path("<path:object_id>/resolve/", view(self.resolve_view), name="ctrlrun_effectrecord_resolve"),
            *super().get_urls(),
        ]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        key = _object_key(object_id)
        effect = store.get_effect(key)
        context: dict[str, Any] = dict(extra_context or {})
        if effect is not None:
            now = _now()
            askable = effect.state == EffectState.AMBIGUOUS or (
                effect.state in (EffectState.RESERVED, EffectState.EXECUTING) and effect.lease_lapsed(now))
            may_resolve = request.user.has_perm(RESOLVE)
            reconcile.ensure_discovered()
            has_hook = reconcile.hook_for(effect.action) is not None
            lapsed = effect.state in (EffectState.RESERVED, EffectState.EXECUTING) and effect.lease_lapsed(now)
            hidden = hidden_fields({"name": effect.action}, key)
            context.update({
                "effect_events": [
                    {"id": e.id, "ts": evidence_time(e.ts), "type": e.type, "action_id": e.action_id,
                     "data": mark_safe(dumps_html(e.data, sort_keys=True))}
                    for e in store.events_for_effect(key)
                ],
                "effect_receipts": [
                    {"seq": r.seq, "receipt_id": r.receipt_id, "result": r.result, "action_id": r.action_id,
                     "agent": _shown(r.agent)}
                    for r in store.receipts_for_effect(key)
                ],
                "shown_key": _shown(key),
                "shown_action": _shown(effect.action),
                "hidden_warning": warning(hidden, subject="This effect record") if hidden else None,
                "tampered": not effect.signature_ok,
                "can_ask": may_resolve and askable and (has_hook or lapsed) and effect.signature_ok,
                "has_hook": has_hook,
                "ask_label": "Ask the remote now" if has_hook else "Mark ambiguous (the worker is gone)",
                "can_resolve": may_resolve and effect.state == EffectState.AMBIGUOUS and effect.signature_ok,
                "resolve_form": ResolveForm(initial={"attempt": effect.attempt}),
                "pinned_attempt": effect.attempt,
                "ask_url": reverse("admin:ctrlrun_effectrecord_ask", args=[object_id]),
                "resolve_url": reverse("admin:ctrlrun_effectrecord_resolve", args=[object_id]),
            })
        return super().change_view(request, object_id, form_url, context)

    def _effect_or_404(self, request: HttpRequest, object_id: str) -> tuple[str, str]:
        if not request.user.has_perm(RESOLVE):
            raise PermissionDenied("resolving effects needs the ctrlrun.resolve_effect permission")
        if request.method != "POST":
            raise PermissionDenied("this action only accepts a form submission")
        key = _object_key(object_id)
        if store.get_effect(key) is None:
            raise Http404(f"no effect {reveal(key)}")
        return key, reverse("admin:ctrlrun_effectrecord_change", args=[quote(key)])

    def ask_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        key, change_url = self._effect_or_404(request, object_id)
        reconcile.ensure_discovered()
        try:
            line = reconcile.ask_now(key, requested_by=request.user.get_username())
        except CTRLRunError as exc:
            self.message_user(request, reveal(str(exc)), messages.ERROR)
            return HttpResponseRedirect(change_url)
        level = messages.SUCCESS if line.outcome in ("committed", "failed") else messages.WARNING
        self.message_user(request, reveal(f"asked the remote about {key}: {line.outcome} ({line.detail})"), level)
        self.log_change(request, EffectRecord.objects.using(conf.database_alias()).get(pk=key), f"asked the remote: {line.outcome}")
        return HttpResponseRedirect(change_url)

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        key, change_url = self._effect_or_404(request, object_id)
        form = ResolveForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
            self.message_user(request, reveal(f"not resolved: {problems}"), messages.ERROR)
            return HttpResponseRedirect(change_url)
        outcome, reason, attempt = (form.cleaned_data[f] for f in ("outcome", "reason", "attempt"))
        try:
            store.resolve(key, outcome, by=request.user.get_username(), reason=reason, attempt=attempt)
        except CTRLRunError as exc:
            self.message_user(request, reveal(f"not resolved: {exc}"), messages.ERROR)
            return HttpResponseRedirect(change_url)
        self.log_change(request, EffectRecord.objects.using(conf.database_alias()).get(pk=key), f"resolved {outcome} (attempt {attempt}): {reason}")
        after = ("a retry is now permitted" if outcome == "failed" else "a retry will be refused as a duplicate")
        self.message_user(request, reveal(f"Effect {key} resolved {outcome} by {request.user.get_username()}; {after}"),
                          messages.SUCCESS)
        return HttpResponseRedirect(change_url)


# --------------------------------------------------------------------------- evidence


class ReceiptResultFilter(admin.SimpleListFilter):
    title = "result"
    parameter_name = "result"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(r, r) for r in ("committed", "failed", "ambiguous", "denied", "blocked")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(result=self.value()) if self.value() else queryset


@admin.register(Receipt)
class ReceiptAdmin(EvidenceAdmin):
    list_display = ("seq", "finished", "receipt_id", "shown_action", "decision", "result", "shown_key", "shown_agent")
    list_filter = (ReceiptResultFilter, "decision", ("action", RevealedValuesFilter), ("agent", RevealedValuesFilter),
                   "ts")
    search_fields = ("receipt_id", "action_id", "effect_key", "agent", "action")
    date_hierarchy = "ts"
    list_per_page = 100
    fields = ("receipt_id", "seq", "action_id", "shown_action", "shown_agent", "decision", "result", "shown_key", "ts",
              "prev_hash", "hash", "pretty_document")
    readonly_fields = ("shown_action", "shown_agent", "shown_key", "pretty_document")
    change_list_template = "admin/ctrlrun/receipt/change_list.html"

    @admin.display(description=_("action"), ordering="action")
    def shown_action(self, obj: Receipt) -> SafeString:
        return _shown(obj.action)

    @admin.display(description=_("agent"), ordering="agent")
    def shown_agent(self, obj: Receipt) -> SafeString:
        return _shown(obj.agent)

    @admin.display(description=_("effect key"), ordering="effect_key")
    def shown_key(self, obj: Receipt) -> SafeString:
        return _shown(obj.effect_key)

    @admin.display(description="finished", ordering="ts")
    def finished(self, obj: Receipt) -> str:
        return evidence_time(obj.ts) or "-"

    @admin.display(description="document (ctrlrun.receipt/v7)")
    def pretty_document(self, obj: Receipt) -> str:
        try:
            return _pre(json.loads(obj.document))
        except ValueError:
            return format_html('<pre class="ctrlrun-json">{}</pre><p class="errornote">This document is not valid '
                               'JSON: the row was altered. Run the chain check.</p>',
                               _shown(obj.document, multiline=True))

    def get_urls(self) -> list[Any]:
        return [path("verify/", self.admin_site.admin_view(self.verify_view), name="ctrlrun_receipt_verify"),
                *super().get_urls()]

    def verify_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the last recorded check. POST (a button): a full check now (or, ``mode=incremental``, one from
        the last intact check), recorded, and its report."""
        if not self.has_view_permission(request):
            raise PermissionDenied("reading receipts needs the view permission")
        from .frontpage import chain_status

        report = None
        if request.method == "POST":
            started, clock = store.now(), time.monotonic()
            report = store.verify_incremental() if request.POST.get("mode") == "incremental" else store.verify()
            store.record_check(report, started=started, duration=time.monotonic() - clock,
                               ran_by=f"console: {request.user.get_username()}")
        check = store.last_check()
        context = {
            **self.admin_site.each_context(request),
            "title": "Receipt chain",
            "opts": self.model._meta,
            "report": report,
            "lines": chain_lines(report) if report else [],
            "total": (report.chained + report.unchained) if report else 0,
            "check": check,
            "chain": chain_status(check, store.head_position()[0], store.now(), conf.chain_check_max_age()),
        }
        return TemplateResponse(request, "admin/ctrlrun/receipt/verify.html", context)


@admin.register(Event)
class EventAdmin(EvidenceAdmin):
    list_display = ("id", "when", "type", "action_id", "shown_key", "approval_id", "short_data")
    list_filter = ("type", "ts")
    search_fields = ("action_id", "effect_key", "approval_id")
    date_hierarchy = "ts"
    list_per_page = 100
    fields = ("id", "ts", "type", "action_id", "shown_key", "approval_id", "pretty_data")
    readonly_fields = ("shown_key", "pretty_data")

    @admin.display(description=_("effect key"), ordering="effect_key")
    def shown_key(self, obj: Event) -> SafeString:
        return _shown(obj.effect_key)

    @admin.display(description="ts", ordering="ts")
    def when(self, obj: Event) -> str:
        return evidence_time(obj.ts) or "-"

    @admin.display(description="data")
    def short_data(self, obj: Event) -> str:
        text = dumps(obj.data, sort_keys=True)
        return text if len(text) <= 90 else text[:87] + "…"

    @admin.display(description="data")
    def pretty_data(self, obj: Event) -> str:
        return _pre(obj.data)


@admin.register(PolicyDocument)
class PolicyDocumentAdmin(EvidenceAdmin):
    list_display = ("hash", "schema", "source", "environment", "first_seen", "in_force")
    search_fields = ("hash", "source")
    fields = ("hash", "schema", "source", "environment", "first_seen", "in_force", "pretty_text")
    readonly_fields = ("in_force", "pretty_text")

    @admin.display(description="in force here")
    def in_force(self, obj: PolicyDocument) -> str:
        current = _current_policy_hash()
        if current is None:
            return "unknown (this server cannot read its policy file)"
        return f"yes: {conf.policy_path()}" if obj.hash == current else "no (an earlier or other policy)"

    @admin.display(description="text")
    def pretty_text(self, obj: PolicyDocument) -> str:
        return format_html('<pre class="ctrlrun-json">{}</pre>', mark_safe(reveal_html(obj.text, multiline=True)))


def _current_policy_hash() -> str | None:
    from .policy import load_policy

    try:
        return load_policy(conf.policy_path(), environment=conf.environment()).hash
    except CTRLRunError:
        return None


def overview_context() -> dict[str, Any]:
    """The console front page's context (``ctrlrun.frontpage``): the last recorded chain check, never a re-hash."""
    from .frontpage import overview_context as context

    return context()
