"""Who acts, established by a provider instead of asserted by the code: ``Control(identity=...)``.

An identity provider answers one question per call: ``resolve(context) -> Principal | None``.

- it **answers** a ``Principal``: that principal acts, whatever ``ctrlrun.context()`` says (a
  Control logs one warning the first time the two differ);
- it **declines** (``None``): the principal of ``ctrlrun.context()`` (or ``Control.call(principal=)``)
  acts, except when the policy carries an authority section: then the call is refused
  ``no_principal``, since a grant is only worth the identity it is matched against;
- it **raises**: the call is refused with ``IdentityError`` and nothing else is tried. An
  ``IdentityError`` passes as raised; any other exception is wrapped in one, chained as its cause.

``IdentityContext`` is what a provider reads: the action's name, the environment, the request's
headers (lowercased names; empty in-process, filled by a gateway), and the agent and user
``context()`` asserted, if any.

The providers here trust what they are told and say so once when built: ``StaticIdentityProvider``
(one fixed principal, for development and tests) and ``HeaderIdentityProvider`` (a header set by a
proxy in front of the process: worth exactly what that proxy is worth). A provider that checks a
credential is ``ctrlrun.jwt_identity.JWTIdentityProvider``; inside Django, the request's user and
API key are ``ctrlrun.middleware.DjangoRequestIdentityProvider``.

Name normalisation (who counts as the same person) lives in ``ctrlrun.names``; its two names are
re-exported here for older imports. Pure and standard library only.
"""
from __future__ import annotations

import datetime as dt
import logging
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from .canonical import Principal
from .errors import IdentityError, InvalidArgument
from .names import normalize_identity, same_person

__all__ = ["IdentityProvider", "IdentityContext", "StaticIdentityProvider", "HeaderIdentityProvider",
           "IdentityError", "normalize_identity", "same_person", "clean_header"]

logger = logging.getLogger("ctrlrun.identity")

#: Longest header value a provider reads; a longer one is treated as absent (and logged).
MAX_HEADER_LENGTH = 8192


def clean_header(value: Any) -> str | None:
    """A header's value as a provider may use it: stripped, None when blank, too long, or when it
    carries a control or bidi/format character (a value no proxy sets honestly)."""
    if not isinstance(value, str):
        return None
    value = value.strip()
    if not value:
        return None
    if len(value) > MAX_HEADER_LENGTH:
        logger.warning("a header value of %d characters was ignored (at most %d are read)", len(value),
                       MAX_HEADER_LENGTH)
        return None
    if any(unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp") for char in value):
        logger.warning("a header value carrying control or invisible formatting characters was ignored")
        return None
    return value


@dataclass(frozen=True)
class IdentityContext:
    """What an identity provider sees of one call."""

    action: str
    environment: str
    headers: Mapping[str, str] = field(default_factory=dict)
    agent: str | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.headers, Mapping):
            raise InvalidArgument("IdentityContext(headers=...) must be a mapping of header name to value")
        lowered = {str(name).lower(): value for name, value in self.headers.items()}
        object.__setattr__(self, "headers", MappingProxyType(lowered))

    def header(self, name: str) -> str | None:
        """The header's value (case-insensitive name), or None when absent or blank."""
        return clean_header(self.headers.get(name.lower()))


@runtime_checkable
class IdentityProvider(Protocol):
    """Establishes who acts for a call: a ``Principal``, or None to decline (see the module docstring)."""

    def resolve(self, context: IdentityContext) -> Principal | None:
        ...


def check_provider(provider: Any) -> Any:
    """``provider`` when it can be a Control's identity provider; else a clear InvalidArgument."""
    if provider is not None and not callable(getattr(provider, "resolve", None)):
        raise InvalidArgument(f"Control(identity=...): {provider!r} is not an identity provider (it needs "
                              f"resolve(context) returning a ctrlrun.Principal or None; see ctrlrun.identity)")
    return provider


