"""The human console: the approval inbox, the resolution console and the evidence.

Everything a person decides here goes through the same store functions as the commands
(``store.answer_approval``, ``store.resolve``, ``reconcile.ask_now``); the console never
writes ctrlrun's rows itself. Evidence (receipts, events, policy documents) is read-only for
everyone. Deciding approvals and resolving effects need the custom permissions
``ctrlrun.decide_approval`` and ``ctrlrun.resolve_effect`` (``has_decide_permission``,
``has_resolve_permission``); without them a user sees no buttons and the action URLs answer 403.

The pages follow one story: an approval links to the call that asked and the call that used
it; a call's page shows its action, decision (with the policy rule as written), effect record,
approvals, receipts and events; every id on every page is a link. URLs are built for the admin
site serving the page (``self.admin_site.name``), so the console works on a custom AdminSite.
"""
from __future__ import annotations

import datetime as dt
import functools
import json
import threading
import time
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters, get_content_type_for_model
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, transaction
from django.db.models import Case, F, IntegerField, Model, OuterRef, Q, Subquery, Value, When
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import conf, reconcile, store
from .canonical import idempotency_token_for
from .console import (approval_link, badge, call_link, change_url, changelist_url, cited_by, controls_html, data_rows,
                      effect_link, link, policy_link, reason_html, receipt_link, shown, tampered_badge, when, when_text)
from .display import dumps, dumps_html, has_hidden, hidden_fields, is_blank, reveal, reveal_html, warning
from .errors import CTRLRunError, StateConflict
from .identity import same_person
from .messages import state_conflict
from .models import Approval, Delegation, EffectRecord, Event, PausedRun, PolicyDocument, Receipt
from .receipts import INDEXED_COLUMNS, row_problem
from .report import chain_lines
from .states import (
    EMITTED_EVENT_TYPES,
    HOLDING_STATES,
    ApprovalStatus,
    EffectState,
    EventType,
    askable,
    effective_approval_status,
    held_lapsed,
)

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
HELD = tuple(HOLDING_STATES)


# --------------------------------------------------------------------------- showing what people read
#
# Every string an agent, a policy or a remote put in a row is shown through ``ctrlrun.display``
# (``console.shown``): invisible and direction-changing characters become highlighted escapes,
# never raw text, and the pages that show an action to decide on warn when it holds any.


def _pre(value: Any) -> SafeString:
    return format_html('<pre class="ctrlrun-json">{}</pre>', mark_safe(dumps_html(value, indent=2, sort_keys=True)))


def _principal_html(agent: str, user: str | None) -> SafeString:
    if user:
        return format_html("{} ({} {})", shown(agent), _g("user"), shown(user))
    return shown(agent)


def _object_key(object_id: str) -> str:
    """The primary key in an admin URL, unquoted; a NUL character (which PostgreSQL cannot be
    sent, and no ctrlrun key holds) is a 404."""
    key = unquote(object_id)
    if "\x00" in key:
        raise Http404(_g("no such record: a ctrlrun id or key never contains a NUL character"))
    return key


def _at(field: str, label: Any) -> Any:
    """A display method showing ``field`` in the console's one time format (UTC, seconds, zone)."""

    @admin.display(description=label, ordering=field)
    def show(self: Any, obj: Any) -> SafeString:
        return when(getattr(obj, field))

    show.__name__ = f"at_{field}"
    return show


def _ago(moment: dt.datetime | None) -> str:
    if moment is None:
        return "-"
    now = _now()
    if abs((now - moment).total_seconds()) < 60:
        return _g("just now") if moment <= now else _g("in less than a minute")
    return _g("%(time)s ago") % {"time": timesince(moment, now)} if moment <= now else \
        _g("in %(time)s") % {"time": timeuntil(moment, now)}


def _action_summary(action: dict[str, Any] | None) -> dict[str, Any] | None:
    """The action a call proposed, as the rows at the top of a page: arguments, principal, resource."""
    if not isinstance(action, dict):
        return None
    principal = action.get("principal") or {}
    return {
        "name": shown(action.get("name")),
        "arguments": _pre(action.get("arguments", {})),
        "principal": _principal_html(str(principal.get("agent", "-")), principal.get("user")),
        "resource": shown(action.get("resource")),
        "environment": shown(action.get("environment")),
        "hash": action.get("action_hash"),
    }


def _proposed(events: list[Any]) -> dict[str, Any] | None:
    """The canonical action from the last ACTION_PROPOSED among ``events``."""
    for event in reversed(events):
        if event.type == "ACTION_PROPOSED" and isinstance(event.data.get("action"), dict):
            return event.data["action"]
    return None


def _policy_document(policy_hash: str | None) -> PolicyDocument | None:
    """The stored policy text pages explain decisions with: only one ctrlrun stored (a row written
    under a policy's hash outside ctrlrun is never shown as the rules that decided)."""
    return store.policy_document(policy_hash)


def _timeline(site: str, events: list[Any]) -> list[dict[str, Any]]:
    return [{"id": e.id, "ts": when(e.ts), "type": e.type, "call": call_link(site, e.action_id),
             "data": data_rows(e.data)}
            for e in events]


def _receipt_rows(site: str, receipts: list[Any]) -> list[dict[str, Any]]:
    return [{"seq": r.seq, "receipt": receipt_link(site, r.receipt_id), "ts": when(r.ts),
             "decision": badge(r.decision), "result": badge(r.result), "call": call_link(site, r.action_id),
             "agent": shown(r.agent)} for r in receipts]


class RevealedValuesFilter(admin.AllValuesFieldListFilter):
    """The admin's filter by distinct values, each value shown with hidden characters escaped."""

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            yield {**choice, "display": reveal(str(choice["display"]))}


class WrittenFilter(admin.DateFieldListFilter):
    """The date filter on ``ts``, titled for people ("written"), not by the column's name."""

    def __init__(self, field: Any, request: Any, params: Any, model: Any, model_admin: Any, field_path: str) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        self.title = _("written")


