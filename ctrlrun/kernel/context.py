"""Who acts, what approval is presented, which attempt runs: the context a protected call reads.

Context variables, not thread-locals: a value set around ``await`` is seen by the awaited code,
each ``asyncio`` task starts with a copy of its creator's values (so ``asyncio.gather`` of calls
made inside ``ctrlrun.context(...)`` all act for that principal), and ``asyncio.to_thread``
carries them into the thread.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from ..canonical import Principal, idempotency_token_for
from ..errors import InvalidArgument

__all__ = ["context", "with_approval", "idempotency_token", "current_principal", "presented_approval",
           "running_attempt", "call_origin", "current_origin"]

_principal: ContextVar[Principal | None] = ContextVar("ctrlrun_principal", default=None)
_approval: ContextVar[str | None] = ContextVar("ctrlrun_approval", default=None)
#: (effect key, attempt) of the protected function running in this context, for idempotency_token().
running_attempt: ContextVar[tuple[str, int] | None] = ContextVar("ctrlrun_attempt", default=None)
_origin: ContextVar[Mapping[str, Any] | None] = ContextVar("ctrlrun_origin", default=None)


def current_principal() -> Principal | None:
    return _principal.get()


def presented_approval() -> str | None:
    return _approval.get()


def current_origin() -> Mapping[str, Any] | None:
    return _origin.get()


@contextlib.contextmanager
def call_origin(origin: Mapping[str, Any]) -> Iterator[None]:
    """Say where the protected calls inside the block came from (a JSON object of short strings: the
    MCP gateway's client, session and upstream). Recorded in each call's ACTION_PROPOSED event, so
    it is hash-chained evidence; it is not part of the action or its hash. The surface that sets it
    bounds what it holds."""
    if not isinstance(origin, Mapping):
        raise InvalidArgument(f"call_origin() takes a mapping, not {type(origin).__name__}")
    token = _origin.set(dict(origin))
    try:
        yield
    finally:
        _origin.reset(token)


@contextlib.contextmanager
def context(agent: str, user: str | None = None) -> Iterator[Principal]:
    """Name who acts for the protected calls inside the block (nested blocks override)."""
    principal = Principal(agent=agent, user=user)
    token = _principal.set(principal)
    try:
        yield principal
    finally:
        _principal.reset(token)


@contextlib.contextmanager
def with_approval(request_id: str) -> Iterator[str]:
    """Present a human's approval for the protected calls inside the block.

    The approval authorises exactly the action the human read (its hash), once.
    """
    if not isinstance(request_id, str) or not request_id.strip():
        raise InvalidArgument("with_approval() needs the approval request id (apr_...) a human answered")
    token = _approval.set(request_id.strip())
    try:
        yield request_id
    finally:
        _approval.reset(token)


def idempotency_token(per_attempt: bool = False) -> str:
    """A UUID for this call's effect key, to hand to the remote's idempotency header.

    It is the same for every attempt at one effect key (a deliberate departure from the
    reference): if a worker frozen past its lease wakes and calls the remote after a retry already
    did, a remote that dedupes on the token (Stripe, most payment and email APIs) treats the late
    call as a replay of the first. ``per_attempt=True`` gives the reference's value, which changes
    with each attempt (for a remote that keeps a failed request's answer under its key).
    """
    current = running_attempt.get()
    if current is None:
        raise InvalidArgument(
            "idempotency_token() is defined only inside an executor running under an effect key: call it "
            "from the body of a protected function that has effect=..."
        )
    key, attempt = current
    return idempotency_token_for(key, attempt) if per_attempt else idempotency_token_for(key)
