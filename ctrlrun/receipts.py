"""Receipt documents and the hash chain that links them: build, hash, verify.

Pure: standard library only. A receipt is a ``ctrlrun.receipt/v7`` document with a fixed key
order. Its hash is taken over the canonical (sorted) bytes of the document, so the stored JSON
can keep the readable key order while the hash stays independent of it. Each receipt carries
the hash of the one before it (``prev_hash``) and its position (``seq``), so an edited,
removed or reordered row shows up as a named break.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .canonical import GENESIS_HASH, canonical_bytes, sha256_hash, trusted_canonical_bytes

__all__ = [
    "RECEIPT_SCHEMA",
    "RECEIPT_KEYS",
    "build_receipt",
    "receipt_hash",
    "dump_receipt",
    "StoredReceipt",
    "ChainBreak",
    "ChainReport",
    "verify_chain",
]

RECEIPT_SCHEMA = "ctrlrun.receipt/v7"

#: The 34 keys of a receipt, in the order they are stored and printed.
RECEIPT_KEYS: tuple[str, ...] = (
    "schema", "receipt_id", "action_id", "action", "action_hash", "principal", "resource",
    "arguments", "environment", "decision", "decision_reason", "approval_id", "approver",
    "effect_key", "attempt", "result", "execution", "would_have", "error", "started_at",
    "finished_at", "seq", "prev_hash", "policy_hash", "policy_version", "controls",
    "precondition_at_request", "precondition_at_recheck", "approvers", "authority_grant_id",
    "task", "scope_hash", "budget_charges", "hop",
)
_LIST_KEYS = frozenset({"controls", "approvers", "budget_charges"})


def build_receipt(**values: Any) -> dict[str, Any]:
    """A receipt document with every key present, in order; unknown keys are a bug."""
    unknown = set(values) - set(RECEIPT_KEYS)
    if unknown:
        raise TypeError(f"not receipt keys: {sorted(unknown)}")
    doc = {key: ([] if key in _LIST_KEYS else None) for key in RECEIPT_KEYS}
    doc.update(values)
    doc["schema"] = RECEIPT_SCHEMA
    return doc


def receipt_hash(doc: dict[str, Any], *, trusted: bool = False) -> str:
    """The chain hash of a receipt document (the document itself carries no ``hash``).

    ``trusted`` skips re-validating a document this process just built from checked values; a
    document read back from the store is always validated.
    """
    return sha256_hash(trusted_canonical_bytes(doc) if trusted else canonical_bytes(doc))


def dump_receipt(doc: dict[str, Any]) -> str:
    """The stored/printed JSON: key order kept, compact, raw UTF-8."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class StoredReceipt:
    """One receipt row as the store holds it, for verification."""

    receipt_id: str
    seq: int | None
    prev_hash: str | None
    hash: str | None
    document: str
    #: The row's other columns that repeat a document field (``result``, ``agent``, ...), which
    #: lists and filters read: each must agree with the hashed document.
    columns: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class ChainBreak:
    name: str  # missing | content_altered | hash_missing | link_broken | head_mismatch | unchained
    seq: int | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seq": self.seq, "detail": self.detail}


@dataclass
class ChainReport:
    verified: int = 0
    chained: int = 0
    unchained: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    breaks: list[ChainBreak] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.breaks

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "verified": self.verified,
            "chained": self.chained,
            "unchained": self.unchained,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
            "breaks": [b.as_dict() for b in self.breaks],
        }


def _short(value: str | None) -> str:
    return "null" if value is None else value


def verify_chain(rows: Iterable[StoredReceipt], head_seq: int, head_hash: str) -> ChainReport:
    """Walk receipts in ``seq`` order and name every break.

    ``rows`` may come in any order. Each row's document is re-hashed and compared with its
    stored hash, and each ``prev_hash`` with the recomputed hash of the row before it, so an
    edit is caught even when the editor also rewrote the stored hash.
    """
    report = ChainReport(head_seq=head_seq, head_hash=head_hash)
    chained: list[StoredReceipt] = []
    for row in rows:
        if row.seq is None:
            report.unchained += 1
            report.breaks.append(
                ChainBreak("unchained", None, f"receipt {row.receipt_id} has no seq: it was never linked into the chain")
            )
        else:
            chained.append(row)
    chained.sort(key=lambda r: r.seq)  # type: ignore[arg-type, return-value]
    report.chained = len(chained)

    expected_seq = 1
    previous_hash = GENESIS_HASH  # the recomputed hash of the row before, as far as we know
    for row in chained:
        seq = row.seq
        assert seq is not None
        if seq != expected_seq:
            report.breaks.append(
                ChainBreak(
                    "missing",
                    expected_seq,
                    f"seq {expected_seq} is not here; the next receipt says it is seq {seq}. "
                    f"The walk resynchronises at seq {seq}",
                )
            )
        row_ok = True
        try:
            doc = json.loads(row.document)
            if not isinstance(doc, dict):
                raise ValueError("the document is not a JSON object")
            recomputed = receipt_hash(doc)
        except Exception as exc:  # any unreadable row is a named break, never a crash
            report.breaks.append(
                ChainBreak("content_altered", seq, f"this row could not be read ({type(exc).__name__})")
            )
            previous_hash = row.hash or ""
            expected_seq = seq + 1
            continue
        if row.hash is None or row.hash == "":
            row_ok = False
            report.breaks.append(
                ChainBreak("hash_missing", seq, "the stored hash is gone, so nothing vouches for this row")
            )
        elif recomputed != row.hash:
            row_ok = False
            report.breaks.append(
                ChainBreak(
                    "content_altered",
                    seq,
                    f"the recomputed hash {recomputed} is not the stored {row.hash}",
                )
            )
        for column, value in row.columns:
            documented = doc["principal"].get("agent") if column == "agent" and isinstance(
                doc.get("principal"), dict) else doc.get(column)
            if value != documented:
                row_ok = False
                report.breaks.append(
                    ChainBreak(
                        "content_altered",
                        seq,
                        f"the row's {column} column says {value!r}, but its hashed document says {documented!r}",
                    )
                )
        if doc.get("seq") != seq or doc.get("prev_hash") != row.prev_hash:
            row_ok = False
            report.breaks.append(
                ChainBreak(
                    "content_altered",
                    seq,
                    "the row's seq/prev_hash columns disagree with the document it stores",
                )
            )
        if row.prev_hash != previous_hash:
            row_ok = False
            report.breaks.append(
                ChainBreak(
                    "link_broken",
                    seq,
                    f"prev_hash is {_short(row.prev_hash)}, and the receipt before it hashes to {previous_hash}",
                )
            )
        if row_ok:
            report.verified += 1
        previous_hash = recomputed
        expected_seq = seq + 1

    last_seq = chained[-1].seq if chained else 0
    if last_seq != head_seq or (chained and previous_hash != head_hash) or (not chained and head_hash != GENESIS_HASH):
        report.breaks.append(
            ChainBreak(
                "head_mismatch",
                head_seq,
                f"the chain head says seq {head_seq} with hash {head_hash}, but the last receipt "
                f"is seq {last_seq} hashing to {previous_hash}",
            )
        )
    return report
