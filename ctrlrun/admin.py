"""The human console: the approval inbox, the resolution console and the evidence.

Everything a person decides here goes through the same store functions as the commands
(``store.answer_approval``, ``store.resolve``, ``reconcile.ask_now``); the console never
writes ctrlrun's rows itself. Evidence (receipts, events, policy documents) is read-only for
everyone. Deciding approvals and resolving effects need the custom permissions
``ctrlrun.decide_approval`` and ``ctrlrun.resolve_effect``; without them a user sees no buttons
and the action URLs answer 403.
"""
from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Case, IntegerField, Q, Value, When
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

from . import conf, reconcile, store
from .canonical import evidence_time, idempotency_token_for
from .errors import CTRLRunError
from .models import Approval, EffectRecord, Event, PolicyDocument, Receipt
from .report import chain_lines
from .states import ApprovalStatus, EffectState

DECIDE = "ctrlrun.decide_approval"
RESOLVE = "ctrlrun.resolve_effect"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _pre(value: Any) -> str:
    return format_html('<pre class="ctrlrun-json">{}</pre>', _pretty(value))


class EvidenceAdmin(admin.ModelAdmin):
    """Read-only for everyone, superusers included: evidence is never edited in the console."""

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).using(conf.database_alias())  # CTRLRUN_DATABASE

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --------------------------------------------------------------------------- approvals


class DecisionForm(forms.Form):
    note = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                           help_text="Optional: why, kept with the answer and in the event.")


@admin.register(Approval)
class ApprovalAdmin(EvidenceAdmin):
    list_display = ("request", "status", "action", "key_arguments", "principal", "age", "expiry")
    list_display_links = ("request",)
    list_filter = ("status", "action", "agent")
    search_fields = ("approval_id", "action", "agent", "user", "effect_key", "action_hash")
    list_per_page = 50
    fieldsets = [
        ("What the human is authorising", {"fields": (
            "action", "canonical_arguments", "principal", "resource", "environment", "action_hash", "effect_key")}),
        ("Why it needs a person", {"fields": ("decision_reason", "policy_hash")}),
        ("The request", {"fields": (
            "approval_id", "status", "created_at", "expires_at", "time_left", "approver", "note", "answered_at",
            "consumed_at", "consumed_by", "action_id")}),
    ]
    readonly_fields = ("canonical_arguments", "principal", "resource", "environment", "time_left")
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

    @admin.display(description="arguments")
    def key_arguments(self, obj: Approval) -> str:
        arguments = json.loads(obj.action_json).get("arguments", {})
        text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(arguments.items()))
        return text if len(text) <= 80 else text[:77] + "…"

    @admin.display(description="principal")
    def principal(self, obj: Approval) -> str:
        return obj.agent + (f" (user {obj.user})" if obj.user else "")

    @admin.display(description="age")
    def age(self, obj: Approval) -> str:
        return timesince(obj.created_at, conf.now())

    @admin.display(description="expires")
    def expiry(self, obj: Approval) -> str:
        now = conf.now()
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
    def resource(self, obj: Approval) -> str:
        return json.loads(obj.action_json).get("resource") or "-"

    @admin.display(description="environment")
    def environment(self, obj: Approval) -> str:
        return json.loads(obj.action_json).get("environment") or "-"

    def get_urls(self) -> list[Any]:
        decide = self.admin_site.admin_view(self.decide_view)
        return [path("<str:object_id>/decide/<str:answer>/", decide, name="ctrlrun_approval_decide"), *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        approval = store.get_approval(unquote(object_id))  # the admin's URLs quote the pk (apr_5F...)
        pending = approval is not None and approval.status == ApprovalStatus.PENDING
        own = approval is not None and approval.user is not None and approval.user == request.user.get_username()
        context = {
            "can_decide": pending and request.user.has_perm(DECIDE) and not own,
            "own_request": own,
            "is_pending": pending,
            **(extra_context or {}),
        }
        return super().change_view(request, object_id, form_url, context)

    def decide_view(self, request: HttpRequest, object_id: str, answer: str) -> HttpResponse:
        if answer not in ("approve", "deny"):
            raise Http404("unknown answer")
        if not request.user.has_perm(DECIDE):
            raise PermissionDenied("deciding approvals needs the ctrlrun.decide_approval permission")
        object_id = unquote(object_id)
        approval = store.get_approval(object_id)
        if approval is None:
            raise Http404(f"no approval request {object_id}")
        change_url = reverse("admin:ctrlrun_approval_change", args=[quote(object_id)])
        form = DecisionForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            note = form.cleaned_data["note"] or None
            try:
                result = store.answer_approval(object_id, answer == "approve", by=request.user.get_username(),
                                               note=note)
            except CTRLRunError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return HttpResponseRedirect(change_url)
            verb = "granted" if answer == "approve" else "denied"
            self.log_change(request, Approval.objects.using(conf.database_alias()).get(pk=object_id),
                            f"{verb} {object_id}" + (f": {note}" if note else ""))
            # Not starting with the id: the admin capitalises a message's first letter (Apr_...).
            self.message_user(request, f"Request {object_id} {verb}. "
                              + (f"The agent may now retry inside ctrlrun.with_approval('{object_id}')."
                                 if result.status == ApprovalStatus.GRANTED else ""), messages.SUCCESS)
            return HttpResponseRedirect(change_url)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{'Approve' if answer == 'approve' else 'Deny'} {approval.action}?",
            "approval": approval,
            "arguments": _pretty(approval.arguments),
            "answer": answer,
            "form": form,
            "opts": self.model._meta,
            "change_url": change_url,
            "expires_in": timeuntil(approval.expires_at, conf.now()) if approval.expires_at > conf.now() else None,
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
                                   lease_expires_at__lte=conf.now())
        return queryset