class EvidenceAdmin(admin.ModelAdmin):
    """Read-only for everyone, superusers included: evidence is never edited in the console."""

    #: ctrlrun's lists need the page's width: the app sidebar stays off on its pages.
    console_context = {"is_nav_sidebar_enabled": False}

    @property
    def site(self) -> str:
        return self.admin_site.name

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).using(store.alias())  # CTRLRUN_DATABASE

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

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        _clock.value = None  # this page's times are read afresh (a page after a POST shows the change)
        unknown = self._unknown_filter_values(request)
        if unknown:  # said, and dropped: never the whole list silently, as if the filter applied
            self.message_user(request, _g("Unknown filter value %(values)s: showing the list without it.") % {
                "values": ", ".join(f"{k}={reveal(v)!r}" for k, v in unknown)}, messages.WARNING)
            query = request.GET.copy()
            for key, _value in unknown:
                query.pop(key, None)
            return HttpResponseRedirect(f"{request.path}?{query.urlencode()}" if query else request.path)
        return super().changelist_view(request, {**self.console_context, **(extra_context or {})})

    def _unknown_filter_values(self, request: HttpRequest) -> list[tuple[str, str]]:
        """The values of ctrlrun's own list filters in the query string that name none of their choices."""
        unknown = []
        for spec in self.list_filter:
            if isinstance(spec, type) and issubclass(spec, admin.SimpleListFilter) and not getattr(
                    spec, "any_value", False):
                value = request.GET.get(spec.parameter_name)
                if value is None:
                    continue
                choices = {str(k) for k, _label in spec(request, {}, self.model, self).lookup_choices}
                if value not in choices:
                    unknown.append((spec.parameter_name, value))
        return unknown

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: dict[str, Any] | None = None) -> Any:
        _clock.value = None
        return super().changeform_view(request, object_id, form_url, {**self.console_context, **(extra_context or {})})

    def render_change_form(self, request: HttpRequest, context: dict[str, Any], add: bool = False,
                           change: bool = False, form_url: str = "", obj: Any = None) -> Any:
        if obj is not None:  # the page's title, subtitle and breadcrumb name the object: escaped
            context["subtitle"] = reveal(str(obj))
            context["shown_original"] = reveal(str(obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None) -> Any:
        obj = self.get_object(request, unquote(object_id))
        context: dict[str, Any] = {**self.console_context, **(extra_context or {})}
        if obj is not None:
            context.setdefault("title", _g("Change history: %s") % reveal(str(obj)))
            context["shown_object"] = reveal(str(obj))
        return super().history_view(request, object_id, context)

    def console_page(self, request: HttpRequest, template: str, context: dict[str, Any]) -> TemplateResponse:
        """One of ctrlrun's own pages, rendered as the admin renders its own (site context, current app)."""
        request.current_app = self.site
        _clock.value = None
        return TemplateResponse(request, template, {
            **self.admin_site.each_context(request), **self.console_context, "opts": self.model._meta, **context})

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


def refusal_text(exc: CTRLRunError) -> str:
    """A refusal as the console words it: a ``StateConflict`` (the store's facts) in the console's
    terms (no command line named), any other error as it says itself."""
    return state_conflict(exc) if isinstance(exc, StateConflict) else str(exc)


# --------------------------------------------------------------------------- paused runs (ctrlrun.resumption)

#: The paused run's state is shown up to this many characters (it can be megabytes of JSON).
STATE_SHOWN = 20_000
VIEW_APPROVAL = "ctrlrun.view_approval"


def _paused_badge(status: str) -> SafeString:
    tone = {"pending": "warn", "resuming": "info", "resumed": "ok", "failed": "alert"}.get(status, "alert")
    return format_html('<span class="ctrlrun-badge {}">{}</span>', tone, shown(status))


def _paused_run_line(site: str, approval_id: str) -> SafeString | None:
    """On an approval's page: the paused agent run waiting for (or resumed after) this answer."""
    row = PausedRun.objects.using(store.alias()).filter(approval_id=approval_id).only(
        "id", "framework", "status").first()
    if row is None:
        return None
    run = link(change_url(site, "pausedrun", row.pk), _g("paused run %(id)s") % {"id": row.pk})
    if row.status == PausedRun.PENDING:
        return format_html(_g("A paused {} run waits for this answer: {} ({})."), shown(row.framework), run,
                           _paused_badge(row.status))
    return format_html(_g("A paused {} run waited for this answer: {} ({})."), shown(row.framework), run,
                       _paused_badge(row.status))


class _NumberedRows(EvidenceAdmin):
    """Read-only rows with integer ids, seen by whoever may view them (the app index follows): an id
    that is not a number is no row (a 404), never a database error."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        try:
            int(object_id)
        except ValueError:
            return None
        return super().get_object(request, object_id, from_field)


@admin.register(PausedRun)
class PausedRunAdmin(_NumberedRows):
    """Agent runs paused on an approval (``ctrlrun.resumption``): read-only for everyone, and
    visible to whoever may read approvals (the console's groups): a paused run is what an
    approval's answer will continue. Never edited here; ``resume_runs`` moves them."""

    list_display = ("run", "status_and_answer", "shown_framework", "listed_approval", "shown_resume_with", "times")
    list_display_links = None
    list_filter = ("status", "framework")
    search_fields = ("approval_id", "resume_with", "claimed_by")
    list_per_page = 50
    ordering = ("-created_at", "-id")
    fieldsets = [
        (_("The paused run"), {"fields": ("run", "shown_status", "shown_framework", "approval", "shown_resume_with",
                                          "shown_signature")}),
        (_("Resuming"), {"fields": ("shown_answer", "at_created_at", "at_claimed_at", "shown_claimed_by",
                                    "at_resumed_at", "shown_error")}),
        (_("Released"), {"fields": ("shown_released_by", "at_released_at", "shown_release_reason",
                                    "shown_released_claim")}),
        (_("The framework's state (not trusted for consent)"), {"fields": ("shown_state",)}),
    ]
    readonly_fields = ("run", "shown_status", "shown_framework", "approval", "shown_resume_with", "shown_signature",
                       "shown_answer",
                       "at_created_at", "at_claimed_at", "shown_claimed_by", "at_resumed_at", "shown_error",
                       "shown_released_by", "at_released_at", "shown_release_reason", "shown_released_claim",
                       "shown_state")

    at_created_at = _at("created_at", _("paused at"))
    at_claimed_at = _at("claimed_at", _("claimed at"))
    at_resumed_at = _at("resumed_at", _("finished at"))
    at_released_at = _at("released_at", _("released at"))

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).defer("state")  # the list never reads the (large) state

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return user.is_active and user.is_staff and (user.has_perm(VIEW_APPROVAL) or user.has_perm(
            "ctrlrun.view_pausedrun"))


    @admin.display(description=_("run"), ordering="id")
    def run(self, obj: PausedRun) -> SafeString:
        return link(change_url(self.site, "pausedrun", obj.pk), str(obj.pk))

    @admin.display(description=_("signature"))
    def shown_signature(self, obj: PausedRun) -> SafeString:
        if store.paused_run_ok(obj):
            return format_html("{}", _g("ctrlrun's: the request, framework, state and resumer are as stored"))
        return format_html('<span class="ctrlrun-badge alert">{}</span>', _g(
            "NOT ctrlrun's: changed outside ctrlrun; it is never resumed. Run receipts --verify-chain"))

    @admin.display(description=_("status"), ordering="status")
    def shown_status(self, obj: PausedRun) -> SafeString:
        return _paused_badge(obj.status)

    @admin.display(description=_("framework"), ordering="framework")
    def shown_framework(self, obj: PausedRun) -> SafeString:
        return shown(obj.framework)

    @admin.display(description=_("approval"), ordering="approval_id")
    def approval(self, obj: PausedRun) -> SafeString:
        return approval_link(self.site, obj.approval_id, short=None)

    @admin.display(description=_("waits for"), ordering="approval_id")
    def listed_approval(self, obj: PausedRun) -> SafeString:
        """What the run waits on: the approval request and its status now (read through the store,
        signature checked), e.g. "waits for approval apr_… (pending)"."""
        verb = _g("waits for approval") if obj.status == PausedRun.PENDING else _g("waited for approval")
        request = store.get_approval(obj.approval_id)
        if request is None:
            status = format_html("{}", _g("no such request in the store"))
        elif not request.signature_ok:
            status = tampered_badge(_g("its row does not carry ctrlrun's signature"))
        else:
            status = badge(effective_approval_status(request.status, request.expires_at, _now()))
        return format_html("{} {} ({})", verb, approval_link(self.site, obj.approval_id, short=16), status)

    @admin.display(description=_("status / answer"), ordering="status")
    def status_and_answer(self, obj: PausedRun) -> SafeString:
        if not obj.answer:
            return _paused_badge(obj.status)
        return format_html("{} {}", _paused_badge(obj.status), badge(obj.answer, reveal(obj.answer)))

    @admin.display(description=_("paused, claimed (by), finished"), ordering="created_at")
    def times(self, obj: PausedRun) -> SafeString:
        """The three times and the claiming process in one column, so the list fits 1280 px beside its filters."""
        lines = [format_html("{} {}", _g("paused"), when(obj.created_at))]
        if obj.claimed_at is not None:
            lines.append(format_html("{} {} {} {}", _g("claimed"), when(obj.claimed_at), _g("by"),
                                     shown(obj.claimed_by)))
        if obj.resumed_at is not None:
            lines.append(format_html("{} {}", _g("finished"), when(obj.resumed_at)))
        return format_html_join(mark_safe("<br>"), "{}", ((line,) for line in lines))

    @admin.display(description=_("resume with"), ordering="resume_with")
    def shown_resume_with(self, obj: PausedRun) -> SafeString:
        return shown(obj.resume_with)

    @admin.display(description=_("answer"), ordering="answer")
    def shown_answer(self, obj: PausedRun) -> SafeString:
        return badge(obj.answer, reveal(obj.answer)) if obj.answer else shown(None)

    @admin.display(description=_("claimed by"), ordering="claimed_by")
    def shown_claimed_by(self, obj: PausedRun) -> SafeString:
        return shown(obj.claimed_by)

    @admin.display(description=_("error"))
    def shown_error(self, obj: PausedRun) -> SafeString:
        return shown(obj.error, multiline=True)

    @admin.display(description=_("released by"))
    def shown_released_by(self, obj: PausedRun) -> SafeString:
        return shown(obj.released_by)

    @admin.display(description=_("reason"))
    def shown_release_reason(self, obj: PausedRun) -> SafeString:
        return shown(obj.release_reason, multiline=True)

    @admin.display(description=_("released claim"))
    def shown_released_claim(self, obj: PausedRun) -> SafeString:
        return shown(obj.released_claim)

    @admin.display(description=_("state"))
    def shown_state(self, obj: PausedRun) -> SafeString:
        """The state as stored, escaped, collapsed, and cut when large (never parsed for the page)."""
        text = obj.state or ""
        cut = len(text) > STATE_SHOWN
        summary = (_g("%(n)s characters of JSON text; the first %(shown)s shown") % {
            "n": f"{len(text):,}", "shown": f"{STATE_SHOWN:,}"} if cut else
            _g("%(n)s characters of JSON text") % {"n": f"{len(text):,}"})
        return format_html('<details id="ctrlrun-paused-state"><summary>{}</summary>'
                           '<pre class="ctrlrun-json">{}</pre></details>', summary,
                           mark_safe(reveal_html(text[:STATE_SHOWN], multiline=True)) if text else "-")



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
            "shown_effect_key")}),
        (_("Why it needs a person"), {"fields": ("shown_reason", "cited_controls", "shown_policy")}),
        (_("The request"), {"fields": (
            "approval_id", "shown_status", "asked_by_call", "at_created_at", "at_expires_at", "shown_approver",
            "shown_note", "at_answered_at", "at_consumed_at", "used_by_call")}),
    ]
    readonly_fields = ("shown_action", "canonical_arguments", "principal", "resource", "environment",
                       "shown_effect_key", "shown_reason", "cited_controls", "shown_policy", "shown_status",
                       "asked_by_call",
                       "at_created_at", "at_expires_at", "shown_approver", "shown_note", "at_answered_at",
                       "at_consumed_at", "used_by_call")
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
        return [path("<str:object_id>/decide/<str:answer>/", decide, name="ctrlrun_approval_decide"), *super().get_urls()]

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
        if self.get_object(request, object_id) is None:
            raise Http404(_g("no approval request %(id)s") % {"id": reveal(object_id)})
        approval = store.get_approval(object_id)
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
        form = DecisionForm(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            note = form.cleaned_data["note"] or None
            try:  # the store decides (it also moves a request past its expiry to expired)
                result = store.answer_approval(object_id, answer == "approve", by=username, note=note)
            except CTRLRunError as exc:
                self.message_user(request, reveal(refusal_text(exc)), messages.ERROR)
                return HttpResponseRedirect(change)
            verb = "granted" if answer == "approve" else "denied"
            self.log_change(request, Approval.objects.using(store.alias()).get(pk=object_id),
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
            "answer": answer,
            "form": form,
            "change_url": change,
            "expires_in": timeuntil(approval.expires_at, now) if approval.expires_at > now else None,
        })

    @staticmethod
    def _answered_message(result: Any, verb: str) -> str:
        """What an operator needs to know once they answered: what happens to the agent's call now."""
        # Not starting with the id: the admin capitalises a message's first letter (Apr_...).
        if result.status == ApprovalStatus.GRANTED:
            return _g("Request %(id)s granted. The agent's call of %(action)s with exactly these arguments may now "
                      "run, once, until %(at)s; any other call is refused.") % {
                "id": result.approval_id, "action": reveal(result.action), "at": when_text(result.expires_at)}
        return _g("Request %(id)s denied. The agent's call of %(action)s will not run; a retry under this "
                  "request is refused.") % {"id": result.approval_id, "action": reveal(result.action)}


