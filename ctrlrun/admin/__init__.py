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

The package, by family (each module registers its model admins when imported, base first):

- ``base``: the page clock, how values are shown, ``EvidenceAdmin`` and the shared filters;
- ``paused``: ``PausedRunAdmin``;
- ``approvals``: ``ApprovalAdmin``, with the decide view (``<id>/decide/<answer>/``);
- ``effects``: ``EffectRecordAdmin``, with the ask and resolve views;
- ``evidence``: ``ReceiptAdmin`` (hosts the chain's Verify page, ``receipt/verify/``),
  ``EventAdmin`` (hosts the call page, ``event/call/<action id>/``) and ``PolicyDocumentAdmin``;
  ``current_policy()``, the policy this server reads;
- ``authority``: ``BudgetLedgerAdmin`` (hosts the Grants and budgets page, ``budgetledger/grants/``)
  and ``DelegationAdmin``, with the revoke view.
"""
from __future__ import annotations

from .base import DECIDE, RESOLVE, EvidenceAdmin, refusal_text
from .paused import STATE_SHOWN, PausedRunAdmin
from .approvals import ApprovalAdmin
from .effects import EffectRecordAdmin
from .evidence import EventAdmin, PolicyDocumentAdmin, ReceiptAdmin, current_policy
from .authority import BudgetLedgerAdmin, DelegationAdmin, grants_context

__all__ = [
    "DECIDE", "RESOLVE", "EvidenceAdmin", "refusal_text", "STATE_SHOWN", "PausedRunAdmin", "ApprovalAdmin",
    "EffectRecordAdmin", "EventAdmin", "PolicyDocumentAdmin", "ReceiptAdmin", "current_policy", "BudgetLedgerAdmin",
    "DelegationAdmin", "grants_context",
]
