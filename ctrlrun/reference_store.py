"""A store written by the reference implementation (PyPI ``ctrlrun`` up to 0.12.2), read and verified.

``import`` (docs/importing.md) reads such a store before anything is written into ours: its receipts
of every schema it ever wrote (``ctrlrun.receipt/v1`` … ``v7``, each hashed under its own key set),
its chain walked by ``seq`` from the genesis to its head row, and its effect records. The file is
opened read-only (SQLite's ``mode=ro``): reading it changes nothing, and a reference process still
writing to it is seen, not disturbed. Nothing here touches ctrlrun's own database.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .canonical import GENESIS_HASH, canonical_bytes, sha256_hash

#: ``ctrlrun.receipt/v7``'s 34 keys, in the reference's order.
V7_KEYS = (
    "schema", "receipt_id", "action_id", "action", "action_hash", "principal", "resource", "arguments",
    "environment", "decision", "decision_reason", "approval_id", "approver", "effect_key", "attempt", "result",
    "execution", "would_have", "error", "started_at", "finished_at", "seq", "prev_hash", "policy_hash",
    "policy_version", "controls", "precondition_at_request", "precondition_at_recheck", "approvers",
    "authority_grant_id", "task", "scope_hash", "budget_charges", "hop")
#: What each schema added to the one before it.
_ADDED = {2: {"execution", "would_have"}, 3: {"seq", "prev_hash", "policy_hash", "policy_version", "controls"},
          4: {"precondition_at_request", "precondition_at_recheck"}, 5: {"approvers", "authority_grant_id"},
          6: {"task", "scope_hash", "budget_charges"}, 7: {"hop"}}


def _key_sets() -> dict[str, frozenset[str]]:
    sets, keys = {}, set(V7_KEYS)
    for version in range(7, 0, -1):
        sets[f"ctrlrun.receipt/v{version}"] = frozenset(keys)
        keys -= _ADDED.get(version, set())
    return sets


#: Each known schema's key set: a document is hashed, and accepted, only under its own.
KNOWN_RECEIPT_SCHEMAS: dict[str, frozenset[str]] = _key_sets()
#: The effect states a reference store holds, and what each becomes here (executing: nobody knows).
STATES = {"committed": "committed", "failed": "failed", "ambiguous": "ambiguous", "executing": "ambiguous"}
#: Ours hold an effect key of at most this many characters, an action id of at most this many.
MAX_KEY, MAX_ID = 1024, 36
#: The highest attempt number imported (a record is brought to its attempt one retry at a time).
MAX_ATTEMPT = 1000


#: Tables only a store written by the reference has, together (``effects`` holding ``effect_key``).
REFERENCE_TABLES = frozenset({"effects", "receipts", "receipt_chain"})


def holds_reference_tables(connection: Any) -> bool:
    """Whether the database behind a Django ``connection`` holds the reference's store."""
    names = set(connection.introspection.table_names())
    if not REFERENCE_TABLES <= names:
        return False
    with connection.cursor() as cursor:
        columns = {c.name for c in connection.introspection.get_table_description(cursor, "effects")}
    return "effect_key" in columns


class NotAReferenceStore(Exception):
    """The file is not a store the reference wrote (or cannot be read as one)."""


@dataclasses.dataclass(frozen=True)
class SourceReceipt:
    seq: int | None
    receipt_id: str
    schema: str
    hash: str | None
    prev_hash: str | None
    text: str  # the stored JSON, byte for byte


@dataclasses.dataclass(frozen=True)
class SourceEffect:
    effect_key: str
    state: str  # the reference's
    action: str | None  # the action of the receipts or events of its action id; None: not found
    action_id: str
    attempt: int
    lease_expires_at: str | None
    result_json: str | None
    error: str | None
    resolved_by: str | None