# --------------------------------------------------------------------------- effects


class ResolveForm(forms.Form):
    outcome = forms.ChoiceField(choices=[("committed", _("committed: the remote did act")),
                                         ("failed", _("failed: the remote did not act"))],
                                widget=forms.RadioSelect)
    reason = forms.CharField(max_length=4000, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
                             help_text=_("Required: what you checked, e.g. what the remote's dashboard shows."))
    attempt = forms.IntegerField(widget=forms.HiddenInput)

    def clean_reason(self) -> str:
        reason = self.cleaned_data["reason"]
        if is_blank(reason):  # as the resolve command: invisible characters say nothing either
            raise forms.ValidationError(_("a reason is required: say what you checked, e.g. what the remote's "
                                          "dashboard shows"))
        return reason


_HEX = "hex:"


def _selection_value(key: str) -> str:
    """An effect key as a selection checkbox's value: as it is, unless it holds hidden characters
    (or could be mistaken for an encoded one), then ``hex:`` and its UTF-8 in hex."""
    if key.startswith(_HEX) or has_hidden(key):
        return _HEX + key.encode("utf-8", "surrogatepass").hex()
    return key


def _selected_key(value: str) -> str:
    if value.startswith(_HEX):
        try:
            return bytes.fromhex(value[len(_HEX):]).decode("utf-8", "surrogatepass")
        except ValueError:
            return value  # not one of ours: matches no record
    return value


class NeedsAttentionFilter(admin.SimpleListFilter):
    title = _("needs attention")
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("ambiguous", _("ambiguous")), ("lapsed", _("lease lapsed"))]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.value() == "ambiguous":
            return queryset.filter(state=EffectState.AMBIGUOUS)
        if self.value() == "lapsed":
            return queryset.filter(state__in=HELD, lease_expires_at__lte=_now())
        return queryset


