"""Policy documents: each policy a process decides by is stored once, by its hash.

The per-process cache of what is already stored is keyed by database alias, so a policy stored
on one database is never taken as stored on another.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction

from .. import messages
from ..errors import EvidenceTampered
from ..models import ChainHead, PolicyDocument
from ..values import PolicyDocumentView
from .base import alias, objects, reading, write_phase
from .signatures import HEAD_FIELDS, head_problem, policy_document_ok, sign_policy_document

#: (alias, policy hash) pairs stored (or found stored) by this process.
_known_policies: set[tuple[str, str]] = set()


def forget_known_policies() -> None:
    """Forget what this process stored (a new policy file, a flushed test database)."""
    _known_policies.clear()


def ensure_policy(policy_hash: str, schema: str, source: str, text: str, environment: str) -> None:
    """Store the policy document once (per process and database, the first time it decides anything),
    and make sure this process signs with the store's key before it acts at all."""
    known = (alias(), policy_hash)
    if known in _known_policies:
        return
    with write_phase() as when:
        # The head first: a process holding another key finds every signature wrong, and the key is the cause.
        head = objects(ChainHead).filter(pk=1).values_list(*HEAD_FIELDS).first()
        problem = head_problem(*head) if head is not None else None
        if problem is not None:
            raise EvidenceTampered(messages.refuses_to_act(problem, restore=False))
        row = objects(PolicyDocument).filter(pk=policy_hash).first()
        if row is None:
            row = PolicyDocument(hash=policy_hash, schema=schema, source=source, text=text, environment=environment,
                                 first_seen=when)
            sign_policy_document(row)
            try:
                with transaction.atomic(using=alias()):  # a savepoint: losing the race leaves the phase usable
                    row.save(using=alias(), force_insert=True)
            except IntegrityError:
                # Another process stored this hash first (on PostgreSQL both saw none): judge its row.
                row = objects(PolicyDocument).filter(pk=policy_hash).first()
                if row is None:
                    raise
        if not policy_document_ok(row):  # (another text of the same hash, differing in comments, is fine)
            # Stored under this policy's hash by someone else (the application's database role, before
            # the policy's first use): a page would show that text as the rules that decided.
            raise EvidenceTampered(messages.refuses_to_act(messages.policy_document_forged(policy_hash)))
    _known_policies.add(known)


def policy_document(policy_hash: str | None) -> PolicyDocumentView | None:
    """The stored text of a policy, when ctrlrun stored it (its signature holds); None when there is
    none, or when the row under that hash is not ctrlrun's (``policy_document_forged`` says so)."""
    if not policy_hash:
        return None
    with reading():
        row = objects(PolicyDocument).filter(pk=policy_hash).first()
    if row is None or not policy_document_ok(row):
        return None
    return PolicyDocumentView(row.hash, row.schema, row.source, row.text, row.environment, row.first_seen)


def policy_document_forged(policy_hash: str | None) -> bool:
    """Whether a row is stored under ``policy_hash`` that ctrlrun did not store (its signature fails)."""
    if not policy_hash:
        return False
    with reading():
        row = objects(PolicyDocument).filter(pk=policy_hash).first()
    return row is not None and not policy_document_ok(row)
