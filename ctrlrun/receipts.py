"""Receipt and event documents and the hash chains that link them: build, hash, verify.

Pure: standard library only. A receipt is a ``ctrlrun.receipt/v7`` document with a fixed key
order. Its hash is taken over the canonical (sorted) bytes of the document, so the stored JSON
can keep the readable key order while the hash stays independent of it. Each receipt carries
the hash of the one before it (``prev_hash``) and its position (``seq``), so an edited,
removed or reordered row shows up as a named break.

Events form a second chain of the same shape. An event's hashed document (``ctrlrun.event/v1``)
is built from the row's own columns (time to the microsecond, type, the ids, the data exactly as
stored), so every column a person reads is covered, and the row needs no stored copy of it.
"""
from __future__ import annotations

import datetime as _datetime
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .canonical import GENESIS_HASH, canonical_bytes, sha256_hash, trusted_canonical_bytes
from .errors import CTRLRunError

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
    "EVENT_SCHEMA",
    "event_time",
    "event_document",
    "event_hash",
    "StoredEvent",
    "verify_events",
    "ReceiptWalk",
    "EventWalk",
    "PROGRESS_EVERY",
]

#: How many rows a walk re-hashes between two progress reports (``progress`` callbacks).
PROGRESS_EVERY = 100_000

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


#: Built once: json.dumps with non-default options builds a new encoder on every call.
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dump_receipt(doc: dict[str, Any]) -> str:
    """The stored/printed JSON: key order kept, compact, raw UTF-8."""
    return _COMPACT.encode(doc)


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
    """One thing verification found wrong.

    ``kind`` says which evidence: ``receipt`` (``seq`` is the receipt's), ``event`` (``seq`` is the
    event chain's), ``head`` (the chain head row), ``approval``, ``effect``, ``delegation``, ``ledger``
    (a budget charge), ``policy`` (a stored policy text) or ``paused`` (a paused run): a signed row, named by ``subject``;
    ``check`` (a recorded chain check). ``name`` is one of missing, content_altered, hash_missing, link_broken,
    head_mismatch, unchained, reordered, duplicate, signature_invalid, unresolved (a break a recorded check found, carried by an incremental check until a full one is intact), rewound (a signed row put back
    from before what the event chain records).
    """

    name: str
    seq: int | None
    detail: str
    kind: str = "receipt"
    subject: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "seq": self.seq, "detail": self.detail, "kind": self.kind,
                "subject": self.subject}


@dataclass
class ChainReport:
    verified: int = 0
    chained: int = 0
    unchained: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    breaks: list[ChainBreak] = field(default_factory=list)
    events_verified: int = 0
    events_chained: int = 0
    events_unchained: int = 0
    event_head_seq: int = 0
    event_head_hash: str = GENESIS_HASH
    #: Signed rows checked (the head, approvals, effect records); None when nothing was checked.
    signatures_checked: int | None = None
    #: ``full`` (everything, from the genesis) or ``incremental`` (after the last intact check's
    #: position: ``from_seq``/``from_event_seq``, recorded by check ``from_check``).
    mode: str = "full"
    from_seq: int = 0
    from_event_seq: int = 0
    from_check: int | None = None

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
            "events": {
                "verified": self.events_verified,
                "chained": self.events_chained,
                "unchained": self.events_unchained,
                "head_seq": self.event_head_seq,
                "head_hash": self.event_head_hash,
            },
            "signatures_checked": self.signatures_checked,
            **({"mode": self.mode, "from": {"check": self.from_check, "seq": self.from_seq,
                                            "event_seq": self.from_event_seq}}
               if self.mode != "full" else {}),
        }


def _short(value: str | None) -> str:
    return "null" if value is None else value


#: Receipt columns whose value is a field of the document under another name.
_COLUMN_FIELD = {"ts": "finished_at"}


def _documented(doc: dict[str, Any], column: str) -> Any:
    """The document's value for an index column (``agent`` is principal.agent, ``ts`` finished_at)."""
    if column == "agent":
        principal = doc.get("principal")
        return principal.get("agent") if isinstance(principal, dict) else None
    return doc.get(_COLUMN_FIELD.get(column, column))


#: The index columns a receipt row repeats from its hashed document (what lists filter and show).
INDEXED_COLUMNS = ("receipt_id", "action_id", "action", "agent", "decision", "result", "effect_key")


def row_problem(document: str, stored_hash: str | None, columns: dict[str, Any]) -> str | None:
    """Why one stored receipt row is not what ctrlrun wrote, or None: its document does not
    re-hash to its stored hash, or a column beside it says something else than the document.
    (The chain check says the same and more; this is for showing one row.)"""
    try:
        doc = json.loads(document)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        recomputed = receipt_hash(doc)
    except (ValueError, TypeError, CTRLRunError) as exc:
        return f"its document cannot be read ({type(exc).__name__})"
    if recomputed != stored_hash:
        return "its document does not re-hash to its stored hash"
    changed = [c for c in INDEXED_COLUMNS if c in columns and columns[c] != _documented(doc, c)]
    if changed:
        return f"its {', '.join(changed)} column{'s' if len(changed) > 1 else ''} disagree{'' if len(changed) > 1 else 's'} with its hashed document"
    return None