@admin.register(EffectRecord)
class EffectRecordAdmin(EvidenceAdmin):
    list_display = ("shown_key", "shown_state", "shown_action", "attempt", "changed", "lease", "hook", "last_error")
    list_filter = (NeedsAttentionFilter, "state", ("action", RevealedValuesFilter))
    search_fields = ("effect_key", "action_id", "action")
    list_per_page = 50
    actions = ["ask_selected"]
    fields = ("shown_key", "shown_action", "shown_state", "attempt", "holder", "at_lease_expires_at", "shown_error",
              "shown_resolved_by", "reconcile_failures", "at_reconcile_after", "at_created_at", "at_updated_at",
              "idempotency_token", "hook")
    readonly_fields = ("shown_key", "shown_action", "shown_state", "holder", "at_lease_expires_at", "shown_error",
                       "shown_resolved_by", "at_reconcile_after", "at_created_at", "at_updated_at",
                       "idempotency_token", "hook")
    change_form_template = "admin/ctrlrun/effectrecord/change_form.html"

    at_created_at = _at("created_at", _("first reserved at"))
    at_updated_at = _at("updated_at", _("last changed at"))
    at_reconcile_after = _at("reconcile_after", _("next ask of the remote after"))

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).annotate(
            attention=Case(
                When(state=EffectState.AMBIGUOUS, then=Value(0)),
                When(Q(state__in=HELD) & Q(lease_expires_at__lte=_now()), then=Value(1)),
                default=Value(2), output_field=IntegerField(),
            )
        ).order_by("attention", "-updated_at")

    def has_resolve_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(RESOLVE)

    # The selection checkbox carries the key in the page's HTML: a key holding hidden characters goes
    # there hex-encoded (and is decoded when the action runs), so no raw bidi character reaches the page.

    @admin.display(description=mark_safe('<input type="checkbox" id="action-toggle">'))
    def action_checkbox(self, obj: EffectRecord) -> str:
        attrs = {"class": "action-select",
                 "aria-label": format_html(_g("Select this object for an action - {}"), reveal(str(obj)))}
        checkbox = forms.CheckboxInput(attrs, lambda value: False)
        return checkbox.render(ACTION_CHECKBOX_NAME, _selection_value(obj.effect_key))

    def response_action(self, request: HttpRequest, queryset: Any) -> Any:
        if ACTION_CHECKBOX_NAME in request.POST:
            data = request.POST.copy()
            keys = (_selected_key(v) for v in data.getlist(ACTION_CHECKBOX_NAME))
            # A NUL is in no key (PostgreSQL cannot even be asked about one): such a value selects nothing.
            data.setlist(ACTION_CHECKBOX_NAME, [k for k in keys if "\x00" not in k])
            request.POST = data
        return super().response_action(request, queryset)

    @admin.display(description=_("last changed"), ordering="updated_at")
    def changed(self, obj: EffectRecord) -> SafeString:
        return format_html('<span title="{}">{}</span>', when_text(obj.updated_at), _ago(obj.updated_at))

    @admin.display(description=_("effect key"), ordering="effect_key")
    def shown_key(self, obj: EffectRecord) -> SafeString:
        return shown(obj.effect_key)

    @admin.display(description=_("action"), ordering="action")
    def shown_action(self, obj: EffectRecord) -> SafeString:
        return shown(obj.action)

    @admin.display(description=_("state"), ordering="state")
    def shown_state(self, obj: EffectRecord) -> SafeString:
        if not store.effect_signature_ok(obj):
            return tampered_badge(_g("this row does not carry ctrlrun's signature: ctrlrun will not retry, sweep or "
                                     "resolve it"))
        if held_lapsed(obj.state, obj.lease_expires_at, _now()):
            return format_html("{} {}", badge(obj.state), badge("lapsed", _g("lease lapsed")))
        return badge(obj.state)

    @admin.display(description=_("the attempt holding it"))
    def holder(self, obj: EffectRecord) -> SafeString:
        return call_link(self.site, obj.action_id, short=None)

    @admin.display(description=_("error"))
    def shown_error(self, obj: EffectRecord) -> SafeString:
        return shown(obj.error, multiline=True)

    @admin.display(description=_("resolved by"))
    def shown_resolved_by(self, obj: EffectRecord) -> SafeString:
        return shown(obj.resolved_by)

    @admin.display(description=_("last error"))
    def last_error(self, obj: EffectRecord) -> SafeString:
        if not obj.error:
            return format_html("{}", "-")
        short = obj.error if len(obj.error) <= 40 else obj.error[:39] + "…"
        return format_html('<span title="{}">{}</span>', reveal(obj.error), shown(short))

    @admin.display(description=_("reconcile hook"))
    def hook(self, obj: EffectRecord) -> str:
        reconcile.ensure_discovered()
        return _g("found") if reconcile.hook_for(obj.action) else _g("none (a person decides)")

    @admin.display(description=_("lease"), ordering="lease_expires_at")
    def lease(self, obj: EffectRecord) -> SafeString:
        if obj.lease_expires_at is None:
            return format_html("{}", "-")
        now = _now()
        if obj.lease_expires_at <= now:
            return format_html('<strong title="{}">{}</strong>', when_text(obj.lease_expires_at),
                               _g("lapsed %(time)s ago") % {"time": timesince(obj.lease_expires_at, now)})
        return format_html('<span title="{}">{}</span>', when_text(obj.lease_expires_at),
                           _g("%(time)s left") % {"time": timeuntil(obj.lease_expires_at, now)})

    @admin.display(description=_("lease expires at"), ordering="lease_expires_at")
    def at_lease_expires_at(self, obj: EffectRecord) -> SafeString:
        if obj.lease_expires_at is None:
            return format_html("{}", "-")
        return format_html("{} ({})", when(obj.lease_expires_at), self.lease(obj))

    @admin.display(description=_("provider idempotency token (the same for every attempt)"))
    def idempotency_token(self, obj: EffectRecord) -> str:
        return (f"{idempotency_token_for(obj.effect_key)}  ({_g('this attempt’s own, per_attempt=True')}: "
                f"{idempotency_token_for(obj.effect_key, obj.attempt)})")

    @admin.action(description=_("Ask the remote about the selected ambiguous effects"), permissions=["resolve"])
    def ask_selected(self, request: HttpRequest, queryset: Any) -> None:
        """Each selected ambiguous record (or lapsed lease) asked through its hook, as "Ask the remote now" does."""
        reconcile.ensure_discovered()
        outcomes: dict[str, int] = {}
        skipped = 0
        now = _now()
        for record in queryset.order_by("effect_key"):
            if not askable(record.state, record.lease_expires_at, now) or reconcile.hook_for(record.action) is None:
                skipped += 1
                continue
            try:
                line = reconcile.ask_now(record.effect_key, requested_by=request.user.get_username())
            except CTRLRunError:
                outcomes["refused"] = outcomes.get("refused", 0) + 1
                continue
            outcomes[line.outcome] = outcomes.get(line.outcome, 0) + 1
            self.log_change(request, record, f"asked the remote: {line.outcome}")
        asked = sum(outcomes.values())
        parts = ", ".join(f"{count} {outcome}" for outcome, count in sorted(outcomes.items()))
        message = ngettext("Asked the remote about %(n)d effect", "Asked the remote about %(n)d effects", asked) % {
            "n": asked}
        if parts:
            message += f": {parts}"
        if skipped:
            message += ". " + ngettext(
                "%(n)d skipped (not ambiguous, or no reconcile hook: a person decides on its page)",
                "%(n)d skipped (not ambiguous, or no reconcile hook: a person decides on their pages)",
                skipped) % {"n": skipped}
        self.message_user(request, message + ".", messages.SUCCESS if asked and not skipped else messages.WARNING)

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
            lapsed = held_lapsed(effect.state, effect.lease_expires_at, now)
            askable = effect.state == EffectState.AMBIGUOUS or lapsed
            may_resolve = self.has_resolve_permission(request)
            reconcile.ensure_discovered()
            has_hook = reconcile.hook_for(effect.action) is not None
            hidden = hidden_fields({"name": effect.action}, key)
            events = store.events_for_effect(key)
            current = [e for e in events if e.action_id == effect.action_id]
            context.update({
                "effect_events": _timeline(self.site, events),
                "effect_receipts": _receipt_rows(self.site, store.receipts_for_effect(key)),
                "proposed": _action_summary(_proposed(current) or _proposed(events)),
                "holder": call_link(self.site, effect.action_id, short=None),
                "shown_key": shown(key),
                "shown_action": shown(effect.action),
                "hidden_warning": warning(hidden, subject=_g("This effect record")) if hidden else None,
                "tampered": not effect.signature_ok,
                "can_ask": may_resolve and askable and (has_hook or lapsed) and effect.signature_ok,
                "has_hook": has_hook,
                "ask_label": _g("Ask the remote now") if has_hook else _g("Mark ambiguous (the worker is gone)"),
                "can_resolve": may_resolve and effect.state == EffectState.AMBIGUOUS and effect.signature_ok,
                "resolve_form": ResolveForm(initial={"attempt": effect.attempt}),
                "pinned_attempt": effect.attempt,
                "ask_url": reverse(f"{self.site}:ctrlrun_effectrecord_ask", args=[object_id], current_app=self.site),
                "resolve_url": reverse(f"{self.site}:ctrlrun_effectrecord_resolve", args=[object_id],
                                       current_app=self.site),
            })
        return super().change_view(request, object_id, form_url, context)

    def _effect_or_404(self, request: HttpRequest, object_id: str) -> tuple[str, str]:
        if not self.has_resolve_permission(request):
            raise PermissionDenied(_g("resolving effects needs the ctrlrun.resolve_effect permission"))
        if request.method != "POST":
            raise PermissionDenied(_g("this action only accepts a form submission"))
        request.current_app = self.site
        key = _object_key(object_id)
        if self.get_object(request, key) is None:
            raise Http404(_g("no effect %(key)s") % {"key": reveal(key)})
        return key, change_url(self.site, "effectrecord", key)

    def ask_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        key, change = self._effect_or_404(request, object_id)
        reconcile.ensure_discovered()
        try:
            line = reconcile.ask_now(key, requested_by=request.user.get_username())
        except CTRLRunError as exc:
            self.message_user(request, reveal(refusal_text(exc)), messages.ERROR)
            return HttpResponseRedirect(change)
        level = messages.SUCCESS if line.outcome in ("committed", "failed") else messages.WARNING
        if line.outcome == "needs_human":  # the line's own text is for the command line (--import)
            self.message_user(request, reveal(_g("%(key)s is ambiguous. No reconcile hook for %(action)s is registered "
                                                 "in this server: check the remote yourself and record what happened "
                                                 "below.") % {"key": key, "action": line.action}), level)
            return HttpResponseRedirect(change)
        self.message_user(request, reveal(f"asked the remote about {key}: {line.outcome} ({line.detail})"), level)
        self.log_change(request, self.get_object(request, key), f"asked the remote: {line.outcome}")
        return HttpResponseRedirect(change)

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        key, change = self._effect_or_404(request, object_id)
        form = ResolveForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
            self.message_user(request, reveal(f"not resolved: {problems}"), messages.ERROR)
            return HttpResponseRedirect(change)
        outcome, reason, attempt = (form.cleaned_data[f] for f in ("outcome", "reason", "attempt"))
        try:
            store.resolve(key, outcome, by=request.user.get_username(), reason=reason, attempt=attempt)
        except CTRLRunError as exc:
            self.message_user(request, reveal(f"not resolved: {refusal_text(exc)}"), messages.ERROR)
            return HttpResponseRedirect(change)
        self.log_change(request, self.get_object(request, key), f"resolved {outcome} (attempt {attempt}): {reason}")
        after = (_g("a retry is now permitted") if outcome == "failed"
                 else _g("a retry will be refused as a duplicate"))
        self.message_user(request, reveal(f"Effect {key} resolved {outcome} by {request.user.get_username()}; {after}"),
                          messages.SUCCESS)
        return HttpResponseRedirect(change)


# --------------------------------------------------------------------------- evidence


class ReceiptResultFilter(admin.SimpleListFilter):
    title = _("result")
    parameter_name = "result"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(r, r) for r in ("committed", "failed", "ambiguous", "denied", "blocked", "observed")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(result=self.value()) if self.value() else queryset


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


class ControlFilter(admin.SimpleListFilter):
    """The receipts citing one control: the ids of the current policy's ``controls:`` registry (with
    their titles) in the sidebar, and any id at all in the URL (``?control=pci-3.4``), so a control
    since dropped from the registry can still be searched for. Matched exactly, in the database
    (``store.citing_control``)."""

    title = _("cited control")
    parameter_name = "control"
    #: Any value is a control id to search for, not only the sidebar's (see EvidenceAdmin).
    any_value = True

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        policy = current_policy()
        registry = policy.controls if policy is not None else {}
        choices = [(cid, reveal(_short(f"{cid} — {entry.title}"))) for cid, entry in registry.items()]
        value = request.GET.get(self.parameter_name)
        if value and value not in registry:
            choices.append((value, reveal(_short(f"{value} ({_g('not in the policy’s registry')})"))))
        return choices

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        if value is None:
            return queryset
        try:
            return store.citing_control(queryset, value)
        except CTRLRunError as exc:
            raise IncorrectLookupParameters(str(exc)) from None


def _since(result: str, effect_state: str | None) -> str | None:
    """A receipt's result said ambiguous; what its effect record says now, when it was resolved since."""
    if result == "ambiguous" and effect_state in (EffectState.COMMITTED, EffectState.FAILED):
        return str(effect_state)
    return None


