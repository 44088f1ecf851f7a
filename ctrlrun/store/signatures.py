"""Signatures over the rows ctrlrun must trust: effect records, approvals, the chain head, checks,
delegations, budget charges and policy documents.

Each kind of row is signed in its own domain (a MAC made for one can never pass for another),
over the row's identity and every column a decision or a page reads, in one order for signing and
for checking. A row's identity is in what is signed, so a genuine row copied under another identity
does not verify (and where a copy could keep the identity, a unique column refuses it).
"""
from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Callable
from typing import Any

from .. import messages, signing
from ..canonical import GENESIS_HASH
from ..models import Approval, ChainCheck, Delivery, EffectRecord, LinkUse, PausedRun, PolicyDocument
from .base import alias, iso_text, text_digest

#: Signature domains: a MAC made for one kind of row can never pass for another.
HEAD_DOMAIN, EFFECT_DOMAIN = "ctrlrun.head/v1", "ctrlrun.effect/v1"
#: v1 signed an approval without its ``returned`` count (0017 re-signs the rows whose v1 signature holds);
#: v2 without its precondition fingerprint (0022 re-signs the rows whose v2 signature holds); v3 without
#: the roles and count it pins and who verified it (0025 re-signs the rows whose v3 signature holds).
APPROVAL_DOMAIN_V1, APPROVAL_DOMAIN_V2 = "ctrlrun.approval/v1", "ctrlrun.approval/v2"
APPROVAL_DOMAIN_V3, APPROVAL_DOMAIN = "ctrlrun.approval/v3", "ctrlrun.approval/v4"
#: v1 signed a check's content only, so a copy under a new id verified; v2 signs its ``nonce`` too.
CHECK_DOMAIN_V1, CHECK_DOMAIN = "ctrlrun.check/v1", "ctrlrun.check/v2"
DELEGATION_DOMAIN = "ctrlrun.delegation/v1"
#: v1 signed a charge without its place in its chain; v2 signs ``n`` and ``cum`` too (0026 re-signs).
LEDGER_DOMAIN_V1, LEDGER_DOMAIN = "ctrlrun.ledger/v1", "ctrlrun.ledger/v2"
POLICY_DOMAIN, PAUSED_DOMAIN = "ctrlrun.policy-document/v1", "ctrlrun.paused-run/v1"
DELIVERY_DOMAIN, LINK_USE_DOMAIN = "ctrlrun.delivery/v1", "ctrlrun.link-use/v1"
#: The head row's columns, in the order ``head_problem`` takes them.
HEAD_FIELDS = ("seq", "hash", "event_seq", "event_hash", "mac", "key_id")


def _effect_fields(key: str, action: str, state: str, action_id: str, attempt: int, lease: dt.datetime | None,
                   resolved_by: str | None, pending: str | None) -> tuple[Any, ...]:
    """What decides a record's fate, as signed, the action included: its name chooses the reconcile
    hook whose answer may license a retry. One order, for signing and for checking."""
    return (key, action, str(state), action_id, attempt, iso_text(lease), resolved_by, text_digest(pending))


def effect_mac(key: str, action: str, state: str, action_id: str, attempt: int, lease: dt.datetime | None,
               resolved_by: str | None, pending: str | None) -> str:
    return signing.sign(EFFECT_DOMAIN, _effect_fields(key, action, state, action_id, attempt, lease, resolved_by,
                                                      pending))


def effect_ok(row: Any) -> bool:
    """Whether an effect record (model or view) carries ctrlrun's signature of its deciding fields."""
    return effect_fields_ok(row.effect_key, row.action, row.state, row.action_id, row.attempt, row.lease_expires_at,
                            row.resolved_by, row.pending, row.mac)


def effect_fields_ok(key: Any, action: Any, state: Any, action_id: Any, attempt: Any, lease: Any, resolved_by: Any,
                     pending: Any, mac: str | None) -> bool:
    """The same, for the columns as read (a row too damaged to build its document from is not signed)."""
    try:
        fields = _effect_fields(key, action, state, action_id, attempt, lease, resolved_by, pending)
    except (TypeError, ValueError, AttributeError):
        return False
    return signing.is_valid(EFFECT_DOMAIN, fields, mac)


def approval_document(row: Approval) -> tuple:
    """An approval as signed (v4): v3's columns, the roles and the count it pins (policy v6) and its
    verified approvers, so a role dropped, a count lowered or an approver added in the database leaves
    the row unsigned (refused as ``tampered`` where it is used)."""
    return (*approval_document_v3(row), text_digest(row.required_roles), int(row.approvals_required),
            text_digest(row.approvers))


def approval_document_v3(row: Any) -> tuple:
    """v3: v2's columns and the fingerprint of the state the person saw (preconditions), so a request
    cannot be bound to another state, or to none, behind ctrlrun."""
    return (*approval_document_v2(row), row.precondition_fingerprint)


def approval_document_v2(row: Any) -> tuple:
    """v2: v1's columns and how many times it was given back, which only grows (the database refuses
    a consumed -> granted change that does not add exactly one), so a signed granted copy from before
    its last use is refused by the database, and a made-up one is unsigned."""
    return (*approval_document_v1(row), row.returned)