def verify_chain(rows: Iterable[StoredReceipt], head_seq: int, head_hash: str, *,
                 progress: Callable[[int], None] | None = None) -> ChainReport:
    """Walk receipts in ``seq`` order and name every break.

    ``rows`` may come in any order. Each row's document is re-hashed and compared with its
    stored hash, and each ``prev_hash`` with the recomputed hash of the row before it, so an
    edit is caught even when the editor also rewrote the stored hash.
    """
    report = ChainReport(head_seq=head_seq, head_hash=head_hash)
    _walk_all(ReceiptWalk(report), rows, lambda r: r.seq, head_seq, head_hash, progress)
    return report


def _walk_all(walk: Any, rows: Iterable[Any], order: Callable[[Any], Any], head_seq: int, head_hash: str,
              progress: Callable[[int], None] | None) -> None:
    """Feed ``walk`` (a ReceiptWalk or an EventWalk) every row: those with no seq first, as unchained,
    then the rest in ``order``; then finish it at the head."""
    chained = []
    for row in rows:
        if row.seq is None:
            walk.unchained(row)
        else:
            chained.append(row)
    chained.sort(key=order)
    for done, row in enumerate(chained, 1):
        walk.add(row)
        if progress is not None and done % PROGRESS_EVERY == 0:
            progress(done)
    walk.finish(head_seq, head_hash)


