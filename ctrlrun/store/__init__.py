"""The only package that talks to the database: every transaction, row lock and conflict.

This façade re-exports the store's public names (``from ctrlrun import store; store.reserve(...)``);
the work lives in one module per concern:

- ``base``        which database (``using()``), the clock, a phase, a read, the raw hot-path cursor
- ``sql``         every statement an allowed call makes, named
- ``signatures``  the MACs over effect records, approvals, the chain head and recorded checks
- ``chain``       appending events and receipts to their hash chains (``seal``)
- ``policies``    policy documents, stored once
- ``approvals``   requests, answers, expiry, use
- ``effects``     reserve, lease, outcome: every state write (``move_effect``)
- ``resolutions`` an AMBIGUOUS effect's ends: a hook's answer, a person's resolve, the sweep
- ``budgets``     the budget ledger: charged with a reservation, released when an attempt fails
- ``evidence``    reads, chain verification, recorded checks, the overview
- ``continuations`` suspended attempts (``ctrlrun.Suspended``): held with their key, resumed once
- ``paused``      paused runs of agent frameworks (``ctrlrun.resumption``): stored, claimed once
- ``reports``     small reads behind what the console's pages and the commands claim
- ``delegations`` grants handed down at runtime (authority, §C3): created or refused, revoked once
- ``people``      the humans behind an ``approver_role`` (Django groups or permissions): reads only
- ``notifications`` mail about approval requests (``ctrlrun.notify``): deliveries, each link's one use

Its value types live in ``ctrlrun.values`` (no Django); its wording in ``ctrlrun.messages``.

Two surfaces. What this façade exports (``__all__``) is the store's interface to the rest of
ctrlrun: the Control, the kernel, the console and the commands import nothing else. A name
without an underscore in one of the modules above is the package's *inside* interface: its
siblings use it (``effects`` reserves through ``approvals.take_presented``, ``chain.seal``,
``signatures.effect_mac`` ...), and so may the migrations, which re-sign rows with the signature
documents of their moment (``signatures.approval_document_v1``), and the tests and benches that
reach one concern. An underscore name never leaves its module (``tests/unit/test_layers.py``).

Design
------
A protected call is a few short *phases*, each one ``transaction.atomic(durable=True)`` with a
closed set of results, and never a transaction open while the user's function runs:

1. ``reserve``: take the effect key (insert the row, or renew a ``failed`` one) and mark it
   executing, in ONE transaction. The call's opening events (proposed, evaluated, reserved,
   started) are kept on the record itself (``pending``) until the call ends. A refusal writes its
   events and its ``blocked`` receipt in that same transaction.
2. the function runs, outside any transaction, while a heartbeat renews the lease;
3. ``record_outcome``: move the row (if this attempt still holds it), and append the opening
   events, the outcome event and the receipt to the evidence, in ONE transaction.

So an allowed call costs two write transactions; a denied or refused one costs one.

The clock. Every time the store writes or compares (leases, expiries, evidence) comes from the
*store's* clock, read once per phase: the database server's ``now()`` on PostgreSQL, so a host
whose clock runs minutes fast or slow can neither lapse a live lease nor misdate a row; on SQLite
the one host's system clock, which is the only clock its processes can have. A test clock
(``conf.set_clock``) replaces both.

Evidence. Receipts and events are two hash chains hanging off one head row (``ChainHead``),
which each evidence append locks, last in its transaction. Reservation appends nothing (its
events wait on the record), so taking a key takes no global lock; the outcome phase, which locks
the head for its receipt anyway, appends the waiting events with it. If the worker dies, whoever
sweeps its lapsed lease appends them, with the dead attempt's ``ambiguous`` receipt. The head
is signed (``ctrlrun.signing``) and checked before every append, as are effect records and
approvals before they are relied on: a row written around ctrlrun is refused where it is used.

Serialisation. On SQLite every transaction is ``BEGIN IMMEDIATE`` (see ``standalone.
sqlite_options``), so a read-then-write decision cannot interleave with another writer. On
PostgreSQL a first reservation is ``INSERT ... ON CONFLICT DO NOTHING`` on the key (a concurrent
insert of the same key waits for the winner, then does nothing), and every other decision reads
the row with ``SELECT ... FOR UPDATE``. Lock order is always effect row, then approval row, then
the budgets' advisory locks (sorted), then chain head: no deadlocks.

The hot path (reserve, outcome, events, receipts) is plain SQL over the models' tables: the
ORM's query building cost more than the database work (profiled). Everything else uses the ORM.
The store returns frozen dataclasses and raises ctrlrun's own errors, never QuerySets or
database exceptions; a row not in the state an operation needs is a ``StateConflict`` (facts,
worded by the commands and the console). A phase cannot be nested inside a caller's open transaction
(``durable=True``): evidence must not roll back with someone else's work.
"""
from __future__ import annotations

from ..errors import IllegalTransition, StateConflict, StoreUnavailable
from ..messages import TAMPERED_HINT
from ..receipts import PROGRESS_EVERY
from ..values import (
    ApprovalView,
    Call,
    Charge,
    ChainCheckView,
    EffectView,
    EventRow,
    EventView,
    HookAnswer,
    OutcomeWrite,
    Observation,
    Overview,
    PausedRunView,
    Pending,
    PolicyDocumentView,
    ReceiptView,
    Refused,
    Reserved,
)
from . import (approvals, base, budgets, chain, continuations, delegations, effects, evidence, notifications, paused, people,
               policies, reports, resolutions, signatures, sql)