def approval_document_v1(row: Any) -> tuple:
    return (row.approval_id, str(row.status), row.action, row.action_id, row.action_hash, text_digest(row.action_json),
            row.agent, row.user, row.effect_key, row.policy_hash, iso_text(row.created_at), iso_text(row.expires_at),
            row.approver, row.note, iso_text(row.answered_at), iso_text(row.consumed_at), row.consumed_by)


def sign_approval(row: Approval) -> None:
    row.mac = signing.sign(APPROVAL_DOMAIN, approval_document(row))


def _signed_ok(domain: str, document: Callable[[Any], Any], row: Any) -> bool:
    """Whether ``row`` carries ctrlrun's signature over ``document(row)``; a row too damaged to build
    its document from does not."""
    try:
        fields = document(row)
    except (TypeError, ValueError, AttributeError):
        return False
    return signing.is_valid(domain, fields, row.mac)


def approval_ok(row: Approval) -> bool:
    return _signed_ok(APPROVAL_DOMAIN, approval_document, row)


def approval_signature_ok(row: Approval) -> bool:
    """Whether an approval row (as read by the ORM) carries ctrlrun's signature."""
    return approval_ok(row)


def effect_signature_ok(row: EffectRecord) -> bool:
    """Whether an effect record (as read by the ORM) carries ctrlrun's signature."""
    return effect_ok(row)


def head_document(seq: int, hash_: str, event_seq: int, event_hash_: str, key_id: str | None) -> tuple:
    return (seq, hash_, event_seq, event_hash_, key_id)


#: Head states this process signed or verified, with the alias they were read on: re-reading one
#: of them needs no new HMAC. A head state is only ever genuine or not, and the head never moves
#: back, so remembering is safe; two databases never share an entry.
_trusted_heads: collections.deque[tuple] = collections.deque(maxlen=16)


def trust_head(seq: int, hash_: str, event_seq: int, event_hash_: str, mac: str | None, key_id: str | None) -> None:
    """Remember a head state this process signed (or verified) on the current database."""
    _trusted_heads.append((alias(), seq, hash_, event_seq, event_hash_, mac, key_id))


def head_problem(seq: int, hash_: str, event_seq: int, event_hash_: str, mac: str | None,
                 key_id: str | None) -> str | None:
    """Why the head row cannot be trusted, or None. A fresh head (genesis, never signed) is fine."""
    if (alias(), seq, hash_, event_seq, event_hash_, mac, key_id) in _trusted_heads:
        return None
    fresh = seq == 0 and event_seq == 0 and hash_ == GENESIS_HASH and event_hash_ == GENESIS_HASH
    if mac is None and key_id is None and fresh:
        return None
    if signing.is_valid(HEAD_DOMAIN, head_document(seq, hash_, event_seq, event_hash_, key_id), mac):
        trust_head(seq, hash_, event_seq, event_hash_, mac, key_id)
        return None
    mine = signing.key_id()
    if key_id != mine:
        return messages.head_key_mismatch(key_id, mine, signing.key_source())
    return messages.head_unsigned(seq, event_seq)


def check_document(row: ChainCheck) -> tuple:
    """A recorded check as signed: its nonce (unique: a copy keeping it is refused by the database, a
    copy with another is not ctrlrun's), then its result and positions."""
    return (row.nonce, *_check_document_v1(row))


def _check_document_v1(row: ChainCheck) -> tuple:
    return (iso_text(row.checked_at), row.mode, row.from_receipt_seq, row.receipt_seq, row.receipt_hash,
            row.from_event_seq, row.event_seq, row.event_hash, bool(row.ok), row.breaks, row.receipts_checked,
            row.events_checked, row.signatures_checked, text_digest(row.summary), repr(float(row.duration_seconds)),
            row.ran_by)


def check_ok(row: ChainCheck) -> bool:
    return _signed_ok(CHECK_DOMAIN, check_document, row)


# --------------------------------------------------------------------------- delegations


def delegation_fields(ident: Any, parent_id: Any, depth: Any, grant_json: Any, agent: Any, by_agent: Any,
                      by_user: Any, via: Any, created_at: Any, revoked_at: Any, revoked_by: Any) -> tuple:
    """A delegation row as signed: every column the authority check and the console read."""
    return (ident, parent_id, depth, text_digest(grant_json), agent, by_agent, by_user, via, iso_text(created_at),
            iso_text(revoked_at), revoked_by)


def delegation_mac(*fields: Any) -> str:
    return signing.sign(DELEGATION_DOMAIN, delegation_fields(*fields))


def delegation_ok(fields: tuple, mac: str | None) -> bool:
    """Whether a delegation row (its columns in ``delegation_fields``' order) carries ctrlrun's signature."""
    try:
        document = delegation_fields(*fields)
    except (TypeError, ValueError, AttributeError):
        return False
    return signing.is_valid(DELEGATION_DOMAIN, document, mac)


