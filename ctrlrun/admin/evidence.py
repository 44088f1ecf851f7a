"""The evidence: receipts, events and policy documents, read-only for everyone; the call page; the
policy this server reads."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _g
from django.utils.translation import gettext_lazy as _

from .. import conf, store
from .console import (
    approval_link, badge, call_link, changelist_url, controls_html, effect_link, link, origin_html, policy_link,
    reason_html, receipt_link, shown, tampered_badge, when,
)
from ..display import dumps, reveal, reveal_html
from ..errors import CTRLRunError
from ..models import Event, PolicyDocument, Receipt
from ..receipts import INDEXED_COLUMNS, row_problem
from ..report import chain_lines
from ..states import EMITTED_EVENT_TYPES, EffectState, EventType, effective_approval_status
from .base import (
    EvidenceAdmin, RevealedValuesFilter, WrittenFilter, _action_summary, _at, _now, _object_key, _policy_document,
    _origin, _pre, _proposed, _receipt_rows, _timeline,
)


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
            condition, params = store.citing_control(value)
        except CTRLRunError as exc:
            raise IncorrectLookupParameters(str(exc)) from None
        return queryset.extra(where=[condition], params=params)


def _with_effect_states(rows: Any) -> None:
    """Each receipt row given ``effect_state``: its key's effect record's state now, None when no
    record holds it (or it names no key); one store read for a page's rows."""
    rows = list(rows)
    states = store.effect_states(row.effect_key for row in rows)
    for row in rows:
        row.effect_state = states.get(row.effect_key) if row.effect_key else None


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
                       "policy_version", "through_gateway", "previous", "pretty_document")
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
            changelist = super().get_changelist_instance(request)
        else:
            try:
                with transaction.atomic(using=store.alias()):
                    changelist = super().get_changelist_instance(request)
            except DatabaseError as exc:
                self.message_user(request, reveal(str(store.unreadable_documents(exc))), messages.ERROR)
                raise IncorrectLookupParameters("unreadable receipt documents") from None
        _with_effect_states(changelist.result_list)
        return changelist

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            _with_effect_states([obj])
        return obj

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
        # Each row carries its key's record state (read for the page's rows: _with_effect_states).
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
        if obj is not None and self._came_from(obj) is not None:  # a call through the MCP gateway
            first = fieldsets[0]
            fields = list(first[1]["fields"])
            fields.insert(fields.index("shown_agent") + 1, "through_gateway")
            fieldsets[0] = (first[0], {**first[1], "fields": tuple(fields)})
        return fieldsets

    @staticmethod
    def _came_from(obj: Receipt) -> SafeString | None:
        """Where the receipt's call came from (its ACTION_PROPOSED event's ``origin``), read once per page."""
        if "_ctrlrun_origin" not in obj.__dict__:
            obj.__dict__["_ctrlrun_origin"] = origin_html(_origin(store.events_for_action(obj.action_id))) \
                if obj.action_id else None
        return obj.__dict__["_ctrlrun_origin"]

    @admin.display(description=_("through the MCP gateway"))
    def through_gateway(self, obj: Receipt) -> SafeString:
        return self._came_from(obj) or shown(None)

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
        before = store.receipt_id_at(obj.seq - 1)
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
        from .deployment import deployment_view

        return [path("verify/", self.admin_site.admin_view(self.verify_view), name="ctrlrun_receipt_verify"),
                path("deployment/", self.admin_site.admin_view(lambda request: deployment_view(self, request)),
                     name="ctrlrun_receipt_deployment"),
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
        states = store.effect_states(keys)
        approvals = store.approvals_of_call(action_id)
        if policy_hash is None:  # a call that asked for a person and wrote no receipt: its request names it
            policy_hash = next((a.policy_hash for a in approvals if a.action_id == action_id and a.policy_hash), None)
        now = _now()
        return self.console_page(request, "admin/ctrlrun/call.html", {
            "title": _g("Call %(id)s") % {"id": action_id},
            "action_id": action_id,
            "proposed": _action_summary(proposed),
            "origin": origin_html(_origin(events)),
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
    change_list_template = "admin/ctrlrun/policychange/policydocument_change_list.html"

    def get_urls(self) -> list[Any]:
        from .policychange import PROPOSE_URL, propose_view  # the approved-policy flow's page (§D7)

        view = self.admin_site.admin_view(lambda request: propose_view(self, request))
        return [path("propose/", view, name=PROPOSE_URL), *super().get_urls()]

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
    """The policy this server reads (a ``Policy``: the default Control's, read again when its files
    change), or None when it cannot be read. Never raises: a broken or missing policy must not break a
    page (``manage.py check`` and the protected calls say what is wrong)."""
    from ..control import default_control

    try:
        return default_control().read_policy()
    except (CTRLRunError, OSError, ValueError):
        return None