@admin.register(Receipt)
class ReceiptAdmin(EvidenceAdmin):
    list_display = ("seq", "finished", "shown_action", "outcome", "shown_key", "shown_agent", "receipt")
    list_display_links = ("seq",)
    list_filter = (ReceiptResultFilter, ControlFilter, "decision", ("action", RevealedValuesFilter),
                   ("agent", RevealedValuesFilter), ("ts", WrittenFilter))
    search_fields = ("receipt_id", "action_id", "effect_key", "agent", "action")
    date_hierarchy = "ts"
    list_per_page = 100
    ordering = ("-seq",)
    fieldsets = [
        (None, {"fields": ("receipt_id", "seq", "at_ts", "shown_action", "shown_agent", "decision_and_rule",
                           "cited_controls", "outcome", "shown_key", "call", "approval", "shown_policy")}),
        (_("Chain"), {"fields": ("previous", "prev_hash", "hash")}),
        (_("Document"), {"fields": ("pretty_document",)}),
    ]
    readonly_fields = ("at_ts", "shown_action", "shown_agent", "decision_and_rule", "cited_controls", "outcome",
                       "observed_execution", "observed_would_have", "shown_key", "call", "approval", "shown_policy",
                       "policy_version", "previous", "pretty_document")
    #: Shown on the page of an observe-mode receipt (``result: observed``), under the decision.
    observed_fieldset = (_("Observe mode: what ran, and what enforcement would have done"),
                         {"fields": ("observed_execution", "observed_would_have")})
    change_list_template = "admin/ctrlrun/receipt/change_list.html"
    change_form_template = "admin/ctrlrun/receipt/change_form.html"

    at_ts = _at("ts", _("written at"))

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """Searching by control reads every document as JSON: on PostgreSQL one that is not (a row altered
        outside ctrlrun) fails the query, which is said in one line, not a 500."""
        if ControlFilter.parameter_name not in request.GET:
            return super().get_changelist_instance(request)
        try:
            with transaction.atomic(using=store.alias()):
                return super().get_changelist_instance(request)
        except DatabaseError as exc:
            self.message_user(request, reveal(str(store.unreadable_documents(exc))), messages.ERROR)
            raise IncorrectLookupParameters("unreadable receipt documents") from None

    def get_queryset(self, request: HttpRequest) -> Any:
        effect = EffectRecord.objects.filter(pk=OuterRef("effect_key")).values("state")[:1]
        return super().get_queryset(request).annotate(effect_state=Subquery(effect))

    @staticmethod
    def _doc(obj: Receipt) -> dict[str, Any]:
        """The row's document, parsed once per row and page (several fields read it)."""
        if "_ctrlrun_doc" not in obj.__dict__:
            try:
                doc = json.loads(obj.document)
            except ValueError:
                doc = {}
            obj.__dict__["_ctrlrun_doc"] = doc if isinstance(doc, dict) else {}
        return obj.__dict__["_ctrlrun_doc"]

    @admin.display(description=_("action"), ordering="action")
    def shown_action(self, obj: Receipt) -> SafeString:
        return shown(obj.action)

    @admin.display(description=_("agent"), ordering="agent")
    def shown_agent(self, obj: Receipt) -> SafeString:
        return shown(obj.agent)

    @admin.display(description=_("effect key"), ordering="effect_key")
    def shown_key(self, obj: Receipt) -> SafeString:
        if not obj.effect_key:
            return shown(None)
        # Rows come from get_queryset, which reads each key's record state beside it.
        if hasattr(obj, "effect_state") and obj.effect_state is None:  # refused before taking the key
            return format_html('<span title="{}">{}</span>', _g("no effect record: the call never took this key"),
                               shown(obj.effect_key))
        return effect_link(self.site, obj.effect_key)

    @admin.display(description=_("written"), ordering="ts")
    def finished(self, obj: Receipt) -> SafeString:
        return when(obj.ts)

    @admin.display(description=_("receipt"), ordering="receipt_id")
    def receipt(self, obj: Receipt) -> SafeString:
        return format_html('<span title="{}">{}…</span>', obj.receipt_id, obj.receipt_id[:12])

    @staticmethod
    def _problem(obj: Receipt) -> str | None:
        """Why the row is not what ctrlrun wrote (re-hashed once per row and page), or None."""
        if "_ctrlrun_problem" not in obj.__dict__:
            obj.__dict__["_ctrlrun_problem"] = row_problem(obj.document, obj.hash,
                                                           {c: getattr(obj, c) for c in INDEXED_COLUMNS})
        return obj.__dict__["_ctrlrun_problem"]

    @admin.display(description=_("decision → result"), ordering="result")
    def outcome(self, obj: Receipt) -> SafeString:
        problem = self._problem(obj)
        if problem:
            return tampered_badge(problem)
        shown_result = format_html("{} → {}", obj.decision, badge(obj.result))
        since = _since(obj.result, getattr(obj, "effect_state", None))
        if since:
            return format_html('{} <span class="ctrlrun-since" title="{}">{} {}</span>', shown_result,
                               _g("the effect record was resolved after this receipt was written"),
                               _g("resolved since:"), badge(since))
        return shown_result

    @admin.display(description=_("decision"))
    def decision_and_rule(self, obj: Receipt) -> SafeString:
        doc = self._doc(obj)
        return format_html("{} {}", badge(obj.decision), reason_html(
            _policy_document(doc.get("policy_hash")), obj.action, doc.get("decision_reason")))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = list(super().get_fieldsets(request, obj))
        if obj is not None and self._doc(obj).get("result") == "observed":
            fieldsets.insert(1, self.observed_fieldset)
        if obj is not None and self._doc(obj).get("policy_version") is not None:
            first = fieldsets[0]
            fields = list(first[1]["fields"])
            fields.insert(fields.index("shown_policy") + 1, "policy_version")
            fieldsets[0] = (first[0], {**first[1], "fields": tuple(fields)})
        return fieldsets

    @admin.display(description=_("controls cited"))
    def cited_controls(self, obj: Receipt) -> SafeString:
        """The receipt's own control ids; titles from the registry of the policy whose hash it carries."""
        doc = self._doc(obj)
        return controls_html(doc.get("controls"), _policy_document(doc.get("policy_hash")))

    @admin.display(description=_("policy version"))
    def policy_version(self, obj: Receipt) -> SafeString:
        return shown(self._doc(obj).get("policy_version"))

    @admin.display(description=_("what ran (execution)"))
    def observed_execution(self, obj: Receipt) -> SafeString:
        doc = self._doc(obj)
        execution = doc.get("execution")
        error = doc.get("error")
        text = format_html("{} {}", badge(str(execution)) if execution else shown(None), _g(
            "— observe mode: the call ran, whatever the policy said"))
        return format_html("{}<br>{}: {}", text, _g("error"), shown(str(error))) if error else text

    @admin.display(description=_("what enforcement would have done"))
    def observed_would_have(self, obj: Receipt) -> SafeString:
        doc = self._doc(obj)
        would = doc.get("would_have")
        if not isinstance(would, dict):
            return shown(None)
        decision, reason, blocked = would.get("decision"), would.get("reason"), would.get("blocked_reason")
        verdict = (format_html("<strong>{}</strong>: {}", _g("blocked"), shown(str(blocked))) if blocked
                   else format_html("<strong>{}</strong>", _g("not blocked: it would have run")))
        return format_html(
            '<dl class="ctrlrun-kv" id="ctrlrun-would-have"><div><dt>{}</dt><dd>{}</dd></div><div><dt>{}</dt>'
            '<dd>{}</dd></div><div><dt>{}</dt><dd>{}</dd></div></dl>',
            _g("decision"), badge(str(decision)) if decision else shown(None),
            _g("reason"), reason_html(_policy_document(doc.get("policy_hash")), obj.action,
                                      str(reason) if reason is not None else None),
            _g("enforce mode"), verdict)

    @admin.display(description=_("call"))
    def call(self, obj: Receipt) -> SafeString:
        return call_link(self.site, obj.action_id, short=None)

    @admin.display(description=_("approval"))
    def approval(self, obj: Receipt) -> SafeString:
        doc = self._doc(obj)
        approval_id = doc.get("approval_id")
        if not approval_id:
            return shown(None)
        approver = doc.get("approver")
        return format_html("{}{}", approval_link(self.site, str(approval_id), short=None),
                           format_html(" ({} {})", _g("approved by"), shown(str(approver))) if approver else "")

    @admin.display(description=_("policy document"))
    def shown_policy(self, obj: Receipt) -> SafeString:
        return policy_link(self.site, self._doc(obj).get("policy_hash"))

    @admin.display(description=_("previous receipt"))
    def previous(self, obj: Receipt) -> SafeString:
        if not obj.seq or obj.seq <= 1:
            return format_html("{}", _g("none: the first receipt (its previous hash is the genesis hash)"))
        before = Receipt.objects.using(store.alias()).filter(seq=obj.seq - 1).values_list(
            "receipt_id", flat=True).first()
        if before is None:
            return format_html("<strong>{}</strong>", _g("missing: no receipt holds seq %(seq)d") % {"seq": obj.seq - 1})
        return format_html("{} {}", obj.seq - 1, receipt_link(self.site, before, short=None))

    @admin.display(description=_("document (ctrlrun.receipt/v7)"))
    def pretty_document(self, obj: Receipt) -> str:
        try:
            return _pre(json.loads(obj.document))
        except ValueError:
            return format_html('<pre class="ctrlrun-json">{}</pre><p class="errornote">{}</p>',
                               shown(obj.document, multiline=True),
                               _g("This document is not valid JSON: the row was altered. Run the chain check."))

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        context: dict[str, Any] = dict(extra_context or {})
        obj = self.get_object(request, _object_key(object_id))
        if obj is not None:
            context["row_problem"] = self._problem(obj)
            context["verify_url"] = reverse(f"{self.site}:ctrlrun_receipt_verify", current_app=self.site)
        if obj is not None and obj.result == "ambiguous" and obj.effect_key:
            effect = store.get_effect(obj.effect_key)
            if effect is not None and _since(obj.result, effect.state):
                context["resolved_since"] = {"state": effect.state, "by": shown(effect.resolved_by),
                                             "at": when(effect.updated_at), "effect": effect_link(self.site, effect.effect_key)}
        return super().change_view(request, object_id, form_url, context)

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
            report, unrecorded = store.run_check(incremental=request.POST.get("mode") == "incremental",
                                                 ran_by=f"console: {request.user.get_username()}")
            if unrecorded is not None:
                self.message_user(request, reveal(f"the check ran, but its result could not be recorded: {unrecorded}"),
                                  messages.ERROR)
        check = store.last_check()
        return self.console_page(request, "admin/ctrlrun/receipt/verify.html", {
            "title": _g("Receipt chain"),
            "report": report,
            "breaks": [{"name": b.name, "where": self._break_link(b), "detail": b.detail}
                       for b in (report.breaks if report else [])],
            "lines": chain_lines(report) if report else [],
            "total": (report.chained + report.unchained) if report else 0,
            "check": check,
            "checked_at": when(check.checked_at) if check else None,
            "chain": chain_status(check, store.head_position()[0], store.now(), conf.chain_check_max_age()),
            "evidence_docs": conf.docs_url("evidence.md#recorded-checks-full-and-incremental"),
        })

    def _break_link(self, item: Any) -> SafeString:
        """Where a break is, as a link to what it names: the receipt or event at that seq, the signed row."""
        if item.kind in ("receipt", "event") and item.seq is not None:
            model = "receipt" if item.kind == "receipt" else "event"
            return link(changelist_url(self.site, model, seq=item.seq), f"{_g(model)} {item.seq}")
        if item.kind == "approval" and item.subject:
            return approval_link(self.site, item.subject, short=None)
        if item.kind == "effect" and item.subject:
            return effect_link(self.site, item.subject)
        if item.kind == "head":
            return format_html("{}", _g("the chain head"))
        return format_html("{}", f"{item.kind} {item.seq if item.seq is not None else ''}".strip())