def answer_of(provider: Any, name: str, answer: Any) -> Principal | None:
    """A provider's answer checked: a Principal or None; anything else is the provider's bug."""
    if answer is None or isinstance(answer, Principal):
        return answer
    logger.warning("%s: identity provider %s returned %s, not a Principal or None", name,
                   type(provider).__name__, type(answer).__name__)
    raise IdentityError(f"{name}: the identity provider returned {type(answer).__name__}, not a ctrlrun.Principal "
                        f"or None")


def wrapped(provider: Any, name: str, exc: BaseException) -> IdentityError:
    """The ``IdentityError`` a provider's failure (other than an IdentityError) is refused with; the
    caller chains ``exc`` as its cause."""
    logger.warning("%s: identity provider %s raised %s: %s", name, type(provider).__name__, type(exc).__name__, exc)
    return IdentityError(f"{name}: the identity provider failed ({type(exc).__name__}); the call was refused")


def expired_message(name: str, principal: Principal) -> str:
    """The refusal of a call whose principal's credential has expired (``principal_expired``)."""
    when = principal.expires_at.isoformat(timespec="seconds") if principal.expires_at else "?"
    return f"{name}: the principal's credential expired at {when}; present a fresh one (principal_expired)"


def _warn_unverified(kind: str, what: str) -> None:
    logger.warning("%s: %s is taken as given and nothing verifies it; use it for development, tests or behind "
                   "a proxy you control, never where the principal is an authorization input from outside",
                   kind, what)


def _present(context: IdentityContext, name: str) -> bool:
    value = context.headers.get(name)
    return isinstance(value, str) and bool(value.strip()) or (value is not None and not isinstance(value, str))


class StaticIdentityProvider:
    """Always the same principal (development and tests). Warns once, when built."""

    def __init__(self, agent: str, user: str | None = None, claims: Mapping[str, Any] | None = None,
                 issuer: str | None = None, expires_at: dt.datetime | None = None) -> None:
        self.principal = Principal(agent, user, claims=claims or {}, issuer=issuer, expires_at=expires_at)
        _warn_unverified("StaticIdentityProvider", f"the identity {agent!r}")

    def __repr__(self) -> str:
        return f"StaticIdentityProvider(agent={self.principal.agent!r}, user={self.principal.user!r})"

    def resolve(self, context: IdentityContext) -> Principal | None:
        return self.principal


class HeaderIdentityProvider:
    """The agent (and user) named by request headers a trusted proxy sets; no claims. Warns once.

    A missing or blank agent header declines; a header sent but unusable (oversized, or with control
    or bidi characters) is ``IdentityError("credential rejected")``, never a silent fallback.
    """

    def __init__(self, agent_header: str, user_header: str | None = None, issuer: str | None = None) -> None:
        for what, value in (("agent_header", agent_header), ("user_header", user_header)):
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise InvalidArgument(f"HeaderIdentityProvider({what}=...) must name a header, e.g. 'x-agent'")
        if agent_header is None:
            raise InvalidArgument("HeaderIdentityProvider(agent_header=...) must name a header, e.g. 'x-agent'")
        self.agent_header = agent_header.strip().lower()
        self.user_header = user_header.strip().lower() if user_header else None
        self.issuer = issuer
        _warn_unverified("HeaderIdentityProvider", f"the header {self.agent_header!r} (it is worth exactly what "
                                                   f"the proxy that sets it is worth)")

    def __repr__(self) -> str:
        return f"HeaderIdentityProvider(agent_header={self.agent_header!r}, user_header={self.user_header!r})"

    def resolve(self, context: IdentityContext) -> Principal | None:
        agent = context.header(self.agent_header)
        if agent is None:
            if _present(context, self.agent_header):  # sent, but oversized or with control/bidi characters
                raise IdentityError("credential rejected")
            return None
        user = context.header(self.user_header) if self.user_header else None
        if user is None and self.user_header and _present(context, self.user_header):
            raise IdentityError("credential rejected")
        try:
            return Principal(agent, user, issuer=self.issuer)
        except InvalidArgument as exc:
            logger.warning("%s: the identity headers were refused: %s", context.action, exc)
            raise IdentityError("credential rejected") from None
