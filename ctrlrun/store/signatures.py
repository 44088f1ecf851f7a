"""Signatures over the rows ctrlrun must trust: effect records, approvals, the chain head, checks.

Each kind of row is signed in its own domain (a MAC made for one can never pass for another),
over the fields that decide its fate, in one order for signing and for checking.
"""
from __future__ import annotations

import collections
import datetime as dt
from collections.abc import Callable
from typing import Any

from .. import messages, signing
from ..canonical import GENESIS_HASH
from ..models import Approval, ChainCheck, EffectRecord
from .base import _db, _digest, _iso

#: Signature domains: a MAC made for one kind of row can never pass for another.
HEAD_DOMAIN, EFFECT_DOMAIN, APPROVAL_DOMAIN = "ctrlrun.head/v1", "ctrlrun.effect/v1", "ctrlrun.approval/v1"
CHECK_DOMAIN = "ctrlrun.check/v1"
#: The head row's columns, in the order ``_head_problem`` takes them.
HEAD_FIELDS = ("seq", "hash", "event_seq", "event_hash", "mac", "key_id")


def _effect_fields(key: str, action: str, state: str, action_id: str, attempt: int, lease: dt.datetime | None,
                   resolved_by: str | None, pending: str | None) -> tuple[Any, ...]:
    """What decides a record's fate, as signed, the action included: its name chooses the reconcile
    hook whose answer may license a retry. One order, for signing and for checking."""
    return (key, action, str(state), action_id, attempt, _iso(lease), resolved_by, _digest(pending))


def _effect_mac(key: str, action: str, state: str, action_id: str, attempt: int, lease: dt.datetime | None,
                resolved_by: str | None, pending: str | None) -> str:
    return signing.sign(EFFECT_DOMAIN, _effect_fields(key, action, state, action_id, attempt, lease, resolved_by,
                                                      pending))


def _effect_ok(row: Any) -> bool:
    """Whether an effect record (model or peek) carries ctrlrun's signature of its deciding fields."""
    return _signed_ok(EFFECT_DOMAIN, lambda r: _effect_fields(
        r.effect_key, r.action, r.state, r.action_id, r.attempt, r.lease_expires_at, r.resolved_by, r.pending), row)


def _approval_document(row: Approval) -> tuple:
    return (row.approval_id, str(row.status), row.action, row.action_id, row.action_hash, _digest(row.action_json),
            row.agent, row.user, row.effect_key, row.policy_hash, _iso(row.created_at), _iso(row.expires_at),
            row.approver, row.note, _iso(row.answered_at), _iso(row.consumed_at), row.consumed_by)


def _sign_approval(row: Approval) -> None:
    row.mac = signing.sign(APPROVAL_DOMAIN, _approval_document(row))


def _signed_ok(domain: str, document: Callable[[Any], Any], row: Any) -> bool:
    """Whether ``row`` carries ctrlrun's signature over ``document(row)``; a row too damaged to build
    its document from does not."""
    try:
        fields = document(row)
    except (TypeError, ValueError, AttributeError):
        return False
    return signing.is_valid(domain, fields, row.mac)


def _approval_ok(row: Approval) -> bool:
    return _signed_ok(APPROVAL_DOMAIN, _approval_document, row)


def approval_signature_ok(row: Approval) -> bool:
    """Whether an approval row (as read by the ORM) carries ctrlrun's signature."""
    return _approval_ok(row)


def effect_signature_ok(row: EffectRecord) -> bool:
    """Whether an effect record (as read by the ORM) carries ctrlrun's signature."""
    return _effect_ok(row)


def _head_document(seq: int, hash_: str, event_seq: int, event_hash_: str, key_id: str | None) -> tuple:
    return (seq, hash_, event_seq, event_hash_, key_id)


#: Head states this process signed or verified, with the alias they were read on: re-reading one
#: of them needs no new HMAC. A head state is only ever genuine or not, and the head never moves
#: back, so remembering is safe; two databases never share an entry.
_trusted_heads: collections.deque[tuple] = collections.deque(maxlen=16)


def _trust_head(seq: int, hash_: str, event_seq: int, event_hash_: str, mac: str | None, key_id: str | None) -> None:
    """Remember a head state this process signed (or verified) on the current database."""
    _trusted_heads.append((_db(), seq, hash_, event_seq, event_hash_, mac, key_id))


def _head_problem(seq: int, hash_: str, event_seq: int, event_hash_: str, mac: str | None,
                  key_id: str | None) -> str | None:
    """Why the head row cannot be trusted, or None. A fresh head (genesis, never signed) is fine."""
    if (_db(), seq, hash_, event_seq, event_hash_, mac, key_id) in _trusted_heads:
        return None
    fresh = seq == 0 and event_seq == 0 and hash_ == GENESIS_HASH and event_hash_ == GENESIS_HASH
    if mac is None and key_id is None and fresh:
        return None
    if signing.is_valid(HEAD_DOMAIN, _head_document(seq, hash_, event_seq, event_hash_, key_id), mac):
        _trust_head(seq, hash_, event_seq, event_hash_, mac, key_id)
        return None
    mine = signing.key_id()
    if key_id != mine:
        return messages.head_key_mismatch(key_id, mine, signing.key_source())
    return messages.head_unsigned(seq, event_seq)


def _check_document(row: ChainCheck) -> tuple:
    return (_iso(row.checked_at), row.mode, row.from_receipt_seq, row.receipt_seq, row.receipt_hash,
            row.from_event_seq, row.event_seq, row.event_hash, bool(row.ok), row.breaks, row.receipts_checked,
            row.events_checked, row.signatures_checked, _digest(row.summary), repr(float(row.duration_seconds)),
            row.ran_by)


def _check_ok(row: ChainCheck) -> bool:
    return _signed_ok(CHECK_DOMAIN, _check_document, row)