@dataclasses.dataclass
class SourceReport:
    """What the source holds and whether its chain verifies (``breaks`` empty)."""

    path: str
    versions: list[str]
    receipts: list[SourceReceipt]
    effects: list[SourceEffect]
    head_seq: int
    head_hash: str
    schemas: dict[str, int]
    unchained: int
    #: Where the chain starts: the genesis (0), or the reference's prune checkpoint (seq, hash).
    start: tuple[int, str] = (0, GENESIS_HASH)
    verified: int = 0
    breaks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    pending_approvals: int = 0
    live_delegations: int = 0
    ledger_rows: int = 0

    def summary(self) -> dict[str, Any]:
        states: dict[str, int] = {}
        for effect in self.effects:
            states[effect.state] = states.get(effect.state, 0) + 1
        return {"path": self.path, "written_by": self.versions, "receipts": len(self.receipts),
                "chained": len(self.receipts) - self.unchained, "unchained": self.unchained,
                "verified": self.verified, "head_seq": self.head_seq, "head_hash": self.head_hash,
                "checkpoint": None if self.start[0] == 0 else {"seq": self.start[0], "hash": self.start[1]},
                "schemas": dict(sorted(self.schemas.items())), "effects": dict(sorted(states.items())),
                "breaks": self.breaks, "left_behind": {"pending_approvals": self.pending_approvals,
                                                       "live_delegations": self.live_delegations,
                                                       "budget_ledger_rows": self.ledger_rows}}


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise NotAReferenceStore(f"{path}: no such file (the reference keeps its store at .ctrlrun/state.db beside "
                                 "its ctrlrun.yaml)")
    try:
        connection = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True)
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise NotAReferenceStore(f"{path}: not a SQLite database ({exc})") from None
    missing = {"receipts", "effects"} - tables
    if missing or "ctrlrun_receipt" in tables:
        connection.close()
        what = "this is a store of ours (it has ctrlrun_receipt)" if "ctrlrun_receipt" in tables else \
            f"it has no {' or '.join(sorted(missing))} table"
        raise NotAReferenceStore(f"{path}: not a store written by the reference ctrlrun: {what}")
    return connection


def _rows(connection: sqlite3.Connection, statement: str) -> list[tuple]:
    try:
        return connection.execute(statement).fetchall()
    except sqlite3.OperationalError:  # a table or column an older reference did not have
        return []


def read(path: str | Path) -> SourceReport:
    """Read the reference store at ``path`` and verify its chain. Raises :class:`NotAReferenceStore`."""
    path = Path(path)
    connection = _connect(path)
    try:
        return _read(connection, path)
    except sqlite3.DatabaseError as exc:
        raise NotAReferenceStore(f"{path}: could not be read ({type(exc).__name__}: {exc})") from None
    finally:
        connection.close()


def _read(connection: sqlite3.Connection, path: Path) -> SourceReport:
    connection.execute("BEGIN")  # one snapshot: a reference still writing is seen before or after a write
    versions = sorted({str(v) for (v,) in _rows(connection, "SELECT ctrlrun_version FROM schema_version")},
                      key=lambda v: [int(p) if p.isdigit() else 0 for p in v.split(".")])
    columns = {c[1] for c in connection.execute("PRAGMA table_info(receipts)")}
    chained = {"seq", "hash", "prev_hash"} <= columns
    rows = connection.execute(
        "SELECT receipt_id, json, " + ("seq, hash, prev_hash" if chained else "NULL, NULL, NULL") +
        " FROM receipts ORDER BY seq IS NULL DESC, seq, rowid").fetchall()
    head = _rows(connection, "SELECT seq, hash FROM receipt_chain WHERE id = 1")
    head_seq, head_hash = head[0] if head else (0, GENESIS_HASH)
    receipts, schemas, breaks = [], {}, []
    names: dict[str, str] = {}
    for receipt_id, text, seq, hash_, prev in rows:
        schema = "UNREADABLE"
        try:
            if not isinstance(text, str):
                raise TypeError(f"stored as {type(text).__name__}, not text")
            document = json.loads(text)
            schema = document.get("schema") if isinstance(document, dict) else None
            if schema not in KNOWN_RECEIPT_SCHEMAS or set(document) != KNOWN_RECEIPT_SCHEMAS[schema]:
                breaks.append({"name": "unknown_schema", "seq": seq, "detail": f"receipt {receipt_id}: "
                               f"{str(schema)[:60]!r} with {len(document) if isinstance(document, dict) else 0} keys "
                               "is not a receipt schema the reference wrote (v1-v7, each with its own keys)"})
                schema = "UNKNOWN"
            elif seq is None and "seq" in document:
                breaks.append({"name": "unchained_after_chain", "seq": None, "detail": f"receipt {receipt_id} is "
                               f"{schema}, written with the chain, but its row has no seq: it was taken out of it"})
            elif isinstance(document.get("action"), str) and isinstance(document.get("action_id"), str):
                names.setdefault(document["action_id"], document["action"])
        except (TypeError, ValueError) as exc:
            breaks.append({"name": "unreadable", "seq": seq, "detail": f"receipt {receipt_id}: this row could not be "
                           f"read ({type(exc).__name__}: {str(exc)[:80]})"})
        schemas[schema] = schemas.get(schema, 0) + 1
        receipts.append(SourceReceipt(seq, str(receipt_id), schema, hash_, prev, text if isinstance(text, str) else ""))
    checkpoint = _rows(connection, "SELECT seq, hash FROM prune_checkpoint WHERE id = 1")
    report = SourceReport(str(path), versions, receipts, [], head_seq, head_hash, schemas,
                          unchained=sum(r.seq is None for r in receipts), breaks=breaks,
                          start=(int(checkpoint[0][0]), str(checkpoint[0][1])) if checkpoint else (0, GENESIS_HASH))
    _walk(report)
    report.effects = _effects(connection, names, report)
    _against_receipts(report)
    report.pending_approvals = len(_rows(connection, "SELECT 1 FROM approvals WHERE status IN ('pending', 'granted')"))
    report.live_delegations = len(_rows(connection, "SELECT 1 FROM delegations WHERE revoked_at IS NULL"))
    report.ledger_rows = len(_rows(connection, "SELECT 1 FROM budget_ledger"))
    return report