@admin.register(EffectRecord)
class EffectRecordAdmin(EvidenceAdmin):
    list_display = ("effect_key", "state", "action", "attempt", "age", "last_error", "hook", "lease")
    list_filter = (NeedsAttentionFilter, "state", "action")
    search_fields = ("effect_key", "action_id", "action")
    list_per_page = 50
    fields = ("effect_key", "action", "state", "attempt", "action_id", "lease_expires_at", "error", "resolved_by",
              "reconcile_failures", "reconcile_after", "created_at", "updated_at", "idempotency_token", "hook")
    readonly_fields = ("idempotency_token", "hook")
    change_form_template = "admin/ctrlrun/effectrecord/change_form.html"

    def get_queryset(self, request: HttpRequest) -> Any:
        held = [EffectState.RESERVED, EffectState.EXECUTING]
        return super().get_queryset(request).annotate(
            attention=Case(
                When(state=EffectState.AMBIGUOUS, then=Value(0)),
                When(Q(state__in=held) & Q(lease_expires_at__lte=conf.now()), then=Value(1)),
                default=Value(2), output_field=IntegerField(),
            )
        ).order_by("attention", "-updated_at")

    @admin.display(description="age")
    def age(self, obj: EffectRecord) -> str:
        return timesince(obj.updated_at, conf.now())

    @admin.display(description="last error")
    def last_error(self, obj: EffectRecord) -> str:
        if not obj.error:
            return "-"
        return obj.error if len(obj.error) <= 70 else obj.error[:67] + "…"

    @admin.display(description="reconcile hook")
    def hook(self, obj: EffectRecord) -> str:
        reconcile.ensure_discovered()
        return "found" if reconcile.hook_for(obj.action) else "none (a human decides)"

    @admin.display(description="lease")
    def lease(self, obj: EffectRecord) -> str:
        if obj.lease_expires_at is None:
            return "-"
        now = conf.now()
        return "lapsed" if obj.lease_expires_at <= now else f"{timeuntil(obj.lease_expires_at, now)} left"

    @admin.display(description="provider idempotency token (this attempt)")
    def idempotency_token(self, obj: EffectRecord) -> str:
        return idempotency_token_for(obj.effect_key, obj.attempt)

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/ask/", view(self.ask_view), name="ctrlrun_effectrecord_ask"),
            path("<path:object_id>/resolve/", view(self.resolve_view), name="ctrlrun_effectrecord_resolve"),
            *super().get_urls(),
        ]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        from django.contrib.admin.utils import unquote

        key = unquote(object_id)
        effect = store.get_effect(key)
        context: dict[str, Any] = dict(extra_context or {})
        if effect is not None:
            now = conf.now()
            askable = effect.state == EffectState.AMBIGUOUS or (
                effect.state in (EffectState.RESERVED, EffectState.EXECUTING) and effect.lease_lapsed(now))
            may_resolve = request.user.has_perm(RESOLVE)
            reconcile.ensure_discovered()
            has_hook = reconcile.hook_for(effect.action) is not None
            lapsed = effect.state in (EffectState.RESERVED, EffectState.EXECUTING) and effect.lease_lapsed(now)
            context.update({
                "effect_events": [
                    {"id": e.id, "ts": evidence_time(e.ts), "type": e.type, "action_id": e.action_id,
                     "data": json.dumps(e.data, sort_keys=True, ensure_ascii=False)}
                    for e in store.events_for_effect(key)
                ],
                "effect_receipts": store.receipts_for_effect(key),
                "can_ask": may_resolve and askable and (has_hook or lapsed),
                "has_hook": has_hook,
                "ask_label": "Ask the remote now" if has_hook else "Mark ambiguous (the worker is gone)",
                "can_resolve": may_resolve and effect.state == EffectState.AMBIGUOUS,
                "resolve_form": ResolveForm(initial={"attempt": effect.attempt}),
                "pinned_attempt": effect.attempt,
                "ask_url": reverse("admin:ctrlrun_effectrecord_ask", args=[object_id]),
                "resolve_url": reverse("admin:ctrlrun_effectrecord_resolve", args=[object_id]),
            })
        return super().change_view(request, object_id, form_url, context)

    def _effect_or_404(self, request: HttpRequest, object_id: str) -> tuple[str, str]:
        from django.contrib.admin.utils import quote, unquote

        if not request.user.has_perm(RESOLVE):
            raise PermissionDenied("resolving effects needs the ctrlrun.resolve_effect permission")
        if request.method != "POST":
            raise PermissionDenied("this action only accepts a form submission")
        key = unquote(object_id)
        if store.get_effect(key) is None:
            raise Http404(f"no effect {key}")
        return key, reverse("admin:ctrlrun_effectrecord_change", args=[quote(key)])

    def ask_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        key, change_url = self._effect_or_404(request, object_id)
        reconcile.ensure_discovered()
        try:
            line = reconcile.ask_now(key, requested_by=request.user.get_username())
        except CTRLRunError as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return HttpResponseRedirect(change_url)
        level = messages.SUCCESS if line.outcome in ("committed", "failed") else messages.WARNING
        self.message_user(request, f"asked the remote about {key}: {line.outcome} ({line.detail})", level)
        self.log_change(request, EffectRecord.objects.using(conf.database_alias()).get(pk=key), f"asked the remote: {line.outcome}")
        return HttpResponseRedirect(change_url)

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        key, change_url = self._effect_or_404(request, object_id)
        form = ResolveForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
            self.message_user(request, f"not resolved: {problems}", messages.ERROR)
            return HttpResponseRedirect(change_url)
        outcome, reason, attempt = (form.cleaned_data[f] for f in ("outcome", "reason", "attempt"))
        try:
            store.resolve(key, outcome, by=request.user.get_username(), reason=reason, attempt=attempt)
        except CTRLRunError as exc:
            self.message_user(request, f"not resolved: {exc}", messages.ERROR)
            return HttpResponseRedirect(change_url)
        self.log_change(request, EffectRecord.objects.using(conf.database_alias()).get(pk=key), f"resolved {outcome} (attempt {attempt}): {reason}")
        after = ("a retry is now permitted" if outcome == "failed" else "a retry will be refused as a duplicate")
        self.message_user(request, f"Effect {key} resolved {outcome} by {request.user.get_username()}; {after}",
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
    list_display = ("seq", "finished", "receipt_id", "action", "decision", "result", "effect_key", "agent")
    list_filter = (ReceiptResultFilter, "decision", "action", "agent", "ts")
    search_fields = ("receipt_id", "action_id", "effect_key", "agent", "action")
    date_hierarchy = "ts"
    list_per_page = 100
    fields = ("receipt_id", "seq", "action_id", "action", "agent", "decision", "result", "effect_key", "ts",
              "prev_hash", "hash", "pretty_document")
    readonly_fields = ("pretty_document",)
    change_list_template = "admin/ctrlrun/receipt/change_list.html"

    @admin.display(description="finished", ordering="ts")
    def finished(self, obj: Receipt) -> str:
        return evidence_time(obj.ts) or "-"

    @admin.display(description="document (ctrlrun.receipt/v7)")
    def pretty_document(self, obj: Receipt) -> str:
        try:
            return _pre(json.loads(obj.document))
        except ValueError:
            return format_html('<pre class="ctrlrun-json">{}</pre><p class="errornote">This document is not valid '
                               'JSON: the row was altered. Run the chain check.</p>', obj.document)

    def get_urls(self) -> list[Any]:
        return [path("verify/", self.admin_site.admin_view(self.verify_view), name="ctrlrun_receipt_verify"),
                *super().get_urls()]

    def verify_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied("reading receipts needs the view permission")
        report = store.verify()
        context = {
            **self.admin_site.each_context(request),
            "title": "Receipt chain",
            "opts": self.model._meta,
            "report": report,
            "lines": chain_lines(report),
            "total": report.chained + report.unchained,
        }
        return TemplateResponse(request, "admin/ctrlrun/receipt/verify.html", context)


@admin.register(Event)
class EventAdmin(EvidenceAdmin):
    list_display = ("id", "when", "type", "action_id", "effect_key", "approval_id", "short_data")
    list_filter = ("type", "ts")
    search_fields = ("action_id", "effect_key", "approval_id")
    date_hierarchy = "ts"
    list_per_page = 100
    fields = ("id", "ts", "type", "action_id", "effect_key", "approval_id", "pretty_data")
    readonly_fields = ("pretty_data",)

    @admin.display(description="ts", ordering="ts")
    def when(self, obj: Event) -> str:
        return evidence_time(obj.ts) or "-"

    @admin.display(description="data")
    def short_data(self, obj: Event) -> str:
        text = json.dumps(obj.data, sort_keys=True, ensure_ascii=False)
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
        return format_html('<pre class="ctrlrun-json">{}</pre>', obj.text)


def _current_policy_hash() -> str | None:
    from .policy import load_policy

    try:
        return load_policy(conf.policy_path(), environment=conf.environment()).hash
    except CTRLRunError:
        return None


def overview_context() -> dict[str, Any]:
    """The console front page's counts, with the chain checked when it is small enough to do live."""
    counts = store.overview()
    chain: str | None = None
    #: Re-hashing costs ~10 µs a receipt; beyond this, the front page links to the check instead.
    live_limit = 20000
    if counts.receipts <= live_limit:
        chain = "intact" if store.verify().ok else "broken"
    return {"overview": counts, "chain_status": chain, "now": timezone.now()}
