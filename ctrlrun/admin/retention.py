"""The retention page (docs/retention.md): the last prune's checkpoint and what it removed, the anchors,
and the legal holds. Read-only: holds are placed and released with ``hold``; visible with the
permission ``ctrlrun.view_retention``."""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _

from ..models import Hold
from ..store import retention
from .console import badge, shown, when

VIEW_RETENTION = "ctrlrun.view_retention"


def _prune_line() -> SafeString:
    found = retention.latest_checkpoint()
    if found is None:
        return format_html("{}", _g("Never pruned: the receipt chain starts at the genesis."))
    signed = "" if retention.checkpoint_ok(found) else _g(" NOT SIGNED BY CTRLRUN.")
    return format_html(_g("Last prune: through receipt seq {} at {}, by {} ({}); the chain verifies from its "
                          "checkpoint {}.{}"), found.seq, when(found.at), shown(found.by), shown(found.reason),
                       shown(found.hash), signed)


def _anchor_line() -> SafeString:
    from ..anchor import AnchorUnavailable, load_provider

    provider = load_provider(None)
    if provider is None:
        return format_html("{}", _g("No anchor file (CTRLRUN_ANCHOR_FILE): the chain head is recorded nowhere "
                                    "outside the store."))
    try:
        latest = provider.latest()
    except AnchorUnavailable as exc:
        return format_html(_g("Anchors unavailable: {}"), shown(str(exc)))
    if latest is None:
        return format_html("{}", _g("No anchor recorded yet."))
    return format_html(_g("Latest anchor: receipt seq {} ({}). Run anchor --verify to check the store "
                          "against every anchor."), latest[0], shown(latest[1]))


@admin.register(Hold)
class HoldAdmin(admin.ModelAdmin):
    list_display = ("shown_id", "seqs", "state", "shown_reason", "shown_placed_by", "placed")
    list_display_links = None
    list_per_page = 50
    ordering = ("-placed_at", "hold_id")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.has_perm(VIEW_RETENTION)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> Any:
        extra = {"title": _g("Retention: holds, the last prune, anchors"), "retention_prune": _prune_line(),
                 "retention_anchors": _anchor_line(), **(extra_context or {})}
        return super().changelist_view(request, extra)

    @admin.display(description=_("hold"))
    def shown_id(self, row: Hold) -> SafeString:
        return shown(row.hold_id)

    @admin.display(description=_("receipt seqs"))
    def seqs(self, row: Hold) -> str:
        return f"{row.from_seq}..{row.to_seq if row.to_seq is not None else _g('end')}"

    @admin.display(description=_("state"))
    def state(self, row: Hold) -> SafeString:
        if not retention.hold_ok(row):
            return badge("tampered", _g("not signed: holds"))
        if row.released_at is None:
            return badge("pending", _g("live"))
        return format_html("{} {} {}", badge("resumed", _g("released")), shown(row.released_by), when(row.released_at))

    @admin.display(description=_("reason"))
    def shown_reason(self, row: Hold) -> SafeString:
        return shown(row.reason)

    @admin.display(description=_("placed by"))
    def shown_placed_by(self, row: Hold) -> SafeString:
        return shown(row.placed_by)

    @admin.display(description=_("placed"))
    def placed(self, row: Hold) -> SafeString:
        return when(row.placed_at)