# --------------------------------------------------------------------------- budget charges


def ledger_fields_v1(grant_id: Any, metric: Any, amount: Any, effect_key: Any, attempt: Any, consumed_at: Any,
                     released_at: Any) -> tuple:
    """A budget charge as v1 signed it (before 0026): what 0016 signed and 0026 checks before re-signing."""
    return (effect_key, attempt, grant_id, metric, amount, iso_text(consumed_at), iso_text(released_at))


def ledger_mac_v1(*fields: Any) -> str:
    return signing.sign(LEDGER_DOMAIN_V1, ledger_fields_v1(*fields))


def ledger_fields(grant_id: Any, metric: Any, amount: Any, effect_key: Any, attempt: Any, consumed_at: Any,
                  released_at: Any, n: Any, cum: Any) -> tuple:
    """A budget charge as signed. (effect_key, attempt, grant_id, metric) is its identity: the
    database keeps it unique, so a charge copied keeps no signature of its own. Its place in its
    (grant_id, metric)'s chain (``n``, the running total ``cum``) is what a budget check reads."""
    return (*ledger_fields_v1(grant_id, metric, amount, effect_key, attempt, consumed_at, released_at),
            int(n), int(cum))


def ledger_mac(*fields: Any) -> str:
    return signing.sign(LEDGER_DOMAIN, ledger_fields(*fields))


def ledger_ok(fields: tuple, mac: str | None, *, v1: bool = False) -> bool:
    """Whether a charge's columns (``ledger_fields``'s order; ``v1``: the seven v1 signed) carry ctrlrun's
    signature."""
    try:
        document = ledger_fields_v1(*fields) if v1 else ledger_fields(*fields)
    except (TypeError, ValueError, AttributeError):
        return False
    return signing.is_valid(LEDGER_DOMAIN_V1 if v1 else LEDGER_DOMAIN, document, mac)


# --------------------------------------------------------------------------- policy documents


def _policy_document(row: PolicyDocument) -> tuple:
    return (row.hash, row.schema, row.source, text_digest(row.text), row.environment, iso_text(row.first_seen))


def sign_policy_document(row: PolicyDocument) -> None:
    row.mac = signing.sign(POLICY_DOMAIN, _policy_document(row))


def policy_document_ok(row: PolicyDocument) -> bool:
    """Whether a stored policy text is one ctrlrun stored under that hash (a text the application's
    role inserted under a policy's hash before its first use is not)."""
    return _signed_ok(POLICY_DOMAIN, _policy_document, row)


# --------------------------------------------------------------------------- paused runs


def _paused_fields(row: PausedRun) -> tuple:
    """What a resume is made of, as signed (the request id is unique: it is the row's identity)."""
    return (row.approval_id, row.framework, text_digest(row.state), row.resume_with, iso_text(row.created_at))


def paused_mac(row: PausedRun) -> str:
    return signing.sign(PAUSED_DOMAIN, _paused_fields(row))


def paused_ok(row: PausedRun) -> bool:
    return _signed_ok(PAUSED_DOMAIN, _paused_fields, row)


# --------------------------------------------------------------------------- mail deliveries, link uses


def _delivery_fields(row: Delivery) -> tuple:
    """A delivery as signed: its identity (its link's nonce, and request + recipient, both unique: a copy
    keeping them is refused) and every column the page shows."""
    return (row.link_nonce, row.approval_id, row.recipient, row.address, row.basis, str(row.status), row.attempts,
            text_digest(row.last_error), iso_text(row.next_try), iso_text(row.created_at), iso_text(row.sent_at))


def sign_delivery(row: Delivery) -> None:
    row.mac = signing.sign(DELIVERY_DOMAIN, _delivery_fields(row))


def delivery_ok(row: Delivery) -> bool:
    return _signed_ok(DELIVERY_DOMAIN, _delivery_fields, row)


def _link_use_fields(row: LinkUse) -> tuple:
    return (row.nonce, row.approval_id, row.used_by, iso_text(row.used_at))


def sign_link_use(row: LinkUse) -> None:
    row.mac = signing.sign(LINK_USE_DOMAIN, _link_use_fields(row))


def link_use_ok(row: LinkUse) -> bool:
    return _signed_ok(LINK_USE_DOMAIN, _link_use_fields, row)


# --------------------------------------------------------------------------- continuations (spec A5)

CONTINUATION_DOMAIN = "ctrlrun.continuation/v1"


def _continuation_fields(row: Any) -> tuple:
    """Everything a resume reads: the key and attempt (the row's identity), the action id, the stashed
    call, the continuation's digest (None once taken), the round and when the suspension lapses."""
    return (row.effect_key, row.action_id, int(row.attempt), text_digest(row.action_json), row.continuation,
            int(row.rounds), iso_text(row.held_until))


def continuation_mac(row: Any) -> str:
    return signing.sign(CONTINUATION_DOMAIN, _continuation_fields(row))


def continuation_ok(row: Any) -> bool:
    return _signed_ok(CONTINUATION_DOMAIN, _continuation_fields, row)
