"""Authority: the grants and budgets page and the delegations (read-only), kept with their
templates under ``admin/ctrlrun/grants/``."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _

from .. import store
from .console import (
    badge, call_link, change_url, changelist_url, effect_link, link, policy_link, receipt_link, shown, when,
    when_text,
)
from ..display import dumps, reveal
from ..errors import CTRLRunError
from ..models import BudgetLedger, Delegation
from ..report import amount_text, budget_cap, budget_document
from ..states import EffectState
from .base import EvidenceAdmin, RevealedValuesFilter, _NumberedRows, _at, _object_key, refusal_text


# --------------------------------------------------------------------------- grants and budgets (authority, §C5)
# Kept in one block (with its templates under admin/ctrlrun/grants/) beside the rest of the console.

#: How many calls the page lists per budget (the newest first); the rest are counted.
CALLS_SHOWN = 50


def _grants_policy() -> tuple[Any, str | None]:
    """The policy this server reads and None, or None and why it cannot be read (one sentence)."""
    from ..control import default_control

    try:
        return default_control().read_policy(), None
    except (CTRLRunError, OSError, ValueError) as exc:
        return None, " ".join(str(exc).split()) or _g("the policy file could not be read")


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


def _call_row(site: str, call: store.BudgetCall, currency: str | None = None) -> dict[str, Any]:
    state = call.state
    return {
        "at": when(call.consumed_at),
        "amount": amount_text(call.amount, currency),
        "state": badge(state),
        "standing": _g("spent") if state == EffectState.COMMITTED else _g("holds"),
        "effect": effect_link(site, call.effect_key),
        "attempt": call.attempt,
        "call": call_link(site, call.action_id) if call.action_id else shown(None),
        "receipt": receipt_link(site, call.receipt_id) if call.receipt_id else format_html(
            "<em>{}</em>", _g("none yet")),
    }


def _budget_boxes(site: str, grant: Any, now: dt.datetime) -> list[dict[str, Any]]:
    """Each budget of ``grant`` (a policy grant, or a delegation's) as the page shows it: its cap, what is
    used (holds included), held and left in the window ending ``now``, and the calls that used it."""
    boxes = []
    for budget, numbers in zip(grant.budgets or (), budget_document(grant, now)["budgets"]):
        calls, total = store.budget_calls(grant.id, numbers["metric"], numbers["window_seconds"], now, CALLS_SHOWN)
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
        from ..control import default_control

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
            revoked = done.delegation if done is not None else row  # the row as the revoke left it
            self.log_change(request, Delegation(delegation_id=revoked.id, parent_id=revoked.parent_id,
                                                revoked_at=revoked.revoked_at), f"revoked {object_id}")
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
