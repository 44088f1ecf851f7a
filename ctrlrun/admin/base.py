"""What every page of the console shares: the clock a page reads, how values people read are shown,
the read-only evidence admin every model admin builds on, and its filters."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.options import IncorrectLookupParameters, get_content_type_for_model
from django.contrib.admin.utils import unquote
from django.db.models import Model
from django.http import Http404, HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _

from .. import conf, store
from .console import badge, call_link, data_rows, receipt_link, shown, when
from ..display import dumps_html, hidden_fields, reveal
from ..errors import CTRLRunError, StateConflict
from ..messages import state_conflict
from ..values import PolicyDocumentView
from ..states import HOLDING_STATES



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


def _origin(events: list[Any]) -> Any:
    """Where the call came from: the ``origin`` of the last ACTION_PROPOSED among ``events`` that has one."""
    for event in reversed(events):
        if event.type == "ACTION_PROPOSED" and isinstance(event.data, dict) and "origin" in event.data:
            return event.data["origin"]
    return None


def _policy_document(policy_hash: str | None) -> PolicyDocumentView | None:
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
        """As the admin's own, with the object's name and the message escaped (the front page lists them).

        ``obj`` names the row by its key and ``str()``: after a store phase, an unsaved row built from
        what the phase returned (the row as it left it), never the row read again."""
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
