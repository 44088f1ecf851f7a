"""The exceptions ctrlrun raises, under one base class.

Every message says what happened and, where there is something to do, what to do next. The
structured attributes (``reason``, ``effect_key``, ``state`` ...) are the stable interface; the
wording is for people.
"""
from __future__ import annotations

from typing import Any

__all__ = [
    "CTRLRunError",
    "Suspended",
    "InvalidArgument",
    "PolicyError",
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
    "StoreUnavailable",
    "EvidenceTampered",
    "StateConflict",
    "IllegalTransition",
    "IdentityError",
    "MissingDependency",
]


class CTRLRunError(Exception):
    """Base class of every error ctrlrun raises on its own account."""


class InvalidArgument(CTRLRunError):
    """A value or a wiring mistake: a bad argument type, template, keyword or setting."""


class PolicyError(CTRLRunError):
    """The policy file is missing, unreadable or malformed. The message names file, line and key."""


class EffectKeyError(CTRLRunError):
    """The effect template could not be rendered from the call's arguments.

    Deliberately not an ``ActionDenied``: the policy never saw the call. It is recorded (an
    ``ACTION_DENIED`` event with reason ``effect_key_error`` and a denied receipt).
    """


class ActionDenied(CTRLRunError):
    """The action was refused before anything ran; ``reason`` says by what."""

    def __init__(self, message: str | None = None, *, reason: str, action_id: str | None = None):
        self.reason = reason
        self.action_id = action_id
        super().__init__(message or reason)


class AuthorityDenied(ActionDenied):
    """No grant of the policy's ``authority:`` lets this principal propose this action (``reason``:
    ``no_authority``, ``authority_expired``, ``authority_task``, ``authority_constraint`` ...);
    ``grant_id`` is the grant the refusal is about, when one came close."""

    def __init__(self, message: str | None = None, *, reason: str, grant_id: str | None = None,
                 delegation_id: str | None = None, action_id: str | None = None):
        self.grant_id = grant_id
        self.delegation_id = delegation_id
        super().__init__(message, reason=reason, action_id=action_id)


class AuthorityEscalation(ActionDenied):
    """A delegation was refused when it was asked for (``Control.delegate``, ``ctrlrun delegate``):
    ``reason`` is ``unknown_parent``, ``parent_not_delegable``, ``parent_not_valid``,
    ``not_the_subject``, ``max_depth`` or ``containment`` (then ``dimension`` names the first of
    ``subject actions resources constraints environments expires_at tasks budgets`` in which the
    child asks for more than ``parent_id`` holds)."""

    def __init__(self, message: str | None = None, *, reason: str, parent_id: str | None = None,
                 dimension: str | None = None):
        self.parent_id = parent_id
        self.dimension = dimension
        super().__init__(message, reason=reason)


class BudgetRefused(InvalidArgument):
    """A budgeted grant cannot measure this call: ``budget_unmeasurable`` (its argument is missing or
    not a non-negative int) or ``budget_unkeyed`` (no effect key to hold the charge on)."""

    def __init__(self, message: str, *, reason: str):
        self.reason = reason
        super().__init__(message)


class ApprovalRequired(CTRLRunError):
    """The policy asks a human first; ``request_id`` names the request to answer."""

    def __init__(self, message: str | None = None, *, request_id: str, action_id: str | None = None):
        self.request_id = request_id
        self.action_id = action_id
        super().__init__(message or request_id)


class ApprovalTimeout(CTRLRunError):
    """``wait=True`` gave up: the request was not answered before it expired."""

    def __init__(self, message: str | None = None, *, request_id: str):
        self.request_id = request_id
        super().__init__(message or request_id)


class ApprovalMismatch(CTRLRunError):
    """The presented approval does not authorise this call (``reason`` says why)."""

    def __init__(self, message: str | None = None, *, reason: str, approval_id: str | None = None):
        self.reason = reason
        self.approval_id = approval_id
        super().__init__(message or reason)


class DuplicateEffect(CTRLRunError):
    """The effect key already happened (``state='committed'``) or is happening (``'in_progress'``)."""

    def __init__(self, message: str | None = None, *, state: str, effect_key: str):
        self.state = state
        self.effect_key = effect_key
        super().__init__(message or state)


class AmbiguousEffect(CTRLRunError):
    """Nobody knows whether the effect happened: a reconcile hook or a human must say first."""

    def __init__(self, message: str | None = None, *, effect_key: str, action_id: str | None = None):
        self.effect_key = effect_key
        self.action_id = action_id
        super().__init__(message or effect_key)