def _walk(report: SourceReport) -> None:
    report.verified, breaks = check_chain(report.receipts, report.head_seq, report.head_hash, report.start)
    report.breaks += breaks


def check_chain(receipts: list[SourceReceipt], head_seq: int, head_hash: str,
                start: tuple[int, str] = (0, GENESIS_HASH)) -> tuple[int, list[dict[str, Any]]]:
    """The chain by ``seq`` from ``start`` (the genesis, or a prune checkpoint's seq and hash): each
    document re-hashed under its own keys, each link, every seq present, and the head at the last
    one. (verified, breaks); unchained rows are skipped."""
    breaks: list[dict[str, Any]] = []
    verified, previous, expected = 0, start[1], start[0] + 1
    for receipt in (r for r in receipts if r.seq is not None):
        def broken(name: str, detail: str) -> None:
            breaks.append({"name": name, "seq": receipt.seq, "detail": detail})

        if receipt.seq != expected:
            broken("missing", f"seq {expected} is not here; the next receipt says it is seq {receipt.seq}")
            expected = receipt.seq
        expected += 1
        try:
            document = json.loads(receipt.text)
            known = KNOWN_RECEIPT_SCHEMAS.get(document.get("schema")) == set(document)
        except (TypeError, ValueError, AttributeError):
            known = False
        if not known:  # named when it was read
            previous = receipt.hash or ""
            continue
        try:
            recomputed = sha256_hash(canonical_bytes({k: v for k, v in document.items() if k != "hash"}))
        except Exception as exc:  # noqa: BLE001 - a value no receipt of the reference can hold (a float ...)
            broken("content_altered", f"the document cannot be hashed as the reference hashes it: {str(exc)[:120]}")
            previous = receipt.hash or ""
            continue
        if not receipt.hash:
            broken("hash_missing", "the stored hash is gone")
        elif recomputed != receipt.hash:
            broken("content_altered", f"the recomputed hash {recomputed} is not the stored {receipt.hash}")
        if receipt.prev_hash != previous or document.get("prev_hash") != receipt.prev_hash:
            broken("link_broken", f"prev_hash is {receipt.prev_hash}, and the receipt before it hashes to {previous}")
        elif document.get("seq") != receipt.seq:
            broken("content_altered", f"the document says seq {document.get('seq')}, its row {receipt.seq}")
        elif recomputed == receipt.hash:
            verified += 1
        previous = recomputed
    last = expected - 1
    if (last, previous) != (head_seq, head_hash):
        breaks.append({"name": "head_mismatch", "seq": head_seq, "detail": (
            f"the head row says seq {head_seq} ({head_hash}); the chain ends at seq {last} ({previous})")})
    return verified, breaks