class EmittedTypeFilter(admin.ChoicesFieldListFilter):
    """The event types this version of ctrlrun writes; the vocabulary also names the reference's
    later ones (authority, delegation, suspension, clock skew), which no row here holds."""

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            if str(choice["display"]) not in _NEVER_WRITTEN:
                yield choice


_NEVER_WRITTEN = frozenset(t.value for t in EventType) - EMITTED_EVENT_TYPES


@admin.register(Event)
class EventAdmin(EvidenceAdmin):
    list_display = ("id", "written", "type", "call", "about", "short_data")
    list_filter = (("type", EmittedTypeFilter), ("ts", WrittenFilter))
    search_fields = ("action_id", "effect_key", "approval_id")
    date_hierarchy = "ts"
    list_per_page = 100
    ordering = ("-id",)
    fields = ("id", "seq", "at_ts", "type", "call", "shown_key", "approval", "pretty_data", "prev_hash", "hash")
    readonly_fields = ("at_ts", "call", "shown_key", "approval", "pretty_data")

    at_ts = _at("ts", _("written at"))

    @admin.display(description=_("effect key"), ordering="effect_key")
    def shown_key(self, obj: Event) -> SafeString:
        return effect_link(self.site, obj.effect_key) if obj.effect_key else shown(None)

    @admin.display(description=_("call"), ordering="action_id")
    def call(self, obj: Event) -> SafeString:
        return call_link(self.site, obj.action_id, short=12)

    @admin.display(description=_("approval"), ordering="approval_id")
    def approval(self, obj: Event) -> SafeString:
        return approval_link(self.site, obj.approval_id)

    @admin.display(description=_("effect key / approval"))
    def about(self, obj: Event) -> SafeString:
        """What the event is about: its effect key, its approval request, or both."""
        parts = [effect_link(self.site, obj.effect_key)] if obj.effect_key else []
        if obj.approval_id:
            parts.append(approval_link(self.site, obj.approval_id, short=12))
        return format_html("{}", mark_safe("<br>".join(parts))) if parts else shown(None)

    @admin.display(description=_("written"), ordering="ts")
    def written(self, obj: Event) -> SafeString:
        return when(obj.ts)

    @admin.display(description=_("data"))
    def short_data(self, obj: Event) -> str:
        data = obj.data if not isinstance(obj.data, dict) or "action" not in obj.data else {
            **obj.data, "action": "…"}
        text = dumps(data, sort_keys=True)
        return text if len(text) <= 80 else text[:79] + "…"

    @admin.display(description=_("data"))
    def pretty_data(self, obj: Event) -> str:
        return _pre(obj.data)

    def get_urls(self) -> list[Any]:
        return [path("call/<path:action_id>/", self.admin_site.admin_view(self.call_view), name="ctrlrun_call"),
                *super().get_urls()]

    def call_view(self, request: HttpRequest, action_id: str) -> HttpResponse:
        """One call (an action id): what it proposed, what the policy decided and why, its effect record,
        the approvals it asked for or used, its receipts and its events."""
        if not self.has_view_permission(request):
            raise PermissionDenied(_g("reading events needs the view permission"))
        action_id = _object_key(action_id)
        events = store.events_for_action(action_id)
        receipts = store.receipts_for_action(action_id)
        if not events and not receipts:
            raise Http404(_g("no call %(id)s: no event or receipt names it") % {"id": reveal(action_id)})
        proposed = _proposed(events)
        evaluated = next((e.data for e in events if e.type == "POLICY_EVALUATED"), {})
        policy_hash = next((r.doc.get("policy_hash") for r in receipts if _readable(r)), None)
        name = (proposed or {}).get("name") or (receipts[0].action if receipts else "")
        keys = sorted({e.effect_key for e in events if e.effect_key} | {r.effect_key for r in receipts if r.effect_key})
        alias = store.alias()
        states = dict(EffectRecord.objects.using(alias).filter(pk__in=keys).values_list("effect_key", "state"))
        approvals = list(Approval.objects.using(alias).filter(Q(action_id=action_id) | Q(consumed_by=action_id))
                         .order_by("created_at"))
        if policy_hash is None:  # a call that asked for a person and wrote no receipt: its request names it
            policy_hash = next((a.policy_hash for a in approvals if a.action_id == action_id and a.policy_hash), None)
        now = _now()
        return self.console_page(request, "admin/ctrlrun/call.html", {
            "title": _g("Call %(id)s") % {"id": action_id},
            "action_id": action_id,
            "proposed": _action_summary(proposed),
            "decision": badge(evaluated.get("decision")) if evaluated else None,
            "reason": reason_html(_policy_document(policy_hash), name, evaluated.get("reason")) if evaluated else None,
            "policy": policy_link(self.site, policy_hash) if policy_hash else None,
            "effects": [{"key": effect_link(self.site, k) if k in states else shown(k),
                         "state": badge(states[k]) if k in states else _g("no record: the call never took this key")}
                        for k in keys],
            "approvals": [{"id": approval_link(self.site, a.approval_id, short=None),
                           "role": _g("asked for") if a.action_id == action_id else _g("used"),
                           "status": badge(effective_approval_status(a.status, a.expires_at, now)),
                           "approver": shown(a.approver)} for a in approvals],
            "receipts": _receipt_rows(self.site, receipts),
            "events": _timeline(self.site, events),
        })


def _readable(receipt: Any) -> bool:
    try:
        return isinstance(receipt.doc, dict)
    except ValueError:
        return False


@admin.register(PolicyDocument)
class PolicyDocumentAdmin(EvidenceAdmin):
    list_display = ("short_hash", "schema", "listed_source", "environment", "at_first_seen", "in_force")
    search_fields = ("hash", "source")
    fields = ("hash", "schema", "shown_source", "environment", "at_first_seen", "in_force", "signature",
              "pretty_text")
    readonly_fields = ("shown_source", "at_first_seen", "in_force", "signature", "pretty_text")

    at_first_seen = _at("first_seen", _("first used at"))

    @admin.display(description=_("hash"), ordering="hash")
    def short_hash(self, obj: PolicyDocument) -> SafeString:
        return format_html('<span title="{}">{}…</span>', obj.hash, obj.hash[:19])

    @admin.display(description=_("source"), ordering="source")
    def listed_source(self, obj: PolicyDocument) -> SafeString:
        return shown(obj.source)

    @admin.display(description=_("source"), ordering="source")
    def shown_source(self, obj: PolicyDocument) -> SafeString:
        # The field's help text (already HTML, as Django takes help texts) under the escaped value.
        return format_html('{}<div class="help">{}</div>', shown(obj.source),
                           mark_safe(PolicyDocument._meta.get_field("source").help_text))

    @admin.display(description=_("in force here"))
    def in_force(self, obj: PolicyDocument) -> str:
        current = _current_policy_hash()
        if current is None:
            return _g("unknown (this server cannot read its policy file)")
        return _g("yes: %(path)s") % {"path": conf.policy_path()} if obj.hash == current else \
            _g("no (an earlier or other policy)")

    @admin.display(description=_("signature"))
    def signature(self, obj: PolicyDocument) -> SafeString:
        if store.policy_document_ok(obj):
            return format_html("{}", _g("ctrlrun's: this is the text ctrlrun stored under this hash"))
        return format_html('<span class="ctrlrun-badge alert">{}</span>', _g(
            "NOT ctrlrun's: this row was written outside ctrlrun (its signature does not hold). It is not the "
            "policy that decided anything; no page explains a decision with it. Run receipts --verify-chain"))

    @admin.display(description=_("text"))
    def pretty_text(self, obj: PolicyDocument) -> str:
        return format_html('<pre class="ctrlrun-json">{}</pre>', mark_safe(reveal_html(obj.text, multiline=True)))