class NotExecuted(CTRLRunError):
    """Raised BY an executor that knows the remote did not act: the only route to ``failed``.

    Raise it only when the remote is certain not to have acted (e.g. the connection was refused
    before a byte was sent). Anything else a function raises leaves the effect AMBIGUOUS.
    """


class Suspended(CTRLRunError):
    """Raised BY an executor whose outcome is not known yet and will come back later (spec A5).

    Nothing is recorded as an outcome and no receipt is written: the effect key stays held
    (``executing``, its lease moved to ``Control(suspend_timeout=...)``) until
    ``Control.resume(continuation, executor)`` finishes the same action. The continuation is a
    single-use token (str or bytes) the caller keeps; the caller of the protected call gets this
    exception back, with ``continuation`` and ``round`` (1 for the first suspension).
    """

    def __init__(self, continuation: str | bytes, message: str | None = None) -> None:
        super().__init__(message or "the call is suspended; resume it with Control.resume(continuation, executor)")
        self.continuation = continuation
        self.round: int | None = None
        self.effect_key: str | None = None


class IdentityError(CTRLRunError):
    """Who acts could not be established: a credential was rejected, the principal's credential
    expired, or the identity provider failed. Nothing ran.

    A rejected credential's message is deliberately coarse (``credential rejected``): what was wrong
    with it goes to the ``ctrlrun.identity`` log only, never to whoever presented it.
    """


class MissingDependency(CTRLRunError):
    """An optional feature needs a package that is not installed; the message names the pip line."""

    def __init__(self, module: str, extra: str, requirement: str | None = None) -> None:
        self.module = module
        self.extra = extra
        how = (f"pip install '{requirement}' (django-ctrlrun's {extra} extra)" if requirement else
               f"install django-ctrlrun's {extra} extra (pip install -e '.[{extra}]' in a clone)")
        super().__init__(f"{module!r} is not installed; {how}")


class StoreUnavailable(CTRLRunError):
    """The evidence store cannot be reached or does not exist; nothing ran."""


class EvidenceTampered(StoreUnavailable):
    """A row ctrlrun must trust does not carry its signature: it was written around ctrlrun.

    Raised when the chain head (or the store's signing key) does not verify, so ctrlrun refuses to
    write on top of it. Nothing ran. ``receipts --verify-chain`` names what changed.
    """


class StateConflict(CTRLRunError):
    """A row is not in the state an operation needs: facts, not wording.

    ``what`` is the kind of row (``"effect"`` or ``"approval"``), ``ident`` its key or id,
    ``expected`` the state (or states) the operation needs and ``found`` what it is: a state, or
    ``"missing"`` (no such row) or ``"tampered"`` (the row does not carry ctrlrun's signature).
    Further facts (``attempt``, ``expected_attempt``, ``lapsed``, ``expires_at``, ``operation`` ...)
    are in ``facts`` and readable as attributes. The commands and the console word it
    (``ctrlrun.messages.state_conflict``, naming their commands); ``str()`` is that wording with no
    command named; ``args[0]`` a plain statement of the facts.
    """

    def __init__(self, what: str, ident: str, expected: str | tuple[str, ...], found: str, **facts: Any):
        self.what, self.ident, self.expected, self.found = what, ident, expected, found
        self.facts = facts
        wanted = expected if isinstance(expected, str) else " or ".join(expected)
        super().__init__(f"{what} {ident} is {found}, not {wanted}")

    def __str__(self) -> str:
        """Worded as the console words it (``ctrlrun.messages``), for a caller that only prints it."""
        from .messages import state_conflict  # messages imports this module

        return state_conflict(self)

    def __getattr__(self, name: str) -> Any:
        facts = self.__dict__.get("facts", {})
        if name in facts:
            return facts[name]
        raise AttributeError(name)


class IllegalTransition(CTRLRunError, AssertionError):
    """A bug: code asked to move an effect record (or an approval) along an edge its table does not have.

    Raised before anything is written (``states.TRANSITIONS``, ``states.APPROVAL_TRANSITIONS`` are
    checked on every state write); the database's triggers refuse the same edges for anyone who
    writes around ctrlrun.
    """

    def __init__(self, source: str, target: str, what: str = "effect record"):
        self.source, self.target, self.what = source, target, what
        table = "state" if what == "effect record" else what
        super().__init__(f"an {what} cannot move {source} -> {target}: the {table} table has no such edge")
