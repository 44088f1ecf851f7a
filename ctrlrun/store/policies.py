"""Policy documents: each policy a process decides by is stored once, by its hash.

The per-process cache of what is already stored is keyed by database alias, so a policy stored
on one database is never taken as stored on another.
"""
from __future__ import annotations

from .. import messages
from ..errors import EvidenceTampered
from ..models import ChainHead, PolicyDocument
from .base import _db, _phase, _q
from .signatures import HEAD_FIELDS, _head_problem

#: (alias, policy hash) pairs stored (or found stored) by this process.
_known_policies: set[tuple[str, str]] = set()


def forget_known_policies() -> None:
    """Forget what this process stored (a new policy file, a flushed test database)."""
    _known_policies.clear()


def ensure_policy(policy_hash: str, schema: str, source: str, text: str, environment: str) -> None:
    """Store the policy document once (per process and database, the first time it decides anything),
    and make sure this process signs with the store's key before it acts at all."""
    known = (_db(), policy_hash)
    if known in _known_policies:
        return
    with _phase() as when:
        _q(PolicyDocument).get_or_create(
            hash=policy_hash,
            defaults={"schema": schema, "source": source, "text": text, "environment": environment,
                      "first_seen": when},
        )
        head = _q(ChainHead).filter(pk=1).values_list(*HEAD_FIELDS).first()
        problem = _head_problem(*head) if head is not None else None
        if problem is not None:
            raise EvidenceTampered(messages.refuses_to_act(problem, restore=False))
    _known_policies.add(known)