def _current_policy_hash() -> str | None:
    """The hash of the policy this server reads, loaded again only when its file changed (the policy
    list shows it on every row)."""
    policy = current_policy()
    return policy.hash if policy is not None else None


def current_policy() -> Any:
    """The policy this server reads (a ``Policy``), or None when it cannot be read: loaded again only
    when its file's path, modification time or size changed. Never raises: a broken or missing
    policy must not break a page (``manage.py check`` and the protected calls say what is wrong)."""
    try:
        path, environment, authority = conf.policy_path(), conf.environment_override(), conf.authority_path()
        stat = path.stat()
        grants = authority.stat() if authority is not None else None
    except (CTRLRunError, OSError, ValueError):
        return None
    return _policy_of(str(path), stat.st_mtime_ns, stat.st_size, environment,
                      (str(authority), grants.st_mtime_ns, grants.st_size) if grants is not None else None)


@functools.lru_cache(maxsize=8)
def _policy_of(path: str, mtime_ns: int, size: int, environment: str | None, authority: Any = None) -> Any:
    from .policy import load_policy

    try:
        return load_policy(path, environment=environment, authority=authority[0] if authority else None)
    except (CTRLRunError, OSError, ValueError):
        return None


# --------------------------------------------------------------------------- grants and budgets (authority, §C5)
# Kept in one block (with its templates under admin/ctrlrun/grants/) beside the rest of the console.

from .models import BudgetLedger  # noqa: E402  (this block's own import)


def _grants_policy() -> tuple[Any, str | None]:
    """The policy this server reads and None, or None and why it cannot be read (one sentence)."""
    policy = current_policy()
    if policy is not None:
        return policy, None
    from .policy import load_policy

    try:  # only when it failed: read it again for the reason (current_policy keeps none)
        path = conf.policy_path()
        load_policy(path, environment=conf.environment_override(), authority=conf.authority_path())
    except (CTRLRunError, OSError, ValueError) as exc:
        return None, " ".join(str(exc).split())
    return None, _g("the policy file could not be read")


def _grant_rows(grant: Any) -> list[tuple[str, SafeString]]:
    """What a grant allows, as (label, escaped value) rows."""
    def listed(values: Any, none: str) -> SafeString:
        if values is None:
            return format_html("<em>{}</em>", none)
        return format_html_join(", ", "<code>{}</code>", ((shown(v),) for v in values))

    subject = []
    if grant.agent is not None:
        subject.append(format_html("{} <code>{}</code>", _g("agent"), shown(grant.agent)))
    if grant.user is not None:
        subject.append(format_html("{} <code>{}</code>", _g("user"), shown(grant.user)))
    constraints = (format_html("<em>{}</em>", _g("none")) if not grant.constraints else format_html_join(
        ", ", "<code>{}: {}</code>", ((shown(c.key), shown(dumps(c.operand))) for c in grant.constraints)))
    return [
        (_g("subject"), format_html_join(", ", "{}", ((s,) for s in subject)) if subject
         else format_html("<em>{}</em>", _g("anyone"))),
        (_g("actions"), listed(grant.actions, _g("none"))),
        (_g("resources"), listed(grant.resources, _g("any resource"))),
        (_g("tasks"), listed(grant.tasks, _g("any task, or none"))),
        (_g("environments"), listed(grant.environments, _g("any environment"))),
        (_g("constraints"), constraints),
        (_g("delegable"), format_html("{}", _g("yes") if grant.delegable else _g("no"))),
    ]


def _call_row(site: str, call: dict[str, Any], currency: str | None = None) -> dict[str, Any]:
    from .budget_report import amount_text

    state = call["state"]
    return {
        "at": when(call["consumed_at"]),
        "amount": amount_text(call["amount"], currency),
        "state": badge(state),
        "standing": _g("spent") if state == EffectState.COMMITTED else _g("holds"),
        "effect": effect_link(site, call["effect_key"]),
        "attempt": call["attempt"],
        "call": call_link(site, call["action_id"]) if call["action_id"] else shown(None),
        "receipt": receipt_link(site, call["receipt_id"]) if call["receipt_id"] else format_html(
            "<em>{}</em>", _g("none yet")),
    }


def _budget_boxes(site: str, grant: Any, now: dt.datetime) -> list[dict[str, Any]]:
    """Each budget of ``grant`` (a policy grant, or a delegation's) as the page shows it: its cap, what is
    used (holds included), held and left in the window ending ``now``, and the calls that used it."""
    from .budget_report import CALLS_SHOWN, amount_text, budget_calls, budget_cap, budget_document

    boxes = []
    for budget, numbers in zip(grant.budgets or (), budget_document(grant, now)["budgets"]):
        calls, total = budget_calls(grant.id, numbers["metric"], numbers["window_seconds"], now)
        used = numbers["consumed"]  # holds included
        left = max(numbers["limit"] - used, 0)
        boxes.append({
            "metric": shown(numbers["metric"]),
            "cap": budget_cap(budget),
            "consumed": amount_text(used, budget.currency),
            "held": amount_text(numbers["held"], budget.currency),
            "holds": numbers["held"] > 0,
            "left": amount_text(left, budget.currency),
            "exhausted": left == 0,
            "percent": 100 if numbers["limit"] == 0 else min(100, round(100 * used / numbers["limit"])),
            "calls": [_call_row(site, call, budget.currency) for call in calls],
            "more": total - len(calls) if total > CALLS_SHOWN else 0,
        })
    return boxes


def _delegated(site: str, root: str, rows: list[Any], now: dt.datetime) -> list[dict[str, Any]]:
    """The delegations beneath the grant ``root`` (depth first) that have budgets of their own, each with
    its budgets' boxes: a delegation's calls are charged to it and to every grant above it."""
    children: dict[str, list[Any]] = {}
    for row in rows:
        children.setdefault(row.parent_id, []).append(row)
    out: list[dict[str, Any]] = []
    stack, seen = list(reversed(children.get(root, []))), set()
    while stack:
        row = stack.pop()
        if row.id in seen:
            continue
        seen.add(row.id)
        stack.extend(reversed(children.get(row.id, [])))
        if row.grant is None or not row.grant.budgets:
            continue
        out.append({"link": link(change_url(site, "delegation", row.id), row.id), "subject": _subject(row.grant),
                    "depth": row.depth, "revoked": row.revoked, "anchor": f"{root}-{len(out) + 1}",
                    "budgets": _budget_boxes(site, row.grant, now)})
    return out


def grants_context(site: str, now: dt.datetime) -> dict[str, Any]:
    """What the "Grants and budgets" page shows: the current policy's grants, each budget's numbers in
    its window ending ``now`` and the calls that used it, and under each grant the budgets of the
    delegations made from it; or the one line why there are none."""
    policy, problem = _grants_policy()
    if policy is None:
        return {"problem": _g("The policy does not load, so its grants are unknown: %(why)s") % {
            "why": reveal(problem)}}
    authority = policy.authority
    if authority is None:
        return {"problem": _g("The policy (%(source)s) has no authority section: every call is decided by its "
                              "rules alone, and nothing is capped.") % {"source": reveal(str(policy.source))}}
    delegations = store.list_delegations()
    grants = []
    for grant in authority.grants.values():
        expired = grant.expires_at is not None and now > grant.expires_at
        anchor = f"grant-{len(grants) + 1}"
        grants.append({
            "id": shown(grant.id),
            "anchor": anchor,
            "rows": _grant_rows(grant),
            "expires": when(grant.expires_at) if grant.expires_at else None,
            "expired": expired,
            "budgets": _budget_boxes(site, grant, now),
            "delegated": _delegated(site, grant.id, delegations, now),
        })
    return {"grants": grants, "source": reveal(str(policy.source)), "policy_hash": policy.hash,
            "policy": policy_link(site, policy.hash), "at": when(now)}