from .approvals import (
    answer_approval,
    approvals_for_hash,
    approvals_of_call,
    expire_if_due,
    get_approval,
    list_approvals,
    request_approval,
)
from .budgets import budget_usage, charges_of, ledger_rows
from .base import alias, now, using
from .effects import (
    LEASE_LAPSED_ERROR,
    begin_unkeyed,
    check_ceiling,
    observe_begin,
    record_denial,
    record_outcome,
    record_refusal,
    renew_lease,
    reserve,
)
from .resolutions import reconcile_candidates, record_reconciliation, resolve, sweep_lapsed, write_ambiguous_receipt
from .evidence import (
    check_control_id,
    citing_control,
    unreadable_documents,
    events_for_action,
    events_for_effect,
    get_effect,
    get_receipt,
    head_position,
    last_check,
    list_effects,
    list_receipts,
    overview,
    receipts_for_action,
    receipt_documents_since,
    receipts_for_effect,
    record_check,
    run_check,
    verify,
    verify_incremental,
)
from .continuations import continuation_rounds, held_principal, hold_continuation, take_continuation
from .paused import (
    claim_paused_run,
    finish_paused_run,
    get_paused_run,
    list_paused_runs,
    paused_run_for,
    ready_paused_runs,
    release_paused_run,
    save_paused_run,
)
from .delegations import (
    create_delegation,
    delegation_chain,
    delegations_beneath,
    delegations_for,
    get_delegation,
    list_delegations,
    revoke_delegation,
)
from .reports import (
    BudgetCall,
    PausedRunBrief,
    action_recorded,
    budget_calls,
    effect_states,
    paused_run_brief,
    policy_stored,
    receipt_id_at,
    recorded_actions,
)
from .policies import ensure_policy, forget_known_policies, policy_document, policy_document_forged
from .signatures import paused_ok as paused_run_ok
from .signatures import policy_document_ok
from .signatures import (
    APPROVAL_DOMAIN,
    CHECK_DOMAIN,
    EFFECT_DOMAIN,
    HEAD_DOMAIN,
    approval_signature_ok,
    effect_signature_ok,
)

__all__ = [
    # values (ctrlrun.values)
    "Call", "Charge", "Observation", "Pending",
    "Reserved", "Refused", "OutcomeWrite", "HookAnswer", "EffectView", "EventView", "ReceiptView",
    "ApprovalView", "ChainCheckView", "Overview", "EventRow", "PausedRunView", "PolicyDocumentView",
    # errors the store raises on its own account
    "StateConflict", "IllegalTransition", "StoreUnavailable",
    # which database, and its clock
    "using", "alias", "now",
    # policies
    "ensure_policy", "forget_known_policies", "policy_document", "policy_document_forged", "policy_document_ok", "paused_run_ok",
    # effects
    "record_denial", "begin_unkeyed", "check_ceiling", "observe_begin", "reserve", "record_refusal", "renew_lease",
    "record_outcome",
    "record_reconciliation", "write_ambiguous_receipt", "resolve", "sweep_lapsed", "reconcile_candidates",
    "LEASE_LAPSED_ERROR",
    # the budget ledger
    "budget_usage", "ledger_rows", "charges_of",
    # approvals
    "request_approval", "answer_approval", "expire_if_due", "get_approval", "list_approvals", "approvals_for_hash",
    "approvals_of_call",
    # suspended attempts (spec A5): a continuation held with its key, taken once
    "hold_continuation", "take_continuation", "continuation_rounds", "held_principal",
    # paused runs of agent frameworks (ctrlrun.resumption): mutable, not evidence
    "save_paused_run", "get_paused_run", "paused_run_for", "list_paused_runs", "ready_paused_runs",
    "claim_paused_run", "finish_paused_run", "release_paused_run",
    # delegations (authority, §C3): revoked once, never deleted
    "create_delegation", "revoke_delegation", "list_delegations", "get_delegation", "delegations_beneath",
    "delegations_for", "delegation_chain",
    # evidence
    "list_effects", "get_effect", "list_receipts", "get_receipt", "events_for_action", "events_for_effect",
    "citing_control", "check_control_id", "unreadable_documents",
    "receipts_for_action", "receipts_for_effect", "receipt_documents_since", "verify", "verify_incremental",
    "record_check", "run_check",
    "last_check", "head_position", "overview", "PROGRESS_EVERY",
    # small reads for the pages and commands (values, never a QuerySet)
    "BudgetCall", "PausedRunBrief", "budget_calls", "effect_states", "recorded_actions", "action_recorded",
    "receipt_id_at", "policy_stored", "paused_run_brief",
    # signatures (the migrations re-sign rows with these)
    "HEAD_DOMAIN", "EFFECT_DOMAIN", "APPROVAL_DOMAIN", "CHECK_DOMAIN", "approval_signature_ok", "effect_signature_ok",
    "TAMPERED_HINT",
    # the modules, for tests and tools that reach one concern
    "approvals", "base", "budgets", "chain", "delegations", "effects", "evidence", "paused", "people", "policies",
    "reports", "resolutions", "signatures", "sql", "notifications", "continuations",
]
