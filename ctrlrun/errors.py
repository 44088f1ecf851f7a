"""The exceptions ctrlrun raises, under one base class.

Every message says what happened and, where there is something to do, what to do next. The
structured attributes (``reason``, ``effect_key``, ``state`` ...) are the stable interface; the
wording is for people.
"""
from __future__ import annotations

__all__ = [
    "CTRLRunError",
    "InvalidArgument",
    "PolicyError",
    "EffectKeyError",
    "ActionDenied",
    "ApprovalRequired",
    "ApprovalTimeout",
    "ApprovalMismatch",
    "DuplicateEffect",
    "AmbiguousEffect",
    "NotExecuted",
    "StoreUnavailable",
    "EvidenceTampered",
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


class StoreUnavailable(CTRLRunError):
    """The evidence store cannot be reached or does not exist; nothing ran."""


class EvidenceTampered(StoreUnavailable):
    """A row ctrlrun must trust does not carry its signature: it was written around ctrlrun.

    Raised when the chain head (or the store's signing key) does not verify, so ctrlrun refuses to
    write on top of it. Nothing ran. ``receipts --verify-chain`` names what changed.
    """