@admin.register(BudgetLedger)
class BudgetLedgerAdmin(_NumberedRows):
    """The budget ledger (read-only: charges are written by the kernel, never here) and the "Grants and
    budgets" page (``grants/``): seen by whoever may read the evidence the charges point at (the console's
    groups: receipts or effect records), or holds ``view_budgetledger``."""

    list_display = ("id", "listed_grant", "listed_metric", "amount", "listed_effect", "attempt", "at_consumed_at",
                    "at_released_at")
    list_display_links = None
    list_filter = (("grant_id", RevealedValuesFilter), ("metric", RevealedValuesFilter))
    search_fields = ("grant_id", "effect_key")
    ordering = ("-id",)
    list_per_page = 100
    change_list_template = "admin/ctrlrun/grants/ledger_list.html"

    at_consumed_at = _at("consumed_at", _("charged at"))
    at_released_at = _at("released_at", _("released at"))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return user.is_active and user.is_staff and any(user.has_perm(p) for p in (
            "ctrlrun.view_receipt", "ctrlrun.view_effectrecord", "ctrlrun.view_budgetledger"))


    @admin.display(description=_("grant"), ordering="grant_id")
    def listed_grant(self, obj: BudgetLedger) -> SafeString:
        return shown(obj.grant_id)

    @admin.display(description=_("metric"), ordering="metric")
    def listed_metric(self, obj: BudgetLedger) -> SafeString:
        return shown(obj.metric)

    @admin.display(description=_("effect key"), ordering="effect_key")
    def listed_effect(self, obj: BudgetLedger) -> SafeString:
        return effect_link(self.site, obj.effect_key)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        return super().changelist_view(request, {"grants_url": reverse(f"{self.site}:ctrlrun_grants",
                                                                       current_app=self.site), **(extra_context or {})})

    def get_urls(self) -> list[Any]:
        return [path("grants/", self.admin_site.admin_view(self.grants_view), name="ctrlrun_grants"),
                *super().get_urls()]

    def grants_view(self, request: HttpRequest) -> HttpResponse:
        """Every grant of the policy this server reads, and per budget what is spent, held and left now."""
        if not self.has_view_permission(request):
            raise PermissionDenied(_g("reading grants and budgets needs the view permission on receipts"))
        return self.console_page(request, "admin/ctrlrun/grants/grants.html", {
            "title": _g("Grants and budgets"), **grants_context(self.site, store.now())})


# --------------------------------------------------------------------------- delegations (authority, §C3)

REVOKE = "ctrlrun.revoke_delegation"


def _narrows(grant: Any) -> list[str]:
    """What a delegated grant says, dimension by dimension, in a few words each (escaped by the template)."""
    if grant is None:
        return [_g("unreadable")]
    parts = [f"{_g('actions')} {', '.join(grant.actions)}"]
    if grant.resources is not None:
        parts.append(f"{_g('resources')} {', '.join(grant.resources)}")
    if grant.constraints is not None:
        parts.append(f"{_g('constraints')} " + ", ".join(
            f"{c.key} {json.dumps(c.operand, ensure_ascii=False)}" for c in grant.constraints))
    if grant.environments is not None:
        parts.append(f"{_g('environments')} {', '.join(grant.environments)}")
    if grant.expires_at is not None:
        parts.append(f"{_g('expires')} {when_text(grant.expires_at)}")
    if grant.tasks is not None:
        parts.append(f"{_g('tasks')} {', '.join(grant.tasks)}")
    from .budget_report import budget_cap

    for budget in grant.budgets or ():  # written as the Grants page and inspect --grant write it
        parts.append(f"{_g('budget')} {budget.metric}: {budget_cap(budget)}")
    if grant.delegable:
        parts.append(_g("delegable"))
    return [reveal(part) for part in parts]


def _subject(grant: Any) -> str:
    if grant is None:
        return "-"
    return reveal((grant.agent or "*") + (f"/{grant.user}" if grant.user else ""))


def _creator(row: Any) -> str:
    return reveal((row.created_by_agent or "-") + (f"/{row.created_by_user}" if row.created_by_user else "")
                  + f" via {row.created_via}")


@admin.register(Delegation)
class DelegationAdmin(EvidenceAdmin):
    """Delegations (authority, §C3) as a tree: each root grant of the policy, the delegations beneath
    it. Read-only for whoever reads the evidence; **Revoke…** for holders of
    ``ctrlrun.revoke_delegation``, through a confirmation page (a POST), logged, the Django user
    named as ``revoked_by``. Never edited or deleted here."""

    readonly_fields = ("delegation_id", "parent_id", "depth", "grant_json", "created_by_agent", "created_by_user",
                       "created_via", "created_at", "revoked_at", "revoked_by")
    fields = readonly_fields
    tree_template = "admin/ctrlrun/delegation/tree.html"

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return user.is_active and user.is_staff and (user.has_perm("ctrlrun.view_receipt") or user.has_perm(
            "ctrlrun.view_delegation"))

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.is_active and request.user.is_staff and request.user.has_perm(REVOKE)

    def get_urls(self) -> list[Any]:
        revoke = self.admin_site.admin_view(self.revoke_view)
        return [path("<str:object_id>/revoke/", revoke, name="ctrlrun_delegation_revoke"), *super().get_urls()]

    def _roots(self) -> tuple[dict[str, Any], str | None]:
        """The policy's grants (by id) and, when it cannot be read, why."""
        from .control import default_control

        try:
            authority = default_control().read_policy().authority
        except CTRLRunError as exc:
            return {}, str(exc)
        return (dict(authority.grants) if authority is not None else {}), None

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if not self.has_view_permission(request):
            raise PermissionDenied
        rows = store.list_delegations()
        grants, problem = self._roots()
        children: dict[str, list[Any]] = {}
        for row in rows:
            children.setdefault(row.parent_id, []).append(row)
        may_revoke = self.has_revoke_permission(request)

        def walk(parent: str, level: int, above_revoked: bool) -> list[dict[str, Any]]:
            out = []
            for row in children.get(parent, []):
                cut = above_revoked or row.revoked
                out.append({
                    "row": row, "indent": level * 24, "subject": _subject(row.grant), "narrows": _narrows(row.grant),
                    "created_at": when(row.created_at), "revoked_at": when(row.revoked_at) if row.revoked else None,
                    "cut_above": above_revoked and not row.revoked, "problem": reveal(row.problem or ""),
                    "created_by": _creator(row), "revoked_by": reveal(row.revoked_by or ""),
                    "change_url": change_url(self.site, "delegation", row.id),
                    "revoke_url": reverse(f"{self.site}:ctrlrun_delegation_revoke", args=[quote(row.id)])
                    if may_revoke and not row.revoked else None,
                })
                out += walk(row.id, level + 1, cut)
            return out

        ids = {row.id for row in rows}
        trees = [{"id": ident, "grant": grant, "subject": _subject(grant), "narrows": _narrows(grant),
                  "rows": walk(ident, 1, False)} for ident, grant in grants.items()
                 if grant.delegable or children.get(ident)]
        orphans = sorted({row.parent_id for row in rows} - set(grants) - ids)
        for ident in orphans:
            trees.append({"id": ident, "grant": None, "missing": True, "subject": "-", "narrows": [],
                          "rows": walk(ident, 1, False)})
        return self.console_page(request, self.tree_template, {
            "title": _g("Delegations"), "trees": trees, "policy_problem": problem, "count": len(rows),
            "revoked": sum(row.revoked for row in rows), "may_revoke": may_revoke, **(extra_context or {})})

    def revoke_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_revoke_permission(request):
            raise PermissionDenied(_g("revoking delegations needs the ctrlrun.revoke_delegation permission"))
        request.current_app = self.site
        object_id = _object_key(object_id)
        if "\x00" in object_id:
            raise Http404(_g("no delegation %(id)s") % {"id": reveal(object_id)})
        row = store.get_delegation(object_id)
        if row is None:
            raise Http404(_g("no delegation %(id)s") % {"id": reveal(object_id)})
        tree = changelist_url(self.site, "delegation")
        if row.revoked:
            self.message_user(request, _g("%(id)s was already revoked at %(at)s by %(by)s") % {
                "id": row.id, "at": when_text(row.revoked_at), "by": reveal(row.revoked_by)}, messages.WARNING)
            return HttpResponseRedirect(tree)
        username = request.user.get_username()
        if request.method == "POST":
            try:
                done = store.revoke_delegation(object_id, username)
            except CTRLRunError as exc:
                self.message_user(request, reveal(refusal_text(exc)), messages.ERROR)
                return HttpResponseRedirect(tree)
            self.log_change(request, Delegation.objects.using(store.alias()).get(pk=object_id),
                            f"revoked {object_id}")
            if done is not None and done.changed:
                self.message_user(request, _g("Revoked %(id)s: it and every delegation beneath it are denied from "
                                              "the next evaluation.") % {"id": object_id}, messages.SUCCESS)
            else:
                self.message_user(request, _g("%(id)s was already revoked") % {"id": object_id}, messages.WARNING)
            return HttpResponseRedirect(tree)
        beneath = store.delegations_beneath(object_id)
        return self.console_page(request, "admin/ctrlrun/delegation/revoke.html", {
            "title": _g("Revoke %(id)s?") % {"id": object_id}, "row": row, "subject": _subject(row.grant),
            "narrows": _narrows(row.grant), "created_at": when(row.created_at), "created_by": _creator(row),
            "beneath": [b for b in beneath if not b.revoked], "tree_url": tree, "revoker": reveal(username)})
