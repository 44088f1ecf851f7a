"""Paused agent runs (``ctrlrun.resumption``): read-only, visible to whoever may read approvals."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _

from .. import store
from .console import approval_link, badge, change_url, link, shown, tampered_badge, when
from ..display import reveal, reveal_html
from ..models import PausedRun
from ..states import effective_approval_status
from .base import _NumberedRows, _at, _now


# --------------------------------------------------------------------------- paused runs (ctrlrun.resumption)

#: The paused run's state is shown up to this many characters (it can be megabytes of JSON).
STATE_SHOWN = 20_000
VIEW_APPROVAL = "ctrlrun.view_approval"


def _paused_badge(status: str) -> SafeString:
    tone = {"pending": "warn", "resuming": "info", "resumed": "ok", "failed": "alert"}.get(status, "alert")
    return format_html('<span class="ctrlrun-badge {}">{}</span>', tone, shown(status))


def _paused_run_line(site: str, approval_id: str) -> SafeString | None:
    """On an approval's page: the paused agent run waiting for (or resumed after) this answer."""
    row = store.paused_run_brief(approval_id)
    if row is None:
        return None
    run = link(change_url(site, "pausedrun", row.id), _g("paused run %(id)s") % {"id": row.id})
    if row.status == PausedRun.PENDING:
        return format_html(_g("A paused {} run waits for this answer: {} ({})."), shown(row.framework), run,
                           _paused_badge(row.status))
    return format_html(_g("A paused {} run waited for this answer: {} ({})."), shown(row.framework), run,
                       _paused_badge(row.status))


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
