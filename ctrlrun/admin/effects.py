"""The resolution console: effect records, what is held or AMBIGUOUS, and a person's resolution."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Case, IntegerField, Q, Value, When
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import reconcile, store
from ..canonical import idempotency_token_for
from .console import badge, call_link, change_url, shown, tampered_badge, when, when_text
from ..display import has_hidden, hidden_fields, is_blank, reveal, warning
from ..errors import CTRLRunError
from ..models import EffectRecord
from ..states import EffectState, askable, held_lapsed
from .base import (
    EvidenceAdmin, HELD, RESOLVE, RevealedValuesFilter, _action_summary, _ago, _at, _now, _object_key, _proposed,
    _receipt_rows, _timeline, refusal_text,
)


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

    def _effect_or_404(self, request: HttpRequest, object_id: str) -> tuple[str, str, store.EffectView]:
        if not self.has_resolve_permission(request):
            raise PermissionDenied(_g("resolving effects needs the ctrlrun.resolve_effect permission"))
        if request.method != "POST":
            raise PermissionDenied(_g("this action only accepts a form submission"))
        request.current_app = self.site
        key = _object_key(object_id)
        effect = store.get_effect(key)
        if effect is None:
            raise Http404(_g("no effect %(key)s") % {"key": reveal(key)})
        return key, change_url(self.site, "effectrecord", key), effect

    def ask_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        key, change, effect = self._effect_or_404(request, object_id)
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
        # Where the answer left the record: moved to committed or failed, else still ambiguous (ask_now
        # asked an ambiguous one). Only a record that moved meanwhile, or an error, says nothing of it.
        state = {"committed": "committed", "failed": "failed", "unknown": "ambiguous"}.get(line.outcome)
        if state is None:
            effect = store.get_effect(key) or effect
            state = str(effect.state)
        self.log_change(request, _row(effect, state), f"asked the remote: {line.outcome}")
        return HttpResponseRedirect(change)

    def resolve_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        key, change, _effect = self._effect_or_404(request, object_id)
        form = ResolveForm(request.POST)
        if not form.is_valid():
            problems = "; ".join(f"{field}: {' '.join(errors)}" for field, errors in form.errors.items())
            self.message_user(request, reveal(f"not resolved: {problems}"), messages.ERROR)
            return HttpResponseRedirect(change)
        outcome, reason, attempt = (form.cleaned_data[f] for f in ("outcome", "reason", "attempt"))
        try:
            resolved = store.resolve(key, outcome, by=request.user.get_username(), reason=reason, attempt=attempt)
        except CTRLRunError as exc:
            self.message_user(request, reveal(f"not resolved: {refusal_text(exc)}"), messages.ERROR)
            return HttpResponseRedirect(change)
        self.log_change(request, _row(resolved, str(resolved.state)), f"resolved {outcome} (attempt {attempt}): {reason}")
        after = (_g("a retry is now permitted") if outcome == "failed"
                 else _g("a retry will be refused as a duplicate"))
        self.message_user(request, reveal(f"Effect {key} resolved {outcome} by {request.user.get_username()}; {after}"),
                          messages.SUCCESS)
        return HttpResponseRedirect(change)


def _row(effect: store.EffectView, state: str) -> EffectRecord:
    """An unsaved record naming ``effect`` in ``state``, for the change log (``log_change``)."""
    return EffectRecord(effect_key=effect.effect_key, state=state, attempt=effect.attempt)