def _effects(connection: sqlite3.Connection, names: dict[str, str], report: SourceReport) -> list[SourceEffect]:
    for action_id, data in _rows(connection, "SELECT action_id, data_json FROM events WHERE type = 'ACTION_PROPOSED'"):
        try:
            name = json.loads(data).get("action")
        except (TypeError, ValueError, AttributeError):
            continue
        if isinstance(name, str) and action_id:
            names.setdefault(action_id, name)
    effects = []
    for key, state, action_id, attempt, lease, result, error, resolved_by in connection.execute(
            "SELECT effect_key, state, action_id, attempt, lease_expires_at, result_json, error, "
            + ("resolved_by" if "resolved_by" in {c[1] for c in connection.execute("PRAGMA table_info(effects)")}
               else "NULL") + " FROM effects ORDER BY created_at, effect_key"):
        problem = None
        if state not in STATES:
            problem = f"its state {str(state)[:40]!r} is not one the reference writes"
        elif not isinstance(key, str) or not key or len(key) > MAX_KEY:
            problem = f"its key is empty or longer than {MAX_KEY} characters"
        elif not isinstance(action_id, str) or not action_id or len(action_id) > MAX_ID:
            problem = f"its action id {str(action_id)[:60]!r} is not the reference's act_<32 hex>"
        elif result is not None and not _json_text(result):
            problem = "its result is not JSON text"
        elif not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt <= MAX_ATTEMPT:
            problem = f"its attempt {str(attempt)[:20]!r} is not a whole number from 1 to {MAX_ATTEMPT}"
        elif lease is not None and not isinstance(lease, str):
            problem = "its lease is not a time"
        elif not all(v is None or isinstance(v, str) for v in (error, resolved_by)):
            problem = "its error or resolver is not text"
        if problem:
            report.breaks.append({"name": "effect_unreadable", "seq": None,
                                  "detail": f"effect {str(key)[:80]!r}: {problem}"})
            continue
        effects.append(SourceEffect(key, state, names.get(action_id), action_id, attempt, lease,
                                    result, error, resolved_by))
    return effects


#: What the newest verified receipt of a key allows its effect record to be (the reference's states).
_CONSISTENT = {"committed": {"committed"}, "ambiguous": {"ambiguous", "committed", "failed", "executing"},
               "failed": {"failed", "executing"}}


def _against_receipts(report: SourceReport) -> None:
    """The effect records have no hash of their own: each is held to the newest verified receipt of its
    key. A key whose last recorded outcome is committed must still be committed; one left ambiguous
    may since have been resolved by a person (its resolver kept) or retried; a failed one may be
    being retried. A record missing for a receipted key, or contradicting it, is a break: imported,
    it would let a key that ran run again."""
    if report.breaks:
        return  # the receipts themselves do not verify: nothing to hold the records to
    newest: dict[str, tuple[str, int]] = {}
    for receipt in report.receipts:
        if receipt.seq is None:
            continue  # unchained: nothing about it is verified
        document = json.loads(receipt.text)
        key, result = document.get("effect_key"), document.get("result")
        if isinstance(key, str) and result in _CONSISTENT:
            newest[key] = (result, document.get("attempt") if isinstance(document.get("attempt"), int) else 1)
    records = {e.effect_key: e for e in report.effects}
    for key, (result, attempt) in sorted(newest.items()):
        record = records.get(key)
        if record is None:
            report.breaks.append({"name": "effect_missing", "seq": None, "detail": (
                f"effect {key!r}: its newest verified receipt is {result}, and the store has no record of it")})
            continue
        allowed = _CONSISTENT[result]
        resolved = result == "ambiguous" and record.state in ("committed", "failed")
        if record.state not in allowed or (resolved and not record.resolved_by) or record.attempt < attempt:
            report.breaks.append({"name": "effect_contradicts_receipt", "seq": None, "detail": (
                f"effect {key!r} is {record.state} at attempt {record.attempt}, but its newest verified receipt "
                f"is {result} at attempt {attempt}" + (" and nobody is named as resolving it" if resolved else ""))})


def _json_text(value: Any) -> bool:
    try:
        json.loads(value)
    except (TypeError, ValueError):
        return False
    return True


def lease_live(effect: SourceEffect, now: dt.datetime) -> bool:
    """Whether an executing record's lease has not run out yet (a reference worker may still be on it)."""
    if effect.state != "executing" or not effect.lease_expires_at:
        return False
    try:
        lease = dt.datetime.fromisoformat(effect.lease_expires_at.replace("Z", "+00:00"))
    except ValueError:
        return True  # unreadable: assume it is live, and refuse
    return (lease if lease.tzinfo else lease.replace(tzinfo=dt.timezone.utc)) > now
