"""A call re-sent after a person answered its approval request: which request it presents.

Surfaces that cannot carry ``with_approval`` (the MCP gateway, the ACS hook) ask a person the first
time a call needs approval and expect the *identical* call again once it is granted. These reads say
what to do with the re-sent call: the hash the kernel will bind an approval of it to (``bound``), the
request to present (``answered_for``), and whether its key already ran, so nobody is asked again
(``settled``). The kernel stays the authority: a presented request is checked and consumed
atomically with the reservation, exactly as ``with_approval`` presents it.
"""
from __future__ import annotations

from typing import Any

from ctrlrun.canonical import Action, Principal, canonical_arguments
from ctrlrun.errors import CTRLRunError, InvalidArgument

__all__ = ["bound", "settled", "answered_for"]


def bound(policy: Any, name: str, arguments: dict[str, Any], principal: Principal) -> tuple[str, str | None] | None:
    """The hash the kernel will bind an approval of this call to, and its effect key (None if the
    kernel will refuse the call before asking anyone)."""
    try:
        canonical = canonical_arguments(arguments)
        entry = policy.entry(name)
        resource = entry.resource.render(canonical, error=InvalidArgument) if entry and entry.resource else None
        action = Action(name, canonical, principal, resource=resource, environment=policy.environment)
        key = entry.effect.render(canonical, error=InvalidArgument) if entry and entry.effect else None
        return action.hash, key
    except CTRLRunError:
        return None


def settled(store: Any, key: str | None) -> tuple[str, str] | None:
    """A key that already ran or is running, so asking a person again would be pointless: the
    refusal the kernel's reservation would give (it stays the authority on every other path), as
    ``(kind, state)``: ``duplicate_effect`` (``committed`` or ``in_progress``) or ``ambiguous_effect``."""
    if key is None:
        return None
    effect = store.get_effect(key)
    if effect is None or not getattr(effect, "signature_ok", True):
        return None
    if effect.state == "committed":
        return "duplicate_effect", "committed"
    if effect.state == "executing":
        return "duplicate_effect", "in_progress"
    if effect.state == "ambiguous":
        return "ambiguous_effect", "ambiguous"
    return None


def _verified_enough(row: Any) -> bool:
    """Whether a granted row carries the verified approvers its own pins require: one granted through a
    surface that verifies nobody (the command line, a webhook) is refused at use and left granted, so
    presenting it again would refuse every re-sent call until it expires instead of asking again."""
    from ctrlrun import approvers

    return approvers.problem(pinned_roles=tuple(row.required_roles), pinned_count=row.approvals_required,
                             approvers=tuple(row.approvers), required_roles=(), required_count=1,
                             requester=row.user) is None


def answered_for(store: Any, action_hash: str) -> Any:
    """The request to present for a re-sent call: the newest granted, unconsumed, unexpired one,
    else the newest pending one (returned as is: the caller says it still waits), else the newest
    denied one (presented, so the kernel refuses it as denied), else None."""
    now = store.now()
    rows = list(reversed(store.approvals_for_hash(action_hash)))
    for row in rows:
        if (row.status == "granted" and row.consumed_at is None and row.expires_at > now and row.signature_ok
                and _verified_enough(row)):
            return row
    for row in rows:
        if row.status == "pending" and row.expires_at > now:
            return row
    for row in rows:
        if row.status == "denied" and row.signature_ok:
            return row
    return None
