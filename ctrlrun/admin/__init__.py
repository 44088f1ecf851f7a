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

The package, by family (each module registers its model admins when imported, base first), and
which model admin hosts each page that is not a model's list or change form:

- ``console``: what every page is made of (the one time format, badges, links, the rule as
  written, event data); ``frontpage``: the front page's tiles, counts and last chain check, shown
  on the admin index by ``{% ctrlrun_overview %}`` (hosted by no model admin). Neither registers.
- ``base``: the page clock, ``EvidenceAdmin`` (``console_page`` renders a hosted page) and the
  shared filters;
- ``paused``: ``PausedRunAdmin``;
- ``approvals``: ``ApprovalAdmin`` hosts the decide confirmation (``approval/<id>/decide/<answer>/``);
- ``effects``: ``EffectRecordAdmin`` hosts the ask and resolve actions (``effectrecord/<key>/ask/``,
  ``.../resolve/``, POST only);
- ``evidence``: ``ReceiptAdmin`` hosts the chain's Verify page (``receipt/verify/``), ``EventAdmin``
  the call page (``event/call/<action id>/``); ``PolicyDocumentAdmin``; ``current_policy()``, the
  policy this server reads;
- ``policychange``: the approved-policy flow's page (``policydocument/propose/``, hosted by
  ``PolicyDocumentAdmin``) and what a ``ctrlrun.policy.change`` request's page adds (diff, replay);
- ``authority``: ``BudgetLedgerAdmin`` hosts the Grants and budgets page (``budgetledger/grants/``);
  ``DelegationAdmin`` shows its list as the delegation tree and hosts the revoke confirmation
  (``delegation/<id>/revoke/``).
- ``retention``: ``HoldAdmin``, the retention page (the last prune, the anchors, the holds), with
  ``ctrlrun.view_retention``.

Every page reads through ``ctrlrun.store`` (values, never a QuerySet); only the model admins'
own lists and change forms query the models, as Django's admin does.
"""
from __future__ import annotations

from .base import DECIDE, RESOLVE, EvidenceAdmin, refusal_text
from .paused import STATE_SHOWN, PausedRunAdmin
from .approvals import ApprovalAdmin
from .effects import EffectRecordAdmin
from .evidence import EventAdmin, PolicyDocumentAdmin, ReceiptAdmin, current_policy
from .authority import BudgetLedgerAdmin, DelegationAdmin, grants_context
from .retention import HoldAdmin

__all__ = [
    "DECIDE", "RESOLVE", "EvidenceAdmin", "refusal_text", "STATE_SHOWN", "PausedRunAdmin", "ApprovalAdmin",
    "EffectRecordAdmin", "EventAdmin", "PolicyDocumentAdmin", "ReceiptAdmin", "current_policy", "BudgetLedgerAdmin",
    "DelegationAdmin", "grants_context", "HoldAdmin",
]