class ReceiptWalk:
    """The receipt walk of :func:`verify_chain`, fed one row at a time in ``seq`` order, so a long
    chain can be read in batches; ``start_seq``/``start_hash`` begin it after a position already
    verified (an incremental check) instead of at the genesis."""

    def __init__(self, report: ChainReport, start_seq: int = 0, start_hash: str = GENESIS_HASH) -> None:
        self.report = report
        self.expected_seq = start_seq + 1
        self.previous_hash = start_hash  # the recomputed hash of the row before, as far as we know
        self.start_seq, self.start_hash = start_seq, start_hash
        self.last_seq: int | None = None

    def unchained(self, row: StoredReceipt) -> None:
        self.report.unchained += 1
        self.report.breaks.append(
            ChainBreak("unchained", None, f"receipt {row.receipt_id} has no seq: it was never linked into the chain")
        )

    def add(self, row: StoredReceipt) -> None:
        report = self.report
        report.chained += 1
        seq = row.seq
        assert seq is not None
        self.last_seq = seq
        if seq != self.expected_seq:
            report.breaks.append(
                ChainBreak(
                    "missing",
                    self.expected_seq,
                    f"seq {self.expected_seq} is not here; the next receipt says it is seq {seq}. "
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
            self.previous_hash = row.hash or ""
            self.expected_seq = seq + 1
            return
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
            documented = _documented(doc, column)
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
        if row.prev_hash != self.previous_hash:
            row_ok = False
            report.breaks.append(
                ChainBreak(
                    "link_broken",
                    seq,
                    f"prev_hash is {_short(row.prev_hash)}, and the receipt before it hashes to {self.previous_hash}",
                )
            )
        if row_ok:
            report.verified += 1
        self.previous_hash = recomputed
        self.expected_seq = seq + 1

    def finish(self, head_seq: int, head_hash: str) -> None:
        walked = self.last_seq is not None
        last_seq = self.last_seq if walked else self.start_seq
        previous_hash = self.previous_hash
        if last_seq != head_seq or (walked and previous_hash != head_hash) or (
                not walked and head_hash != self.start_hash):
            self.report.breaks.append(
                ChainBreak(
                    "head_mismatch",
                    head_seq,
                    f"the chain head says seq {head_seq} with hash {head_hash}, but the last receipt "
                    f"is seq {last_seq} hashing to {previous_hash}",
                )
            )


# --------------------------------------------------------------------------- events

EVENT_SCHEMA = "ctrlrun.event/v1"
_UTC = _datetime.timezone.utc


_recent_times: dict[Any, str] = {}


def event_time(moment: Any) -> str:
    """An event's time as hashed: UTC, to the microsecond, always six digits.

    A phase stamps many rows with the same moment, so the last few renderings are kept.
    """
    text = _recent_times.get(moment)
    if text is None:
        if len(_recent_times) > 8:
            _recent_times.clear()
        text = _recent_times[moment] = moment.astimezone(_UTC).isoformat(timespec="microseconds")
    return text


def event_document(seq: int, prev_hash: str, ts: str, type_: str, action_id: str | None, effect_key: str | None,
                   approval_id: str | None, data: str) -> list[Any]:
    """The hashed form of one event row: its columns in a fixed order, ``ts`` from :func:`event_time`
    and ``data`` the column's JSON text exactly as stored (so any change to it, even of spacing, shows)."""
    return [EVENT_SCHEMA, seq, prev_hash, ts, type_, action_id, effect_key, approval_id, data]


def event_hash(doc: list[Any]) -> str:
    """``sha256:`` over the compact JSON array of :func:`event_document`."""
    return sha256_hash(_COMPACT.encode(doc).encode("utf-8"))


@dataclass(frozen=True)
class StoredEvent:
    """One event row as the store holds it (``data`` is the column's JSON text)."""

    id: int
    seq: int | None
    prev_hash: str | None
    hash: str | None
    ts: Any  # an aware datetime
    type: str
    action_id: str | None
    effect_key: str | None
    approval_id: str | None
    data: str


def verify_events(rows: Iterable[StoredEvent], head_seq: int, head_hash: str, report: ChainReport, *,
                  progress: Callable[[int], None] | None = None) -> None:
    """Walk the events in ``seq`` order, re-hash each from its columns, record breaks in ``report``.

    Beyond the receipt checks, event ids must rise with ``seq``: the console and ``inspect`` list
    events by id, so an event moved to another place in that order is named ``reordered``.
    """
    report.event_head_seq, report.event_head_hash = head_seq, head_hash
    _walk_all(EventWalk(report), rows, lambda r: (r.seq, r.id), head_seq, head_hash, progress)


class EventWalk:
    """The event walk of :func:`verify_events`, fed one row at a time in ``(seq, id)`` order;
    ``start_seq``/``start_hash``/``start_id`` begin it after a verified position."""

    def __init__(self, report: ChainReport, start_seq: int = 0, start_hash: str = GENESIS_HASH,
                 start_id: int | None = None) -> None:
        self.report = report
        self.expected_seq, self.previous_hash, self.previous_id = start_seq + 1, start_hash, start_id
        self.start_seq, self.start_hash = start_seq, start_hash
        self.last_seq: int | None = None

    def unchained(self, row: StoredEvent) -> None:
        self.report.events_unchained += 1
        self.report.breaks.append(ChainBreak("unchained", None, f"event {row.id} ({row.type}) has no seq: it was "
                                             f"never linked into the event chain", kind="event", subject=str(row.id)))

    def add(self, row: StoredEvent) -> None:
        report = self.report
        report.events_chained += 1
        seq = row.seq
        assert seq is not None
        self.last_seq = seq
        if seq < self.expected_seq:  # a second row claiming a position already walked: it is not the chain's
            report.breaks.append(ChainBreak(
                "duplicate", seq, f"event {row.id} ({row.type}) claims seq {seq}, which another event holds: it was "
                f"added outside ctrlrun", kind="event", subject=str(row.id)))
            return
        if seq != self.expected_seq:
            report.breaks.append(ChainBreak(
                "missing", self.expected_seq, f"event seq {self.expected_seq} is not here; the next event says it is "
                f"seq {seq}. The walk resynchronises at seq {seq}", kind="event"))
        ok = True
        try:
            recomputed = event_hash(event_document(seq, row.prev_hash or "", event_time(row.ts), row.type,
                                                   row.action_id, row.effect_key, row.approval_id, row.data))
        except Exception as exc:  # an unreadable row is a named break, never a crash
            report.breaks.append(ChainBreak("content_altered", seq, f"event {row.id} could not be read "
                                            f"({type(exc).__name__})", kind="event", subject=str(row.id)))
            self.previous_hash, self.expected_seq, self.previous_id = row.hash or "", seq + 1, row.id
            return
        if not row.hash:
            ok = False
            report.breaks.append(ChainBreak("hash_missing", seq, f"event {row.id}'s stored hash is gone, so nothing "
                                            f"vouches for it", kind="event", subject=str(row.id)))
        elif recomputed != row.hash:
            ok = False
            report.breaks.append(ChainBreak(
                "content_altered", seq, f"event {row.id} ({row.type}) recomputes to {recomputed}, not the stored "
                f"{row.hash}: a column was changed after it was written", kind="event", subject=str(row.id)))
        if row.prev_hash != self.previous_hash:
            ok = False
            report.breaks.append(ChainBreak(
                "link_broken", seq, f"event {row.id}'s prev_hash is {_short(row.prev_hash)}, and the event before it "
                f"hashes to {self.previous_hash}", kind="event", subject=str(row.id)))
        if self.previous_id is not None and row.id <= self.previous_id:
            ok = False
            report.breaks.append(ChainBreak(
                "reordered", seq, f"event {row.id} is at seq {seq} but its id places it before event "
                f"{self.previous_id}", kind="event", subject=str(row.id)))
        if ok:
            report.events_verified += 1
        self.previous_hash, self.expected_seq, self.previous_id = recomputed, seq + 1, row.id

    def finish(self, head_seq: int, head_hash: str) -> None:
        walked = self.last_seq is not None
        last_seq = self.last_seq if walked else self.start_seq
        if last_seq != head_seq or (walked and self.previous_hash != head_hash) or (
                not walked and head_hash != self.start_hash):
            self.report.breaks.append(ChainBreak(
                "head_mismatch", head_seq, f"the chain head says event seq {head_seq} with hash {head_hash}, but the "
                f"last event is seq {last_seq} hashing to {self.previous_hash}", kind="event"))
