"""Who acts, from the Django request: ``IdentityMiddleware`` and ``DjangoRequestIdentityProvider``.

A view that runs an agent needs no ``ctrlrun.context()`` of its own. The middleware (after
``AuthenticationMiddleware``) reads the request once and keeps what it found in a context
variable for the length of the request; the provider, given to a Control
(``Control(identity=DjangoRequestIdentityProvider())``, or for the default Control
``CTRLRUN_IDENTITY_PROVIDER = "ctrlrun.middleware.DjangoRequestIdentityProvider"``), answers
from it. Context variables follow the request into an async view, into ``sync_to_async``, and
into the store threads of an async protected call.

How the **agent** is identified, first match wins:

1. **An API key** in the ``X-Ctrlrun-Agent-Key`` header (``CTRLRUN_AGENT_KEY_HEADER`` renames it).
   ``CTRLRUN_AGENT_API_KEYS`` maps the key's SHA-256 (``"sha256:<hex>"``, never the key itself:
   ``python -c "import hashlib,sys; print('sha256:'+hashlib.sha256(sys.argv[1].encode()).hexdigest())" KEY``)
   to an agent name. A key that is presented and not listed is a rejected credential: the
   request goes on, and a protected call made in it raises ``IdentityError("credential rejected")``
   (what was wrong is logged), so a typo never falls back to another identity.
2. **A service account**: an authenticated ``request.user`` in the group ``CTRLRUN_AGENT_GROUP``
   (default ``ctrlrun-agents``) is the agent itself, by its username, acting for nobody.
3. **A person**, logged in and not a service account: the agent is ``CTRLRUN_REQUEST_AGENT``
   when set (the name the site's own assistant acts under), else the agent ``ctrlrun.context()``
   names; the user is the person.

The **user** is ``request.user``'s username whenever it is a person (an API-key request made
from a logged-in session acts for that person too). An anonymous request without a key declines:
``ctrlrun.context()`` then says who acts, as without a provider (and under an authority section
the call is refused ``no_principal``). The principal carries ``issuer="django"`` and the claim
``authenticated_by`` (``api-key``, ``service-account`` or ``session``).
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async

from .canonical import Principal
from .errors import IdentityError, InvalidArgument
from .identity import IdentityContext, clean_header

__all__ = ["IdentityMiddleware", "DjangoRequestIdentityProvider", "RequestIdentity", "request_identity",
           "key_digest", "settings_problem"]

logger = logging.getLogger("ctrlrun.identity")

DEFAULT_KEY_HEADER = "X-Ctrlrun-Agent-Key"
DEFAULT_AGENT_GROUP = "ctrlrun-agents"
ISSUER = "django"


@dataclass(frozen=True)
class RequestIdentity:
    """What the middleware found on one request: an agent (or None), a user, how; or a rejection."""

    agent: str | None
    user: str | None
    authenticated_by: str | None
    rejected: str | None = None  # why a presented credential was refused (logged, never shown)


_current: ContextVar[RequestIdentity | None] = ContextVar("ctrlrun_request_identity", default=None)


def request_identity() -> RequestIdentity | None:
    """The identity of the request being handled, or None outside one (or without the middleware)."""
    return _current.get()


def key_digest(key: str) -> str:
    """How an API key is listed in ``CTRLRUN_AGENT_API_KEYS``: ``sha256:`` and the hex digest."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def _settings() -> tuple[str, Mapping[str, str], str, str | None]:
    from django.conf import settings

    header = getattr(settings, "CTRLRUN_AGENT_KEY_HEADER", DEFAULT_KEY_HEADER)
    keys = getattr(settings, "CTRLRUN_AGENT_API_KEYS", {}) or {}
    group = getattr(settings, "CTRLRUN_AGENT_GROUP", DEFAULT_AGENT_GROUP)
    default_agent = getattr(settings, "CTRLRUN_REQUEST_AGENT", None)
    if not isinstance(header, str) or not header.strip():
        raise InvalidArgument("CTRLRUN_AGENT_KEY_HEADER must name a request header, e.g. 'X-Ctrlrun-Agent-Key'")
    if not isinstance(keys, Mapping) or not all(
            isinstance(k, str) and k.startswith("sha256:") and len(k) == 71 and isinstance(v, str) and v.strip()
            for k, v in keys.items()):
        raise InvalidArgument("CTRLRUN_AGENT_API_KEYS maps 'sha256:<64 hex digits>' (the key's digest, see "
                              "ctrlrun.middleware.key_digest) to an agent name; never list a key itself")
    return header, keys, group, default_agent


def settings_problem() -> str | None:
    """What is wrong with the middleware's settings (``manage.py check``, ctrlrun.E007), or None."""
    try:
        _settings()
    except InvalidArgument as exc:
        return str(exc)
    return None


def _identify(request: Any, user: Any, in_group: Callable[[Any, str], bool]) -> RequestIdentity | None:
    header, keys, group, default_agent = _settings()
    person = user.get_username() if user is not None and getattr(user, "is_authenticated", False) else None
    presented = request.headers.get(header)
    if presented is not None:
        key = clean_header(presented)
        agent = keys.get(key_digest(key)) if key is not None else None
        if agent is None:
            return RequestIdentity(None, None, None, rejected=f"an unknown or malformed key in {header}")
        service = person is not None and in_group(user, group)
        return RequestIdentity(agent, None if service else person, "api-key")
    if person is None:
        return None
    if in_group(user, group):
        return RequestIdentity(person, None, "service-account")
    return RequestIdentity(default_agent, person, "session")


def _member(user: Any, group: str) -> bool:
    return user.groups.filter(name=group).exists()


class IdentityMiddleware:
    """Keeps the request's identity for ``DjangoRequestIdentityProvider``; sync and async capable.

    Put it after ``django.contrib.auth.middleware.AuthenticationMiddleware`` in ``MIDDLEWARE``.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self._async:
            return self.__acall__(request)
        token = _current.set(_identify(request, getattr(request, "user", None), _member))
        try:
            return self.get_response(request)
        finally:
            _current.reset(token)

    async def __acall__(self, request: Any) -> Any:
        user = await request.auser() if hasattr(request, "auser") else None
        found = await sync_to_async(_identify)(request, user, _member)
        token = _current.set(found)
        try:
            return await self.get_response(request)
        finally:
            _current.reset(token)


class DjangoRequestIdentityProvider:
    """The principal of the Django request being handled (see the module docstring)."""

    def __repr__(self) -> str:
        return "DjangoRequestIdentityProvider()"

    def resolve(self, context: IdentityContext) -> Principal | None:
        found = _current.get()
        if found is None:
            return None
        if found.rejected is not None:
            logger.warning("%s: the request's agent credential was rejected: %s", context.action, found.rejected)
            raise IdentityError("credential rejected")
        agent = found.agent or context.agent
        if agent is None:
            return None
        return Principal(agent, found.user, claims={"authenticated_by": found.authenticated_by}, issuer=ISSUER)
