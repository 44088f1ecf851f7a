"""ctrlrun: the execution safety layer between an AI agent's decision and the call that acts.

    import ctrlrun

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def refund(payment_id: str, amount: int) -> dict: ...

    with ctrlrun.context(agent="refund-agent"):
        refund(payment_id="txn_9", amount=50000)

Importing this package configures nothing and touches no database: inside a Django project
the app registry imports it before models are ready, and a plain script configures its
embedded store on the first protected call.
"""
from __future__ import annotations

from .canonical import Action, Principal, canonical_bytes
from .errors import (
    ActionDenied,
    AuthorityDenied,
    AuthorityEscalation,
    BudgetRefused,
    AmbiguousEffect,
    ApprovalMismatch,
    ApprovalRequired,
    ApprovalTimeout,
    CTRLRunError,
    DuplicateEffect,
    EffectKeyError,
    EvidenceTampered,
    IdentityError,
    InvalidArgument,
    MissingDependency,
    NotExecuted,
    Suspended,
    PolicyError,
    StateConflict,
    StoreUnavailable,
)
from .control import Control
from .identity import HeaderIdentityProvider, IdentityContext, IdentityProvider, StaticIdentityProvider
from .protect import context, idempotency_token, protect, with_approval


def setup() -> None:
    """Configure Django (and the embedded store) as the first protected call would.

    A plain script needs it only before using ``ctrlrun.store`` or ``ctrlrun.reconcile``
    directly; inside a Django project it only makes sure ``django.setup()`` has run.
    """
    from .standalone import ensure_ready

    ensure_ready()
from .states import Decision, EffectState, ReconcileOutcome, Result

__version__ = "0.1.0"

__all__ = [
    "protect",
    "Control",
    "setup",
    "context",
    "with_approval",
    "idempotency_token",
    "ReconcileOutcome",
    "Action",
    "Principal",
    "canonical_bytes",
    "Decision",
    "EffectState",
    "Result",
    "CTRLRunError",
    "InvalidArgument",
    "PolicyError",
    "StateConflict",
    "EvidenceTampered",
    "EffectKeyError",
    "ActionDenied",
    "AuthorityDenied",
    "AuthorityEscalation",
    "BudgetRefused",
    "ApprovalRequired",
    "ApprovalTimeout",
    "ApprovalMismatch",
    "DuplicateEffect",
    "AmbiguousEffect",
    "NotExecuted",
    "Suspended",
    "StoreUnavailable",
    "IdentityError",
    "MissingDependency",
    "IdentityProvider",
    "IdentityContext",
    "StaticIdentityProvider",
    "HeaderIdentityProvider",
    "__version__",
]
