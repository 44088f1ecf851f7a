"""The only module that talks to the database: every transaction, row lock and conflict.

Design
------
A protected call is a few short *phases*, each one ``transaction.atomic(durable=True)`` with a
closed set of results, and never a transaction open while the user's function runs:

1. ``reserve``: take the effect key (insert the row, or renew a ``failed`` one) and mark it
   executing, in ONE transaction. The call's opening events (proposed, evaluated, reserved,
   started) are kept on the record itself (``pending``) until the call ends. A refusal writes its
   events and its ``blocked`` receipt in that same transaction.
2. the function runs, outside any transaction, while a heartbeat renews the lease;
3. ``record_outcome``: move the row (if this attempt still holds it), and append the opening
   events, the outcome event and the receipt to the evidence, in ONE transaction.

So an allowed call costs two write transactions; a denied or refused one costs one.

The clock. Every time the store writes or compares (leases, expiries, evidence) comes from the
*store's* clock, read once per phase: the database server's ``now()`` on PostgreSQL, so a host
whose clock runs minutes fast or slow can neither lapse a live lease nor misdate a row; on SQLite
the one host's system clock, which is the only clock its processes can have. A test clock
(``conf.set_clock``) replaces both.

Evidence. Receipts and events are two hash chains hanging off one head row (``ChainHead``),
which each evidence append locks, last in its transaction. Reservation appends nothing (its
events wait on the record), so taking a key takes no global lock; the outcome phase, which locks
the head for its receipt anyway, appends the waiting events with it. If the worker dies, whoever
sweeps its lapsed lease appends them, with the dead attempt's ``ambiguous`` receipt. The head
is signed (``ctrlrun.signing``) and checked before every append, as are effect records and
approvals before they are relied on: a row written around ctrlrun is refused where it is used.

Serialisation. On SQLite every transaction is ``BEGIN IMMEDIATE`` (see ``standalone.
sqlite_options``), so a read-then-write decision cannot interleave with another writer. On
PostgreSQL a first reservation is ``INSERT ... ON CONFLICT DO NOTHING`` on the key (a concurrent
insert of the same key waits for the winner, then does nothing), and every other decision reads
the row with ``SELECT ... FOR UPDATE``. Lock order is always effect row, then approval row, then
chain head: no deadlocks.

The hot path (reserve, outcome, events, receipts) is plain SQL over the models' tables: the
ORM's query building cost more than the database work (profiled). Everything else uses the ORM.
The store returns frozen dataclasses and raises ctrlrun's own errors, never QuerySets or
database exceptions. A phase cannot be nested inside a caller's open transaction
(``durable=True``): evidence must not roll back with someone else's work.
"""
from __future__ import annotations

import collections
import contextlib
import datetime as dt
import functools
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import Error as DjangoDatabaseError
from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import conf, observers, signing
from .canonical import GENESIS_HASH, Action, Principal, evidence_text, evidence_time, new_id
from .errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    CTRLRunError,
    DuplicateEffect,
    EvidenceTampered,
    InvalidArgument,
    StoreUnavailable,
)
from .models import Approval, ChainCheck, ChainHead, EffectRecord, Event, PolicyDocument, Receipt, dumps_json
from .receipts import (
    INDEXED_COLUMNS,
    PROGRESS_EVERY,
    ChainBreak,
    ChainReport,
    EventWalk,
    ReceiptWalk,
    StoredEvent,
    StoredReceipt,
    build_receipt,
    dump_receipt,
    event_document,
    event_hash,
    event_time,
    receipt_hash,
    verify_chain,
    verify_events,
)
from .states import ApprovalStatus, Decision, EffectState, EventType, Result

logger = logging.getLogger("ctrlrun.store")

__all__ = [
    "Call",
    "Pending",
    "Reserved",
    "Refused",
    "OutcomeWrite",
    "HookAnswer",
    "EffectView",
    "EventView",
    "ReceiptView",
    "now",
    "ensure_policy",
    "record_denial",
    "begin_unkeyed",
    "reserve",
    "record_refusal",
    "renew_lease",
    "ApprovalView",
    "request_approval",
    "answer_approval",
    "expire_if_due",
    "get_approval",
    "list_approvals",
    "approvals_for_hash",
    "record_outcome",
    "record_reconciliation",
    "resolve",
    "sweep_lapsed",
    "reconcile_candidates",
    "list_effects",
    "get_effect",
    "list_receipts",
    "events_for_action",
    "receipts_for_action",
    "verify",
    "verify_incremental",
    "record_check",
    "last_check",
    "head_position",
    "ChainCheckView",
]

S = EffectState
LEASE_LAPSED_ERROR = "lease expired: the worker holding this effect never finished"
#: Signature domains: a MAC made for one kind of row can never pass for another.
HEAD_DOMAIN, EFFECT_DOMAIN, APPROVAL_DOMAIN = "ctrlrun.head/v1", "ctrlrun.effect/v1", "ctrlrun.approval/v1"
TAMPERED_HINT = ("it was written or changed outside ctrlrun (its signature does not verify, or the event chain "
                 "shows it is out of date). Nothing ran; run 'ctrlrun receipts --verify-chain' and find out who "
                 "changed it")


# --------------------------------------------------------------------------- values

EventRow = tuple  # (ts, type, action_id, effect_key, approval_id, data[, data as JSON text]): one event


@dataclass(frozen=True)
class Pending:
    """A running attempt's opening events, kept on its record until they join the event chain."""

    text: str  # the record's ``pending`` column, exactly
    events: tuple[EventRow, ...]


@dataclass(frozen=True)
class Call:
    """What the store needs to know about one protected call.

    ``started_at`` is filled in by the call's first phase (from the store's clock) when None.
    ``pending`` is set on the call a reservation hands back.
    """

    action: Action
    decision: Decision
    reason: str
    policy_hash: str | None
    effect_key: str | None
    started_at: dt.datetime | None = None
    approval_id: str | None = None
    approver: str | None = None
    pending: Pending | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Reserved:
    attempt: int
    lease_expires_at: dt.datetime
    call: Call  # the call as recorded (with the approval it consumed, if any)


@dataclass(frozen=True)
class Refused:
    """A reservation that did not happen. ``final`` means its evidence is already written."""

    error: CTRLRunError
    attempt: int | None
    final: bool
    call: Call


@dataclass(frozen=True)
class OutcomeWrite:
    """Whether the outcome was recorded on the row; if not, ``refusal`` says why."""

    accepted: bool
    refusal: AmbiguousEffect | None = None


@dataclass(frozen=True)
class HookAnswer:
    """What a reconcile hook said, as recorded: ``outcome`` is always one of the three answers.

    ``duration`` is how long the hook took (seconds, a monotonic clock), so the time it was asked
    can be dated on the store's clock.
    """

    outcome: str
    reason: str | None = None  # "raised" | "invalid_return" when the hook could not say
    error: str | None = None
    duration: float = 0.0

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"outcome": self.outcome}
        if self.reason:
            data["reason"] = self.reason
            data["error"] = self.error
        return data


@dataclass(frozen=True)
class EffectView:
    effect_key: str
    action: str
    state: str
    action_id: str
    attempt: int
    lease_expires_at: dt.datetime | None
    error: str | None
    resolved_by: str | None
    reconcile_failures: int
    reconcile_after: dt.datetime | None
    created_at: dt.datetime
    updated_at: dt.datetime
    #: False when the row does not carry ctrlrun's signature (written around ctrlrun).
    signature_ok: bool = True

    def lease_lapsed(self, now: dt.datetime) -> bool:
        return self.lease_expires_at is not None and self.lease_expires_at <= now


@dataclass(frozen=True)
class EventView:
    id: int
    ts: dt.datetime
    type: str
    action_id: str | None
    effect_key: str | None
    approval_id: str | None
    data: dict[str, Any]


@dataclass(frozen=True)
class ReceiptView:
    receipt_id: str
    seq: int | None
    action_id: str
    action: str
    agent: str
    decision: str
    result: str
    effect_key: str | None
    ts: dt.datetime
    document: str

    @functools.cached_property
    def doc(self) -> dict[str, Any]:
        return json.loads(self.document)


# --------------------------------------------------------------------------- plumbing


def _db() -> str:
    return conf.database_alias()


def _q(model: Any) -> Any:
    return model.objects.db_manager(_db())


class _Statements:
    """The hot path's statements, run on the database driver's own cursor under Django's connection.

    Django's cursor wrapper (parameter conversion, debug hooks, a new wrapper per statement) cost more
    than the statements themselves (profiled: ~20 µs each on SQLite). The transaction stays Django's
    (``atomic``), and driver errors still become Django's (``wrap_database_errors``), so ``_phase``
    maps them as before. When something watches the connection's statements (an ``execute_wrapper``,
    ``DEBUG``'s query log) they go through Django's cursor, so the watcher sees every one.
    """

    _sqlite_sql: dict[str, str] = {}

    def __init__(self) -> None:
        self.connection = connections[_db()]
        self.watched = bool(self.connection.execute_wrappers) or self.connection.queries_logged
        self.sqlite = self.connection.vendor == "sqlite"

    def __enter__(self) -> _Statements:
        if self.watched:
            self.cursor = self.connection.cursor()
        else:
            self.connection.ensure_connection()
            self.cursor = self.connection.connection.cursor()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cursor.close()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Statements:
        if self.watched:
            self.cursor.execute(sql, params)
            return self
        if self.sqlite:  # qmark paramstyle; converted once per statement text
            converted = self._sqlite_sql.get(sql)
            if converted is None:
                converted = self._sqlite_sql[sql] = sql.replace("%s", "?")
            sql = converted
        with self.connection.wrap_database_errors:
            self.cursor.execute(sql, params)
        return self

    def fetchone(self) -> Any:
        with self.connection.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self.connection.wrap_database_errors:
            return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


_cursor = _Statements


def _clock() -> dt.datetime:
    """The store's clock: a test clock if one is set, else the database server's (PostgreSQL), else
    this host's (SQLite: every process of one store runs on the one host that holds its file)."""
    if conf.clock_overridden():
        return conf.now()
    if connections[_db()].vendor == "postgresql":
        with _cursor() as cursor:
            return cursor.execute("SELECT now()").fetchone()[0]
    return conf.now()


def _unavailable(exc: DjangoDatabaseError, what: str) -> StoreUnavailable:
    # A dropped connection stays broken until closed; close it now so that the next call
    # reconnects (Django would only do this at the end of a web request).
    connections[_db()].close_if_unusable_or_obsolete()
    detail = " ".join(str(exc).split())  # drivers' messages span lines; an error is one line
    return StoreUnavailable(f"the ctrlrun store could not {what} ({type(exc).__name__}: {detail}); nothing was "
                            f"recorded by that step")


@contextlib.contextmanager
def _phase(*, clock: bool = True) -> Iterator[Any]:
    """One short, durable transaction, yielding the store's time for everything it writes;
    database trouble becomes ``StoreUnavailable``. ``clock=False`` yields None instead of reading
    PostgreSQL's clock up front: the phase's first statement brings it (a round trip saved)."""
    try:
        with transaction.atomic(using=_db(), durable=True):
            if clock or conf.clock_overridden() or connections[_db()].vendor != "postgresql":
                yield _clock()
            else:
                yield None
    except RuntimeError as exc:
        if "durable" in str(exc):
            raise InvalidArgument(
                "a protected call cannot run inside an open transaction on ctrlrun's database: its "
                "evidence would roll back with your work. Call it outside transaction.atomic(), or "
                "give ctrlrun a database of its own (settings.CTRLRUN_DATABASE)"
            ) from None
        raise
    except DjangoDatabaseError as exc:
        raise _unavailable(exc, "complete a write") from exc


@contextlib.contextmanager
def _reading() -> Iterator[None]:
    """A read outside any phase; database trouble becomes ``StoreUnavailable``."""
    try:
        yield
    except DjangoDatabaseError as exc:
        raise _unavailable(exc, "be read") from exc


def now() -> dt.datetime:
    """The store's clock, read now (what leases and expiries are compared with)."""
    with _reading():
        return _clock()


def _iso(moment: dt.datetime | None) -> str | None:
    return None if moment is None else event_time(moment)


def _digest(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def _as_datetime(value: Any, connection: Any) -> dt.datetime | None:
    """A timestamp column read by raw SQL, as the ORM would read it (SQLite hands back text in the
    connection's time zone)."""
    if value is None or isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value
    if isinstance(value, str):
        value = parse_datetime(value)
    return timezone.make_aware(value, connection.timezone) if value.tzinfo is None else value


# --------------------------------------------------------------------------- signatures


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


#: Head states this process signed or verified: re-reading one of them needs no new HMAC. A head
#: state is only ever genuine or not, and the head never moves back, so remembering is safe.
_trusted_heads: collections.deque[tuple] = collections.deque(maxlen=16)


def _head_problem(seq: int, hash_: str, event_seq: int, event_hash_: str, mac: str | None,
                  key_id: str | None) -> str | None:
    """Why the head row cannot be trusted, or None. A fresh head (genesis, never signed) is fine."""
    state = (seq, hash_, event_seq, event_hash_, mac, key_id)
    if state in _trusted_heads:
        return None
    fresh = seq == 0 and event_seq == 0 and hash_ == GENESIS_HASH and event_hash_ == GENESIS_HASH
    if mac is None and key_id is None and fresh:
        return None
    if signing.is_valid(HEAD_DOMAIN, _head_document(seq, hash_, event_seq, event_hash_, key_id), mac):
        _trusted_heads.append(state)
        return None
    mine = signing.key_id()
    if key_id != mine:
        return (f"the chain head names signing key id {key_id}, and this process's key ({signing.key_source()}) "
                f"has id {mine}: either this process was not given the store's key (every process of one store "
                f"needs the same CTRLRUN_SIGNING_KEY or SECRET_KEY), or the head was changed outside ctrlrun")
    return (f"the chain head (receipt seq {seq}, event seq {event_seq}) does not carry ctrlrun's signature: it "
            f"was moved outside ctrlrun")


def _time_param(connection: Any) -> Any:
    """How a datetime goes into raw SQL for this connection: Django's adaptation, or (SQLite in UTC, the
    common case) the same text made without its per-call settings lookups."""
    if connection.vendor == "sqlite" and connection.timezone_name == "UTC":
        return _sqlite_utc_text
    return connection.ops.adapt_datetimefield_value


_recent_texts: dict[dt.datetime, str] = {}


def _sqlite_utc_text(value: dt.datetime | None) -> str | None:
    """Django's SQLite text for an aware time (naive UTC, ``str()``); one phase writes the same few
    times many times over, so the last few are kept."""
    if value is None:
        return None
    text = _recent_texts.get(value)
    if text is None:
        if len(_recent_texts) > 8:
            _recent_texts.clear()
        text = _recent_texts[value] = str(value.astimezone(dt.timezone.utc).replace(tzinfo=None))
    return text


# --------------------------------------------------------------------------- evidence


def _event(type_: EventType, call_or_id: Call | str | None, effect_key: str | None, data: dict[str, Any],
           when: dt.datetime, approval_id: str | None = None) -> EventRow:
    action_id = call_or_id.action.action_id if isinstance(call_or_id, Call) else call_or_id
    return (when, type_.value, action_id, effect_key, approval_id, data)


@dataclass(frozen=True)
class _ReceiptSpec:
    call: Call
    result: Result
    error: str | None
    attempt: int | None
    decision_reason: str | None = None


def _receipt_doc(spec: _ReceiptSpec, when: dt.datetime) -> dict[str, Any]:
    call, action = spec.call, spec.call.action
    return build_receipt(
        receipt_id=new_id("ctr_"),
        action_id=action.action_id,
        action=action.name,
        action_hash=action.hash,
        principal=action.principal.as_evidence(),
        resource=action.resource,
        arguments=action.arguments,
        environment=action.environment,
        decision=call.decision.value,
        decision_reason=spec.decision_reason or call.reason,
        approval_id=call.approval_id,
        approver=call.approver,
        effect_key=call.effect_key,
        attempt=spec.attempt,
        result=spec.result.value,
        error=spec.error,
        started_at=evidence_time(call.started_at or when),
        finished_at=evidence_time(when),
        policy_hash=call.policy_hash,
    )


_HEAD_TAKE = ('UPDATE "ctrlrun_chainhead" SET "seq" = "seq" + %s, "event_seq" = "event_seq" + %s WHERE "id" = 1 '
              'RETURNING "seq", "hash", "event_seq", "event_hash", "mac", "key_id"')
_EVENT_INSERT = ('INSERT INTO "ctrlrun_event" ("ts","type","action_id","effect_key","approval_id","data","seq",'
                 '"prev_hash","hash") VALUES ')
_RECEIPT_INSERT = ('INSERT INTO "ctrlrun_receipt" ("receipt_id","seq","action_id","action","agent","decision",'
                   '"result","effect_key","ts","document","prev_hash","hash") VALUES ')
_HEAD_MOVE = ('UPDATE "ctrlrun_chainhead" SET "hash" = %s, "event_hash" = %s, "mac" = %s, "key_id" = %s '
              'WHERE "id" = 1')


def _take_head(cursor: Any, receipts: int, events: int, *, clock: bool = False) -> tuple:
    """Lock the head row and advance both chains; returns the row with the new seqs, old hashes
    (and, with ``clock``, the database's time: one round trip for both)."""
    sql = _HEAD_TAKE + (", now()" if clock else "")
    head = cursor.execute(sql, [receipts, events]).fetchone()
    if head is None:
        # Only a store whose tables were emptied (e.g. a test flush) has no head. Two first writers
        # may race here: the loser's insert does nothing (on PostgreSQL it waits for the winner), and
        # its UPDATE then takes the next seq after the winner's.
        created = cursor.execute(
            'INSERT INTO "ctrlrun_chainhead" ("id","seq","hash","event_seq","event_hash") VALUES (1, 0, %s, 0, %s) '
            'ON CONFLICT ("id") DO NOTHING RETURNING "id"', [GENESIS_HASH, GENESIS_HASH]).fetchone()
        # A head this writer had to make, over evidence already there, would hide a deletion.
        if created is not None and (_q(Receipt).exists() or _q(Event).exists()):
            raise EvidenceTampered(
                "the chain head row is missing while receipts or events exist; run 'ctrlrun receipts "
                "--verify-chain' and restore the store from a backup"
            )
        head = cursor.execute(sql, [receipts, events]).fetchone()
    return head


Built = tuple  # (events, receipts) a builder makes once the seal knows the time


def _seal(events: Sequence[EventRow], receipts: Sequence[_ReceiptSpec], when: dt.datetime | None, *,
          build: Any = None, sizes: tuple[int, int] = (0, 0)) -> list[dict[str, Any]]:
    """Append ``events`` and ``receipts`` to their chains. Must run inside a phase; locks the head last.

    The head's signature is checked before anything is added on top of it: a head moved around
    ctrlrun must not be re-signed by the next honest writer. With ``when`` None (PostgreSQL, a phase
    that has not read the clock yet), the head's lock brings the database's time, and ``build(when)``
    makes the ``sizes`` = (events, receipts) it appends. On PostgreSQL the events, the receipts and the
    head's move are one statement, so the head stays locked for two round trips in all.
    """
    connection = connections[_db()]
    postgres = connection.vendor == "postgresql"
    if build is None:
        if not events and not receipts:
            return []
        sizes = (len(events), len(receipts))
    database_clock = when is None and postgres and not conf.clock_overridden()
    if when is None and not database_clock:
        when = _clock()
    docs = [] if build is not None else [_receipt_doc(spec, when) for spec in receipts]  # before the lock
    adapt = _time_param(connection)
    with _cursor() as cursor:
        head = _take_head(cursor, sizes[1], sizes[0], clock=database_clock)
        seq, prev, event_seq, event_prev, mac, key_id = head[:6]
        problem = _head_problem(seq - sizes[1], prev, event_seq - sizes[0], event_prev, mac, key_id)
        if problem is not None:
            raise EvidenceTampered(f"ctrlrun refuses to add evidence: {problem}. Nothing was recorded; run "
                                   f"'ctrlrun receipts --verify-chain'")
        if build is not None:
            when = head[6] if database_clock else when
            events, receipts = build(when)
            docs = [_receipt_doc(spec, when) for spec in receipts]
            assert (len(events), len(receipts)) == sizes, "a builder made other than it announced"
        event_params: list[Any] = []
        listening = observers.wanted() is not None
        observed: list[tuple[Any, ...]] = []
        position = event_seq - len(events)
        for ts, type_, action_id, effect_key, approval_id, data, *known in events:
            position += 1
            if listening:
                observed.append((position, ts, type_, action_id, effect_key, approval_id, data))
            text = known[0] if known else dumps_json(data)
            digest = event_hash(event_document(position, event_prev, event_time(ts), type_, action_id,
                                               effect_key, approval_id, text))
            event_params += [adapt(ts), type_, action_id, effect_key, approval_id, text, position, event_prev, digest]
            event_prev = digest
        receipt_params: list[Any] = []
        position = seq - len(docs)
        for doc, spec in zip(docs, receipts):
            position += 1
            doc["seq"], doc["prev_hash"] = position, prev
            digest = receipt_hash(doc, trusted=True)
            action = spec.call.action
            receipt_params += [doc["receipt_id"], position, action.action_id, action.name, action.principal.agent,
                               spec.call.decision.value, spec.result.value, spec.call.effect_key, adapt(when),
                               dump_receipt(doc), prev, digest]
            prev = digest
        head_mac = signing.sign(HEAD_DOMAIN, _head_document(seq, prev, event_seq, event_prev, signing.key_id()))
        head_params = [prev, event_prev, head_mac, signing.key_id()]
        event_sql = _EVENT_INSERT + ",".join(["(%s,%s,%s,%s,%s,%s,%s,%s,%s)"] * len(events))
        receipt_sql = _RECEIPT_INSERT + ",".join(["(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"] * len(docs))
        if postgres:  # one round trip: data-modifying CTEs all run, referenced or not
            parts = [f"{name} AS ({sql})" for name, sql, rows in (("e", event_sql, events), ("r", receipt_sql, docs))
                     if rows]
            cursor.execute(("WITH " + ", ".join(parts) + " " if parts else "") + _HEAD_MOVE,
                           [*event_params, *receipt_params, *head_params])
        else:
            if events:
                cursor.execute(event_sql, event_params)
            if docs:
                cursor.execute(receipt_sql, receipt_params)
            cursor.execute(_HEAD_MOVE, head_params)
    _trusted_heads.append((seq, prev, event_seq, event_prev, head_mac, signing.key_id()))
    if listening:
        observers.after_commit(_db(), observed, docs)
    return docs


def _opening_events(call: Call, when: dt.datetime) -> list[EventRow]:
    action = call.action
    # The data's text is built from the action's canonical JSON, already encoded for its hash.
    proposed_text = '{"action_hash":"%s","action":%s}' % (action.hash, action.canonical_json)
    return [
        (*_event(EventType.ACTION_PROPOSED, call, call.effect_key,
                 {"action_hash": action.hash, "action": action.canonical()}, call.started_at or when),
         proposed_text),
        _event(EventType.POLICY_EVALUATED, call, call.effect_key,
               {"decision": call.decision.value, "reason": call.reason}, when),
    ]


def _started(call: Call, when: dt.datetime) -> Call:
    return call if call.started_at is not None else replace(call, started_at=when)


_known_policies: set[str] = set()


def forget_known_policies() -> None:
    _known_policies.clear()


def ensure_policy(policy_hash: str, schema: str, source: str, text: str, environment: str) -> None:
    """Store the policy document once (per process, the first time it decides anything), and make
    sure this process signs with the store's key before it acts at all."""
    if policy_hash in _known_policies:
        return
    with _phase() as when:
        _q(PolicyDocument).get_or_create(
            hash=policy_hash,
            defaults={"schema": schema, "source": source, "text": text, "environment": environment,
                      "first_seen": when},
        )
        head = _q(ChainHead).filter(pk=1).values_list(*_HEAD_FIELDS).first()
        problem = _head_problem(*head) if head is not None else None
        if problem is not None:
            raise EvidenceTampered(f"ctrlrun refuses to act: {problem}. Nothing ran")
    _known_policies.add(policy_hash)


# --------------------------------------------------------------------------- refusals before any effect


def record_denial(call: Call, data: dict[str, Any], *, with_policy: bool = True) -> None:
    """A call refused before any effect: opening events, ACTION_DENIED, a ``denied`` receipt."""

    def build(when: dt.datetime) -> Built:
        denied = _started(call, when)
        events = _opening_events(denied, when)[: None if with_policy else 1]
        events.append(_event(EventType.ACTION_DENIED, denied, denied.effect_key, data, when, denied.approval_id))
        return events, [_ReceiptSpec(denied, Result.DENIED, data.get("error"), None, data["reason"])]

    with _phase(clock=False) as when:
        _seal((), (), when, build=build, sizes=(3 if with_policy else 2, 1))


def begin_unkeyed(call: Call, presented: str | None = None) -> Reserved | Refused:
    """A call with no effect key: nothing to reserve; the approval (if any) is checked and used.

    With no record to keep them on, its opening events join the chain now.
    """
    with _phase() as when:
        call = _started(call, when)
        events = _opening_events(call, when)
        call, approval, refusal = _take_presented(call, presented, when, events)
        if refusal is not None:
            return refusal
        if approval is None and presented is not None and call.decision is Decision.ALLOW:
            approval, call = _matching_approval(call, presented, when)
        if approval is not None:
            events.append(_consumption_event(approval, call, when, required=call.decision is Decision.APPROVE))
            _mark_consumed(approval, call, when)
        events.append(_event(EventType.EXECUTION_STARTED, call, None, {"task": None, "hop": None}, when,
                             call.approval_id))
        _seal(events, [], when)
    return Reserved(1, when, call)


# --------------------------------------------------------------------------- reservation


def _refusal_for(record: Any, tampered: bool = False) -> CTRLRunError:
    key = record.effect_key
    resolve_hint = f"'ctrlrun resolve {key} --committed' or '--failed'"
    if tampered:
        return AmbiguousEffect(f"effect '{key}' is {record.state}, but {TAMPERED_HINT}; it will not run until a "
                               f"person has checked the remote", effect_key=key, action_id=record.action_id)
    if record.state == S.COMMITTED:
        return DuplicateEffect(
            f"effect '{key}' was already committed by {record.action_id}; it will not run again",
            state="committed", effect_key=key,
        )
    if record.state in (S.RESERVED, S.EXECUTING):
        return DuplicateEffect(
            f"effect '{key}' is executing under {record.action_id} (attempt {record.attempt}, lease until "
            f"{evidence_time(record.lease_expires_at)}); wait for it to finish",
            state="in_progress", effect_key=key,
        )
    if record.error == LEASE_LAPSED_ERROR:
        return AmbiguousEffect(
            f"effect '{key}' was left executing by {record.action_id} and its lease expired; ask the remote "
            f"what happened, then resolve it with {resolve_hint}",
            effect_key=key, action_id=record.action_id,
        )
    return AmbiguousEffect(
        f"effect '{key}' has an unknown outcome from {record.action_id}; resolve it with {resolve_hint} "
        f"before retrying",
        effect_key=key, action_id=record.action_id,
    )


@dataclass
class _Peek:
    """The columns a decision needs, read (and locked, on PostgreSQL) without building a model."""

    effect_key: str
    action: str
    state: str
    action_id: str
    attempt: int
    lease_expires_at: dt.datetime | None
    error: str | None
    resolved_by: str | None
    pending: str | None
    mac: str | None


_PEEK_COLUMNS = '"action","state","action_id","attempt","lease_expires_at","error","resolved_by","pending","mac"'


def _peek(effect_key: str, *, lock: bool = True) -> _Peek | None:
    connection = connections[_db()]
    suffix = " FOR UPDATE" if lock and connection.features.has_select_for_update else ""  # SQLite: IMMEDIATE
    with _cursor() as cursor:
        row = cursor.execute(f'SELECT {_PEEK_COLUMNS} FROM "ctrlrun_effectrecord" WHERE "effect_key" = %s' + suffix,
                             [effect_key]).fetchone()
    if row is None:
        return None
    action, state, action_id, attempt, lease, error, resolved_by, pending, mac = row
    return _Peek(effect_key, action, state, action_id, attempt, _as_datetime(lease, connection), error, resolved_by,
                 pending, mac)


#: Evidence past the head (a receipt or event added without moving it) would make every later write
#: collide: a call must not act then. ``max()`` over a unique column reads one end of its index on
#: both databases, whatever the planner's statistics say (a range ``EXISTS`` was planned as a scan).
_BEYOND_HEAD = ('(COALESCE((SELECT max("seq") FROM "ctrlrun_receipt"), 0) > h."seq" OR '
                'COALESCE((SELECT max("seq") FROM "ctrlrun_event"), 0) > h."event_seq")')
_OPEN_POSTGRESQL = (
    'SELECT now(), h."seq", h."hash", h."event_seq", h."event_hash", h."mac", h."key_id", ' + _BEYOND_HEAD + ', r.* '
    'FROM (SELECT 1) AS one LEFT JOIN "ctrlrun_chainhead" AS h ON h."id" = 1 LEFT JOIN LATERAL (SELECT '
    + _PEEK_COLUMNS + ' FROM "ctrlrun_effectrecord" WHERE "effect_key" = %s FOR UPDATE) AS r ON true')
_OPEN_SQLITE = (
    'SELECT h."seq", h."hash", h."event_seq", h."event_hash", h."mac", h."key_id", ' + _BEYOND_HEAD + ', '
    + ", ".join(f"r.{column}" for column in _PEEK_COLUMNS.split(",")) + ' FROM (SELECT 1) AS one '
    'LEFT JOIN "ctrlrun_chainhead" AS h ON h."id" = 1 LEFT JOIN "ctrlrun_effectrecord" AS r ON r."effect_key" = %s')


def _open_reservation(effect_key: str, when: dt.datetime | None) -> tuple[dt.datetime, _Peek | None]:
    """The store's time and the key's record (locked), after making sure the chain head is ctrlrun's
    own: one statement. A call must not act when its evidence could not be kept."""
    connection = connections[_db()]
    postgres = connection.vendor == "postgresql"
    with _cursor() as cursor:
        row = cursor.execute(_OPEN_POSTGRESQL if postgres else _OPEN_SQLITE, [effect_key]).fetchone()
        # No head, but evidence: either it was removed, or (a brand-new store's first writers) another
        # writer's head and evidence committed after this statement's snapshot, PostgreSQL reading
        # each statement afresh. Evidence is looked for first: a head commits with its evidence, so
        # evidence seen means its head is there too; the statement is then read again, head and all.
        if row[1 if postgres else 0] is None and (_q(Receipt).exists() or _q(Event).exists()) \
                and _q(ChainHead).filter(pk=1).exists():
            row = cursor.execute(_OPEN_POSTGRESQL if postgres else _OPEN_SQLITE, [effect_key]).fetchone()
    if postgres:
        now_, row = row[0], row[1:]
        when = when or now_
    assert when is not None
    head, beyond, found = row[:6], row[6], row[7:]
    if head[0] is not None:
        problem = _head_problem(*head) or (
            "a receipt or event lies past the chain head: it was added outside ctrlrun" if beyond else None)
    elif _q(Receipt).exists() or _q(Event).exists():  # a store emptied on purpose (a flush) has no head
        problem = "the chain head row is missing while receipts or events exist"
    else:
        problem = None
    if problem is not None:
        raise EvidenceTampered(f"ctrlrun refuses to act: {problem}. Nothing ran; run 'ctrlrun receipts "
                               f"--verify-chain' and restore the store from a backup")
    if found[0] is None:
        return when, None
    action, state, action_id, attempt, lease, error, resolved_by, pending, mac = found
    return when, _Peek(effect_key, action, state, action_id, attempt, _as_datetime(lease, connection), error,
                       resolved_by, pending, mac)


def _stash(call: Call, attempt: int, events: Sequence[EventRow]) -> Pending:
    """The running attempt's opening events as kept on its record, with what a sweeper needs to
    write the receipt of an attempt whose worker never came back. Each event's data is encoded
    once, here, and the same text is what joins the chain."""
    rows = tuple(event if len(event) == 7 else (*event, dumps_json(event[5])) for event in events)
    proposed = any(event[1] == EventType.ACTION_PROPOSED.value for event in events)
    document = {
        "v": 1,
        # The action is in ACTION_PROPOSED's data when that event waits here too; else it is kept here.
        "call": {"action": None if proposed else call.action.canonical(), "action_id": call.action.action_id,
                 "decision": call.decision.value, "reason": call.reason, "policy_hash": call.policy_hash,
                 "approval_id": call.approval_id, "approver": call.approver,
                 "started_at": _iso(call.started_at), "effect_key": call.effect_key, "attempt": attempt},
        "events": [[event_time(ts), type_, action_id, key, approval_id, text]
                   for ts, type_, action_id, key, approval_id, _, text in rows],
    }
    return Pending(dumps_json(document), rows)


def _unstash(text: str) -> tuple[Call, int, list[EventRow]]:
    document = json.loads(text)
    info = document["call"]
    events = [(dt.datetime.fromisoformat(ts), type_, action_id, key, approval_id, json.loads(data), data)
              for ts, type_, action_id, key, approval_id, data in document["events"]]
    canonical = info["action"] or next(e[5]["action"] for e in events if e[1] == EventType.ACTION_PROPOSED.value)
    principal = canonical["principal"]
    action = Action(canonical["name"], canonical["arguments"], Principal(principal["agent"], principal["user"]),
                    resource=canonical["resource"], environment=canonical["environment"],
                    action_id=info["action_id"])
    call = Call(action, Decision(info["decision"]), info["reason"], info["policy_hash"], info["effect_key"],
                dt.datetime.fromisoformat(info["started_at"]) if info["started_at"] else None,
                info["approval_id"], info["approver"])
    return call, info["attempt"], events


def _call_from_events(action_id: str, effect_key: str) -> Call | None:
    """A record written before opening events were kept on it: rebuild its call from its events."""
    found = {e.type: e.data for e in _q(Event).filter(action_id=action_id, type__in=[
        EventType.ACTION_PROPOSED, EventType.POLICY_EVALUATED]).order_by("-id")}
    proposed, evaluated = found.get(EventType.ACTION_PROPOSED.value), found.get(EventType.POLICY_EVALUATED.value)
    if not proposed or not evaluated or not isinstance(proposed.get("action"), dict):
        return None
    canonical = proposed["action"]
    try:
        principal = canonical["principal"]
        action = Action(canonical["name"], canonical["arguments"], Principal(principal["agent"], principal["user"]),
                        resource=canonical["resource"], environment=canonical["environment"], action_id=action_id)
        return Call(action, Decision(evaluated["decision"]), evaluated["reason"], None, effect_key)
    except (CTRLRunError, KeyError, TypeError, ValueError):
        return None


def _rewound(record: _Peek) -> bool:
    """Whether the event chain shows this failed record is out of date: a later attempt was reserved, or
    the key was committed. A row put back from before (its signature is genuine) must not license a
    retry; this is read only before a retry renews a failed record, which is rare."""
    with _cursor() as cursor:
        rows = cursor.execute(
            'SELECT "type", "data" FROM "ctrlrun_event" WHERE "effect_key" = %s AND "type" IN '
            "('EFFECT_RESERVED', 'EXECUTION_COMMITTED', 'EFFECT_RESOLVED')", [record.effect_key]).fetchall()
    for type_, text in rows:
        try:
            data = json.loads(text)
        except ValueError:
            return True
        if type_ == "EFFECT_RESERVED" and isinstance(data.get("attempt"), int) and data["attempt"] > record.attempt:
            return True
        if type_ == "EXECUTION_COMMITTED" or data.get("state") == "committed":
            return True
    return False


def _lapse(record: _Peek, when: dt.datetime, events: list[EventRow], receipts: list[_ReceiptSpec]) -> None:
    """A held record whose lease ran out: nobody knows what its worker did. Mark it ambiguous, and
    write what the worker could not: its opening events, its ambiguous event and its receipt."""
    with _cursor() as cursor:
        cursor.execute(
            'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "error" = %s, "lease_expires_at" = NULL, '
            '"pending" = NULL, "updated_at" = %s, "mac" = %s WHERE "effect_key" = %s AND "state" = %s',
            [S.AMBIGUOUS.value, LEASE_LAPSED_ERROR, _time_param(connections[_db()])(when),
             _effect_mac(record.effect_key, record.action, S.AMBIGUOUS, record.action_id, record.attempt, None, None,
                         None),
             record.effect_key, S.EXECUTING.value])
    dead: Call | None = None
    if record.pending:
        dead, _, waiting = _unstash(record.pending)
        events += waiting
    else:
        dead = _call_from_events(record.action_id, record.effect_key)
    events.append(_event(EventType.EXECUTION_AMBIGUOUS, record.action_id, record.effect_key,
                         {"error": LEASE_LAPSED_ERROR, "reason": "lease_expired"}, when,
                         dead.approval_id if dead else None))
    if dead is not None:
        receipts.append(_ReceiptSpec(dead, Result.AMBIGUOUS, LEASE_LAPSED_ERROR, record.attempt))
    else:
        logger.warning("effect %s (attempt %s) was swept, but its call could not be rebuilt from the evidence: no "
                       "receipt was written for it", record.effect_key, record.attempt)
    record.state, record.error, record.lease_expires_at, record.pending = S.AMBIGUOUS, LEASE_LAPSED_ERROR, None, None


def _insert_fresh(call: Call, when: dt.datetime, lease_until: dt.datetime, pending: Pending) -> bool:
    """Insert the key's record as this call's, executing at attempt 1; False if the key exists.

    ``ON CONFLICT DO NOTHING`` makes losing the race an answer, not an error: on PostgreSQL a
    concurrent insert of the same key waits for the other transaction and then does nothing.
    """
    adapt = _time_param(connections[_db()])
    stamp = adapt(when)
    key, action_id = call.effect_key, call.action.action_id
    with _cursor() as cursor:
        cursor.execute(
            'INSERT INTO "ctrlrun_effectrecord" ("effect_key","action","state","action_id","attempt",'
            '"lease_expires_at","reconcile_failures","created_at","updated_at","pending","mac") '
            'VALUES (%s,%s,%s,%s,1,%s,0,%s,%s,%s,%s) ON CONFLICT ("effect_key") DO NOTHING RETURNING "attempt"',
            [key, call.action.name, S.EXECUTING.value, action_id, adapt(lease_until), stamp, stamp, pending.text,
             _effect_mac(key, call.action.name, S.EXECUTING, action_id, 1, lease_until, None, pending.text)],
        )
        return cursor.fetchone() is not None


def _renew(record: _Peek, call: Call, attempt: int, when: dt.datetime, lease_until: dt.datetime,
           pending: Pending) -> None:
    """failed -> executing: the only automatic retry hands the key to this call at ``attempt``."""
    adapt = _time_param(connections[_db()])
    key, action_id = call.effect_key, call.action.action_id
    with _cursor() as cursor:
        cursor.execute(
            'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "action" = %s, "action_id" = %s, "attempt" = %s, '
            '"lease_expires_at" = %s, "result_json" = NULL, "error" = NULL, "resolved_by" = NULL, '
            '"reconcile_failures" = 0, "reconcile_after" = NULL, "updated_at" = %s, "pending" = %s, "mac" = %s '
            'WHERE "effect_key" = %s AND "state" = %s AND "attempt" = %s',
            [S.EXECUTING.value, call.action.name, action_id, attempt, adapt(lease_until), adapt(when), pending.text,
             _effect_mac(key, call.action.name, S.EXECUTING, action_id, attempt, lease_until, None, pending.text),
             key, S.FAILED.value, record.attempt])


def _taking_events(call: Call, attempt: int, when: dt.datetime, lease_until: dt.datetime,
                   approval: Approval | None) -> list[EventRow]:
    events = []
    if approval is not None:
        events.append(_consumption_event(approval, call, when, required=call.decision is Decision.APPROVE))
    events += [
        _event(EventType.EFFECT_RESERVED, call, call.effect_key,
               {"attempt": attempt, "lease_expires_at": evidence_time(lease_until)}, when, call.approval_id),
        _event(EventType.EXECUTION_STARTED, call, call.effect_key, {"task": None, "hop": None}, when,
               call.approval_id),
    ]
    return events


def reserve(call: Call, lease: dt.timedelta, *, opening: bool, hold_ambiguous: bool,
            presented: str | None = None) -> Reserved | Refused:
    """Take the call's effect key and mark it executing, or refuse (§5.3, §8.4).

    ``opening`` includes the call's opening events. With ``hold_ambiguous`` an ambiguous record is
    refused *without* a receipt (``final=False``) so the caller can ask a reconcile hook and try
    once more; every other refusal writes its event and receipt here.

    ``presented`` is the approval the caller holds. For an ``approve`` decision it is checked
    first (its refusal wins) and consumed only if the reservation succeeds, in this same
    transaction: a refused reservation leaves it granted. For an ``allow`` decision it is
    consumed only if it matches, and never blocks the call.
    """
    with _phase(clock=False) as when:
        # One statement: the key's record (locked), the chain head (checked: nothing acts on a forged
        # one) and, on PostgreSQL, the database's time, which the lease is computed from.
        when, record = _open_reservation(call.effect_key, when)
        call = _started(call, when)
        events = _opening_events(call, when) if opening else []
        call, approval, refusal = _take_presented(call, presented, when, events)
        if refusal is not None:
            return refusal
        taker = call
        if approval is None and presented is not None and call.decision is Decision.ALLOW:
            approval, taker = _matching_approval(call, presented, when)
        lease_until = when + lease
        if record is None:
            pending = _stash(taker, 1, [*events, *_taking_events(taker, 1, when, lease_until, approval)])
            if _insert_fresh(taker, when, lease_until, pending):
                if approval is not None:
                    _mark_consumed(approval, taker, when)
                return Reserved(1, lease_until, replace(taker, pending=pending))
            # A concurrent first reservation won (on PostgreSQL the insert waited for it to commit).
            record = _peek(call.effect_key)
        assert record is not None  # the insert found it, and a record is never deleted
        tampered = False
        if record.state == S.FAILED or (record.state == S.EXECUTING and record.lease_expires_at <= when):
            tampered = not _effect_ok(record) or (record.state == S.FAILED and _rewound(record))
        if record.state == S.FAILED and not tampered:
            attempt = record.attempt + 1
            pending = _stash(taker, attempt, [*events, *_taking_events(taker, attempt, when, lease_until, approval)])
            _renew(record, taker, attempt, when, lease_until, pending)
            if approval is not None:
                _mark_consumed(approval, taker, when)
            return Reserved(attempt, lease_until, replace(taker, pending=pending))
        lapsed_events: list[EventRow] = []
        lapsed_receipts: list[_ReceiptSpec] = []
        if record.state == S.EXECUTING and record.lease_expires_at <= when and not tampered:
            _lapse(record, when, lapsed_events, lapsed_receipts)  # kept even though this attempt is refused
        error = _refusal_for(record, tampered)
        if tampered:
            logger.error("effect %s: its record does not carry ctrlrun's signature; refusing to retry or sweep it",
                         call.effect_key)
        if isinstance(error, AmbiguousEffect) and hold_ambiguous and not tampered:
            _seal([*lapsed_events, *events], lapsed_receipts, when)
            return Refused(error, record.attempt, False, call)
        _seal([*lapsed_events, *events, _refusal_event(call, error, when)],
              [*lapsed_receipts, _ReceiptSpec(call, Result.BLOCKED, str(error), record.attempt)], when)
        return Refused(error, record.attempt, True, call)


def _refusal_event(call: Call, error: CTRLRunError, when: dt.datetime) -> EventRow:
    if isinstance(error, DuplicateEffect):
        data = {"reason": "duplicate", "state": error.state}
    else:
        data = {"reason": "ambiguous"}
    return _event(EventType.EFFECT_RESERVATION_REFUSED, call, call.effect_key, data, when, call.approval_id)


def record_refusal(refused: Refused) -> None:
    """Write the evidence of a refusal that ``reserve`` held back."""
    with _phase() as when:
        call = refused.call
        _seal([_refusal_event(call, refused.error, when)],
              [_ReceiptSpec(call, Result.BLOCKED, str(refused.error), refused.attempt or 1)], when)


def renew_lease(call: Call, attempt: int, lease: dt.timedelta) -> bool:
    """The heartbeat: extend a live attempt's lease from the store's clock. False when the record
    has moved on (swept after this worker stopped renewing, or finished). A lease only moves later
    (the database refuses otherwise), so a clock that stepped back leaves the later lease in place."""
    key = call.effect_key
    assert key is not None
    text = call.pending.text if call.pending else None
    with _phase() as when:
        until = when + lease
        with _cursor() as cursor:
            cursor.execute(
                'UPDATE "ctrlrun_effectrecord" SET "lease_expires_at" = %s, "mac" = %s WHERE "effect_key" = %s AND '
                '"action_id" = %s AND "attempt" = %s AND "state" = %s AND "lease_expires_at" <= %s',
                [_time_param(connections[_db()])(until),
                 _effect_mac(key, call.action.name, S.EXECUTING, call.action.action_id, attempt, until, None, text),
                 key, call.action.action_id, attempt, S.EXECUTING.value, _time_param(connections[_db()])(until)])
            if cursor.rowcount == 1:
                return True
        record = _peek(key)
        return (record is not None and record.state == S.EXECUTING and record.action_id == call.action.action_id
                and record.attempt == attempt)


# --------------------------------------------------------------------------- approvals


@dataclass(frozen=True)
class ApprovalView:
    approval_id: str
    status: str
    action: str
    action_id: str
    action_hash: str
    action_json: str
    agent: str
    user: str | None
    effect_key: str | None
    policy_hash: str | None
    decision_reason: str
    created_at: dt.datetime
    expires_at: dt.datetime
    answered_at: dt.datetime | None
    approver: str | None
    note: str | None
    consumed_at: dt.datetime | None
    consumed_by: str | None
    #: False when the row does not carry ctrlrun's signature (written around ctrlrun).
    signature_ok: bool = True

    @property
    def canonical_action(self) -> dict[str, Any]:
        return json.loads(self.action_json)

    @property
    def arguments(self) -> dict[str, Any]:
        return self.canonical_action.get("arguments", {})


_APPROVAL_FIELDS = [f for f in ApprovalView.__dataclass_fields__ if f != "signature_ok"]


def _approval_view(row: Approval) -> ApprovalView:
    return ApprovalView(**{f: getattr(row, f) for f in _APPROVAL_FIELDS}, signature_ok=_approval_ok(row))


def request_approval(call: Call, ttl: dt.timedelta) -> ApprovalView:
    """An ``approve`` decision with nothing presented: a pending request bound to the action hash."""
    with _phase() as when:
        call = _started(call, when)
        action = call.action
        row = Approval(
            approval_id=new_id("apr_"), status=ApprovalStatus.PENDING, action=action.name,
            action_id=action.action_id, action_hash=action.hash,
            action_json=json.dumps(action.canonical(), ensure_ascii=False, sort_keys=True),
            agent=action.principal.agent, user=action.principal.user, effect_key=call.effect_key,
            policy_hash=call.policy_hash, decision_reason=call.reason, created_at=when, expires_at=when + ttl,
        )
        _sign_approval(row)
        row.save(using=_db(), force_insert=True)
        events = _opening_events(call, when)
        events.append(_event(EventType.APPROVAL_REQUESTED, call, call.effect_key,
                             {"action_hash": action.hash, "expires_at": evidence_time(row.expires_at)}, when,
                             row.approval_id))
        _seal(events, [], when)
    return _approval_view(row)


def _save_approval(row: Approval, fields: list[str]) -> None:
    _sign_approval(row)
    row.save(update_fields=[*fields, "mac"])


def _expire(row: Approval, when: dt.datetime, events: list[EventRow], call: Call | None = None) -> None:
    """Mark ``row`` expired; the event belongs to ``call`` when a call presenting it found it lapsed."""
    row.status = ApprovalStatus.EXPIRED
    _save_approval(row, ["status"])
    owner, key = (call, call.effect_key) if call is not None else (row.action_id, row.effect_key)
    events.append(_event(EventType.APPROVAL_EXPIRED, owner, key, {}, when, row.approval_id))


def _tampered_request(approval_id: str) -> InvalidArgument:
    return InvalidArgument(f"approval request {approval_id} cannot be answered: {TAMPERED_HINT}")


def answer_approval(approval_id: str, grant: bool, *, by: str, note: str | None = None) -> ApprovalView:
    """A human grants or denies a pending request. Used by the commands and the console alike.

    Only a pending, unexpired request that ctrlrun itself wrote can be answered; an expired one is
    marked expired (that write is kept) and refused. The person the call was made for (the
    principal's ``user``, compared as normalised identities) cannot answer it.
    """
    from .identity import same_person

    if not isinstance(by, str) or not by.strip():
        raise InvalidArgument("an approval needs the name of the person answering (--by NAME)")
    by = evidence_text(by.strip())
    note = evidence_text(note) if note else None
    expired: ApprovalView | None = None
    with _phase() as when:
        row = _q(Approval).select_for_update().filter(pk=approval_id).first()
        if row is None:
            raise InvalidArgument(f"no approval request {approval_id}; 'approvals' lists the requests")
        if not _approval_ok(row):
            raise _tampered_request(approval_id)
        if row.status != ApprovalStatus.PENDING:
            raise InvalidArgument(f"approval request {approval_id} is already {row.status}")
        if row.expires_at <= when:
            events: list[EventRow] = []
            _expire(row, when, events)
            _seal(events, [], when)
            expired = _approval_view(row)
        else:
            if row.user is not None and same_person(row.user, by):
                alias = "" if row.user == by else f" ({by!r} names the same person)"
                raise InvalidArgument(
                    f"this request for {row.action} was made on behalf of user {row.user}, who cannot answer "
                    f"it{alias}; another person must"
                )
            row.status = ApprovalStatus.GRANTED if grant else ApprovalStatus.DENIED
            row.approver = by
            row.note = note
            row.answered_at = when
            _save_approval(row, ["status", "approver", "note", "answered_at"])
            data: dict[str, Any] = {"approver": by}
            if grant:
                data["action_hash"] = row.action_hash
            if note:
                data["note"] = note
            kind = EventType.APPROVAL_GRANTED if grant else EventType.APPROVAL_DENIED
            _seal([_event(kind, row.action_id, row.effect_key, data, when, row.approval_id)], [], when)
    if expired is not None:
        raise InvalidArgument(
            f"approval {approval_id} expired at {evidence_time(expired.expires_at)}; the agent must ask again"
        )
    return _approval_view(row)


def expire_if_due(approval_id: str) -> ApprovalView | None:
    """Mark a pending or granted request expired if its time is up (``wait=True`` giving up)."""
    with _phase() as when:
        row = _q(Approval).select_for_update().filter(pk=approval_id).first()
        if row is None:
            return None
        if (row.status in (ApprovalStatus.PENDING, ApprovalStatus.GRANTED) and row.expires_at <= when
                and _approval_ok(row)):
            events: list[EventRow] = []
            _expire(row, when, events)
            _seal(events, [], when)
    return _approval_view(row)


def get_approval(approval_id: str) -> ApprovalView | None:
    with _reading():
        row = _q(Approval).filter(pk=approval_id).first()
        return _approval_view(row) if row else None


def list_approvals(status: str | None = None) -> list[ApprovalView]:
    """Pending first (oldest first), then the rest, newest first."""
    query = _q(Approval).all()
    if status:
        query = query.filter(status=status)
    rows = list(query.order_by("created_at"))
    pending = [r for r in rows if r.status == ApprovalStatus.PENDING]
    others = [r for r in reversed(rows) if r.status != ApprovalStatus.PENDING]
    return [_approval_view(r) for r in pending + others]


def approvals_for_hash(action_hash: str) -> list[ApprovalView]:
    return [_approval_view(r) for r in _q(Approval).filter(action_hash=action_hash).order_by("created_at")]


def _take_presented(call: Call, presented: str | None, when: dt.datetime,
                    events: list[EventRow]) -> tuple[Call, Approval | None, Refused | None]:
    """Check a presented approval for an ``approve`` decision, in §8.4's order.

    Returns the call stamped with the approval, the row to consume once the effect is taken,
    or a refusal whose evidence (and the events so far) is already written. An approval that
    does not carry ctrlrun's signature (a status set around ctrlrun) is refused as ``tampered``
    before anything it says is believed.
    """
    if presented is None or call.decision is not Decision.APPROVE:
        if presented is not None and call.decision is Decision.DENY:
            call = replace(call, approval_id=presented)
        return call, None, None
    row = _q(Approval).select_for_update().filter(pk=presented).first()
    genuine = row is not None and _approval_ok(row)
    call = replace(call, approval_id=presented, approver=row.approver if genuine else None)
    error: CTRLRunError | None = None
    if row is None:
        error = ApprovalMismatch(f"no approval {presented}", reason="unknown", approval_id=presented)
    elif not genuine:
        error = ApprovalMismatch(f"approval {presented} cannot be used: {TAMPERED_HINT}", reason="tampered",
                                 approval_id=presented)
    elif row.action_hash != call.action.hash:
        error = ApprovalMismatch(
            f"approval {presented} authorizes {row.action_hash}, not {call.action.hash}: it was granted for a "
            f"different call (other arguments, agent, resource or environment)",
            reason="mismatch", approval_id=presented,
        )
    elif row.status == ApprovalStatus.DENIED:
        error = ActionDenied(f"approval {presented} was denied by {row.approver}", reason="approval_denied",
                             action_id=call.action.action_id)
    elif row.status != ApprovalStatus.GRANTED:
        error = ApprovalMismatch(f"approval {presented} is {row.status}, not granted", reason=str(row.status),
                                 approval_id=presented)
    elif row.expires_at <= when:
        _expire(row, when, events, call)
        error = ApprovalMismatch(f"approval {presented} expired at {evidence_time(row.expires_at)}; ask again",
                                 reason="expired", approval_id=presented)
    if error is None:
        return call, row, None
    if isinstance(error, ActionDenied):
        events.append(_event(EventType.APPROVAL_DENIED, call, call.effect_key, {"approver": row.approver}, when,
                             presented))
        events.append(_event(EventType.ACTION_DENIED, call, call.effect_key, {"reason": "approval_denied"}, when))
        _seal(events, [_ReceiptSpec(call, Result.DENIED, str(error), None, "approval_denied")], when)
    else:
        events.append(_event(EventType.APPROVAL_INVALIDATED, call, call.effect_key,
                             {"reason": error.reason, "action_hash": call.action.hash}, when, presented))
        _seal(events, [_ReceiptSpec(call, Result.BLOCKED, str(error), None)], when)
    return call, None, Refused(error, None, True, call)


def _consumption_event(row: Approval, call: Call, when: dt.datetime, *, required: bool) -> EventRow:
    data: dict[str, Any] = {"approver": row.approver}
    if not required:
        data["required"] = False
    return _event(EventType.APPROVAL_CONSUMED, call, call.effect_key, data, when, row.approval_id)


def _mark_consumed(row: Approval, call: Call, when: dt.datetime) -> None:
    row.status = ApprovalStatus.CONSUMED
    row.consumed_at = when
    row.consumed_by = call.action.action_id
    _save_approval(row, ["status", "consumed_at", "consumed_by"])


def _matching_approval(call: Call, presented: str, when: dt.datetime) -> tuple[Approval | None, Call]:
    """An approval presented on an allowed call is used up only if it is for exactly this call."""
    row = _q(Approval).select_for_update().filter(pk=presented).first()
    if (row is None or not _approval_ok(row) or row.action_hash != call.action.hash
            or row.status != ApprovalStatus.GRANTED or row.expires_at <= when):
        logger.info("approval %s presented on allowed call %s was not used (it does not match or is not granted)",
                    presented, call.action.action_id)
        return None, call
    return row, replace(call, approval_id=presented, approver=row.approver)


# --------------------------------------------------------------------------- outcome


def _jsonable_result(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = json.dumps(repr(value))
    return evidence_text(text)


_STATE_FOR = {Result.COMMITTED: S.COMMITTED, Result.FAILED: S.FAILED, Result.AMBIGUOUS: S.AMBIGUOUS}
_EVENT_FOR = {Result.COMMITTED: EventType.EXECUTION_COMMITTED, Result.FAILED: EventType.EXECUTION_FAILED,
              Result.AMBIGUOUS: EventType.EXECUTION_AMBIGUOUS}
_OUTCOME_UPDATE = (
    'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "lease_expires_at" = NULL, "error" = %s, "result_json" = %s, '
    '"updated_at" = {time}, "pending" = NULL, "mac" = %s WHERE "effect_key" = %s AND "action_id" = %s AND '
    '"attempt" = %s AND "state" = %s AND "resolved_by" IS NULL{returning}'
)
#: PostgreSQL: the row's time and the phase's come from the one statement (now() is the transaction's).
_OUTCOME_UPDATE_NOW = _OUTCOME_UPDATE.format(time="now()", returning=' RETURNING now()')
_OUTCOME_UPDATE_AT = _OUTCOME_UPDATE.format(time="%s", returning="")


def record_outcome(call: Call, attempt: int | None, result: Result, *, error: str | None = None,
                   value: Any = None, write_receipt: bool = True) -> OutcomeWrite:
    """Record how the function ended (§5.4), if this attempt still holds the row.

    ``result`` is committed, failed or ambiguous. When the row moved on meanwhile (this attempt's
    lease lapsed and someone swept it, or a human resolved it since), the row is left as it is
    and the call is recorded ambiguous: the function may have acted, and nobody recorded it.
    """
    key = call.effect_key
    data = {} if result is Result.COMMITTED else {"error": error}

    def outcome(when: dt.datetime) -> EventRow:
        return _event(_EVENT_FOR[result], call, key, data, when, call.approval_id)

    def receipts() -> list[_ReceiptSpec]:
        return [_ReceiptSpec(call, result, error, attempt)] if write_receipt else []

    with _phase(clock=False) as when:
        if key is None:
            _seal((), (), when, build=lambda at: ([outcome(at)], receipts()), sizes=(1, len(receipts())))
            return OutcomeWrite(True)
        state = _STATE_FOR[result]
        fields = [state.value, error, _jsonable_result(value) if result is Result.COMMITTED else None]
        holder = [_effect_mac(key, call.action.name, state, call.action.action_id, attempt, None, None, None), key,
                  call.action.action_id, attempt]
        with _cursor() as cursor:
            # One conditional UPDATE both checks that this attempt still holds the row and moves it.
            for held in ((S.EXECUTING,) if result is not Result.AMBIGUOUS else (S.EXECUTING, S.AMBIGUOUS)):
                # Swept while it ran, and now it knows it hit an exception: that is recorded too
                # (ambiguous, idempotently); whoever swept it already wrote its opening events.
                if when is None:
                    row = cursor.execute(_OUTCOME_UPDATE_NOW, [*fields, *holder, held.value]).fetchone()
                    moved, at = row is not None, row[0] if row is not None else None
                else:
                    cursor.execute(_OUTCOME_UPDATE_AT, [*fields, _time_param(cursor.connection)(when), *holder,
                                                        held.value])
                    moved, at = cursor.rowcount == 1, when
                if moved:
                    waiting = call.pending.events if call.pending and held is S.EXECUTING else ()
                    _seal([*waiting, outcome(at)], receipts(), at)
                    return OutcomeWrite(True)
        when = when or _clock()
        record = _q(EffectRecord).filter(pk=key).first()
        refusal = _outcome_refusal(key, record)
        if result is Result.COMMITTED:
            why = f"the function returned, so the remote may well have acted, and the outcome write was refused: AmbiguousEffect: {refusal}"
        elif result is Result.FAILED:
            why = f"the function raised NotExecuted: {error}, and the outcome write was refused: AmbiguousEffect: {refusal}"
        else:
            why = f"{error}; and the outcome write was refused: AmbiguousEffect: {refusal}"
        _seal([_event(EventType.EXECUTION_AMBIGUOUS, call, key, {"error": why}, when, call.approval_id)],
              [_ReceiptSpec(call, Result.AMBIGUOUS, why, attempt)], when)
        return OutcomeWrite(False, refusal)


def _outcome_refusal(key: str, record: EffectRecord | None) -> AmbiguousEffect:
    if record is None:
        what = "its record is gone"
    elif record.resolved_by:
        what = f"it was resolved {record.state} by {record.resolved_by} while this attempt ran"
    elif record.state == S.AMBIGUOUS:
        what = "this attempt's lease lapsed and another attempt marked it ambiguous"
    else:
        what = f"it is now {record.state} under {record.action_id} (attempt {record.attempt})"
    return AmbiguousEffect(
        f"the outcome of effect '{key}' could not be recorded: {what}. Check the remote, then resolve it with "
        f"'ctrlrun resolve {key} --committed' or '--failed'",
        effect_key=key, action_id=record.action_id if record else None,
    )


# --------------------------------------------------------------------------- reconciliation and humans


def _move_ambiguous(record: EffectRecord, state: EffectState, resolver: str, when: dt.datetime) -> None:
    record.error = f"resolved {state.value} by {resolver} (was: {record.error})"
    record.state = state
    record.resolved_by = resolver
    record.reconcile_after = None
    record.updated_at = when
    record.mac = _effect_mac(record.effect_key, record.action, state, record.action_id, record.attempt, None,
                             resolver, None)
    record.save(update_fields=["state", "error", "resolved_by", "reconcile_after", "updated_at", "mac"])


def record_reconciliation(effect_key: str, action_id: str | None, resolver: str, trigger: str,
                          answer: HookAnswer, *, attempt: int, receipt_for: Call | None = None,
                          receipt_attempt: int | None = None, receipt_error: str | None = None,
                          requested_by: str | None = None) -> str | None:
    """Record a hook's answer and apply it to an ambiguous record.

    Returns the new state (``committed``/``failed``), ``"dropped"`` when the answer no longer
    applies, or None when nothing moved (the hook could not say).

    ``unknown`` (and a hook that raised or said nonsense) moves nothing; it pushes the next
    deferred attempt back (exponential, capped). The answer is about ``attempt``, the attempt
    the hook was asked about: if the record is no longer ambiguous at that attempt (someone else
    answered first, or a later attempt has run since), or its ambiguous state was not written by
    ctrlrun, the answer is dropped, never applied to a state it does not describe.
    ``receipt_for`` writes the eager trigger's ambiguous receipt after the reconciliation events,
    in the same transaction.
    """
    moved: str | None = None
    with _phase() as when:
        record = _q(EffectRecord).select_for_update().filter(pk=effect_key).first()
        events = [
            _event(EventType.RECONCILIATION_STARTED, action_id, effect_key,
                   {"effect_key": effect_key, "trigger": trigger,
                    **({"requested_by": requested_by} if requested_by else {})},
                   when - dt.timedelta(seconds=max(answer.duration, 0.0))),
            _event(EventType.RECONCILIATION_RESOLVED, action_id, effect_key, answer.data(), when),
        ]
        if record is None or record.state != S.AMBIGUOUS or record.attempt != attempt or not _effect_ok(record):
            if record is not None and record.state == S.AMBIGUOUS and record.attempt == attempt:
                now_is = f"ambiguous at attempt {attempt}, but {TAMPERED_HINT}"
            else:
                now_is = f"{record.state} at attempt {record.attempt}" if record else "gone"
            logger.warning("reconcile answer %r for %s (attempt %s) dropped: the record is %s now", answer.outcome,
                           effect_key, attempt, now_is)
            events[-1][5]["dropped"] = f"the record is {now_is}; this answer was about attempt {attempt}"
            moved = "dropped"
        elif answer.outcome in ("committed", "not_executed"):
            state = S.COMMITTED if answer.outcome == "committed" else S.FAILED
            _move_ambiguous(record, state, resolver, when)
            moved = state.value
            events.append(_event(EventType.EFFECT_RESOLVED, action_id, effect_key,
                                 {"state": state.value, "resolver": resolver, "resolved_by": "reconcile"}, when))
        else:
            first, cap = conf.reconcile_backoff()
            delay = min(first * (2 ** min(record.reconcile_failures, 30)), cap)
            record.reconcile_failures += 1
            record.reconcile_after = when + delay
            record.save(update_fields=["reconcile_failures", "reconcile_after"])
        receipts = [] if receipt_for is None else [
            _ReceiptSpec(receipt_for, Result.AMBIGUOUS, receipt_error, receipt_attempt)]
        _seal(events, receipts, when)
    return moved


def write_ambiguous_receipt(call: Call, attempt: int | None, error: str) -> None:
    """The eager trigger's receipt when the hook itself never returned (it raised a BaseException)."""
    with _phase() as when:
        _seal([], [_ReceiptSpec(call, Result.AMBIGUOUS, error, attempt)], when)


def resolve(effect_key: str, outcome: str, *, by: str, reason: str | None = None,
            attempt: int | None = None) -> EffectView:
    """A human says what happened to an ambiguous effect (``committed`` or ``failed``)."""
    if outcome not in ("committed", "failed"):
        raise InvalidArgument(f"say which it was: committed or failed, not {outcome!r}")
    if not by or not by.strip():
        raise InvalidArgument("a resolution needs the name of the person who decided it (--by NAME)")
    with _phase() as when:
        record = _q(EffectRecord).select_for_update().filter(pk=effect_key).first()
        if record is None:
            raise InvalidArgument(f"no effect '{effect_key}' to resolve")  # the caller says where to look
        if record.state != S.AMBIGUOUS:
            hint = ""
            if record.state in (S.RESERVED, S.EXECUTING) and record.lease_expires_at <= when:
                hint = " (its lease has lapsed: a reconcile pass sweeps it to ambiguous first)"
            raise InvalidArgument(
                f"effect '{effect_key}' is {record.state}, not ambiguous; only an effect with an unknown "
                f"outcome is resolved by hand{hint}"
            )
        if not _effect_ok(record):
            raise InvalidArgument(f"effect '{effect_key}' says ambiguous, but {TAMPERED_HINT}. It may still be "
                                  f"running; it is not resolved")
        if attempt is not None and attempt != record.attempt:
            raise InvalidArgument(
                f"effect '{effect_key}' is at attempt {record.attempt}, not {attempt}: it moved since you "
                f"looked. Check it again before resolving"
            )
        resolver = evidence_text(by.strip())
        state = S.COMMITTED if outcome == "committed" else S.FAILED
        _move_ambiguous(record, state, resolver, when)
        data = {"state": state.value, "resolver": resolver, "resolved_by": "human", "attempt": record.attempt}
        if reason:
            data["reason"] = evidence_text(reason)
        _seal([_event(EventType.EFFECT_RESOLVED, record.action_id, effect_key, data, when)], [], when)
    return _effect_view(record)


def sweep_lapsed(action: str | None = None, effect_key: str | None = None) -> list[EffectView]:
    """Move every held record whose lease lapsed to ambiguous (its worker died, hung or was frozen
    past its lease), writing the dead attempt's evidence. Leases are compared with the store's clock."""
    swept: list[EffectView] = []
    with _reading():
        cutoff = _clock()
        query = _q(EffectRecord).filter(state__in=[S.RESERVED, S.EXECUTING], lease_expires_at__lte=cutoff)
        if action:
            query = query.filter(action=action)
        if effect_key:
            query = query.filter(pk=effect_key)
        keys = list(query.values_list("effect_key", flat=True))
    for key in keys:
        with _phase() as when:
            record = _peek(key)
            if record is None or record.state != S.EXECUTING or record.lease_expires_at > when:
                continue  # its worker finished or renewed, or someone else swept it, meanwhile
            if not _effect_ok(record):
                logger.error("effect %s has a lapsed lease, but %s; it is not swept", key, TAMPERED_HINT)
                continue
            events: list[EventRow] = []
            receipts: list[_ReceiptSpec] = []
            _lapse(record, when, events, receipts)
            _seal(events, receipts, when)
        view = get_effect(key)
        if view is not None:
            swept.append(view)
    return swept


def reconcile_candidates(action: str | None = None, limit: int | None = None) -> list[EffectView]:
    """Ambiguous records due for a deferred reconcile (backoff respected), oldest first."""
    from django.db.models import Q

    with _reading():
        cutoff = _clock()
        query = _q(EffectRecord).filter(state=S.AMBIGUOUS).filter(
            Q(reconcile_after__isnull=True) | Q(reconcile_after__lte=cutoff)
        ).order_by("updated_at", "effect_key")
        if action:
            query = query.filter(action=action)
        if limit:
            query = query[:limit]
        return [_effect_view(r) for r in query]


# --------------------------------------------------------------------------- reading


def _effect_view(record: EffectRecord) -> EffectView:
    return EffectView(
        effect_key=record.effect_key, action=record.action, state=record.state, action_id=record.action_id,
        attempt=record.attempt, lease_expires_at=record.lease_expires_at, error=record.error,
        resolved_by=record.resolved_by, reconcile_failures=record.reconcile_failures,
        reconcile_after=record.reconcile_after, created_at=record.created_at, updated_at=record.updated_at,
        signature_ok=_effect_ok(record),
    )


def _receipt_view(row: Receipt) -> ReceiptView:
    return ReceiptView(
        receipt_id=row.receipt_id, seq=row.seq, action_id=row.action_id, action=row.action, agent=row.agent,
        decision=row.decision, result=row.result, effect_key=row.effect_key, ts=row.ts, document=row.document,
    )


def _event_view(row: Event) -> EventView:
    return EventView(id=row.id, ts=row.ts, type=row.type, action_id=row.action_id, effect_key=row.effect_key,
                     approval_id=row.approval_id, data=row.data)


def _waiting_views(records: Any) -> list[EventView]:
    """The opening events of running attempts, not yet in the chain (shown with id 0)."""
    views = []
    for text in records:
        try:
            _, _, waiting = _unstash(text)
        except (ValueError, KeyError, TypeError, CTRLRunError):
            continue
        views += [EventView(0, ts, type_, action_id, key, approval_id, data)
                  for ts, type_, action_id, key, approval_id, data, _ in waiting]
    return views


def get_effect(effect_key: str) -> EffectView | None:
    with _reading():
        record = _q(EffectRecord).filter(pk=effect_key).first()
        return _effect_view(record) if record else None


def list_effects(state: str | None = None) -> list[EffectView]:
    query = _q(EffectRecord).order_by("updated_at", "effect_key")
    if state:
        query = query.filter(state=state)
    return [_effect_view(r) for r in query]


def list_receipts(last: int | None = None) -> list[ReceiptView]:
    query = _q(Receipt).order_by("-seq") if last else _q(Receipt).order_by("seq")
    rows = list(query[:last]) if last else list(query)
    if last:
        rows.reverse()
    return [_receipt_view(r) for r in rows]


def get_receipt(receipt_id: str) -> ReceiptView | None:
    row = _q(Receipt).filter(pk=receipt_id).first()
    return _receipt_view(row) if row else None


def receipts_for_action(action_id: str) -> list[ReceiptView]:
    return [_receipt_view(r) for r in _q(Receipt).filter(action_id=action_id).order_by("seq")]


def events_for_action(action_id: str) -> list[EventView]:
    """Every event of one action, in the order written; a running call's waiting events last."""
    chained = [_event_view(e) for e in _q(Event).filter(action_id=action_id).order_by("id")]
    waiting = [r.pending for r in _q(EffectRecord).filter(action_id=action_id, pending__isnull=False) if _effect_ok(r)]
    return chained + [e for e in _waiting_views(waiting) if e.action_id == action_id]


def events_for_effect(effect_key: str) -> list[EventView]:
    chained = [_event_view(e) for e in _q(Event).filter(effect_key=effect_key).order_by("id")]
    waiting = [r.pending for r in _q(EffectRecord).filter(pk=effect_key, pending__isnull=False) if _effect_ok(r)]
    return chained + _waiting_views(waiting)


def receipts_for_effect(effect_key: str) -> list[ReceiptView]:
    return [_receipt_view(r) for r in _q(Receipt).filter(effect_key=effect_key).order_by("seq")]


#: Receipt columns that repeat a field of the hashed document (``agent`` is principal.agent,
#: ``ts`` is finished_at): lists, filters and the date hierarchy read them, so each is checked.
_RECEIPT_COLUMNS = (*INDEXED_COLUMNS, "ts")
_EVENT_FIELDS = ("id", "seq", "prev_hash", "hash", "ts", "type", "action_id", "effect_key", "approval_id")


def _time_column(connection: Any) -> str:
    """The ts column as read for verification: on SQLite its text (a row altered into an impossible
    time must be a named break, not a crash in the driver's converter)."""
    return 'CAST("ts" AS TEXT)' if connection.vendor == "sqlite" else '"ts"'


def _read_time(value: Any, connection: Any) -> dt.datetime | None:
    try:
        return _as_datetime(value, connection)
    except (TypeError, ValueError):
        return None


def _stored_receipts(after: int | None = None, upto: int | None = None) -> list[StoredReceipt]:
    """Receipt rows as stored (all, or those with ``after < seq <= upto``), in no particular order."""
    if after is None:
        return _stored_receipts_where("1 = 1", [])
    return _stored_receipts_where('"seq" > %s AND "seq" <= %s', [after, upto])


def _stored_events(after: int | None = None, upto: int | None = None) -> list[StoredEvent]:
    """Event rows as stored, ``data`` as the column's exact text (a row altered into invalid JSON is
    a named break, not a crash); optionally only those with ``after < seq <= upto``."""
    if after is None:
        return _stored_events_where("1 = 1", [])
    return _stored_events_where('"seq" > %s AND "seq" <= %s', [after, upto])


def _chain_facts(events: list[StoredEvent]) -> tuple[dict[str, int], set[str], dict[str, set[str]]]:
    """What the event chain says happened, by effect key and approval: the highest attempt reserved,
    the keys committed (which stay committed for ever), and each approval's answers and use."""
    reserved: dict[str, int] = {}
    committed: set[str] = set()
    answered: dict[str, set[str]] = {}
    for event in events:
        if event.approval_id and event.type in ("APPROVAL_GRANTED", "APPROVAL_DENIED", "APPROVAL_CONSUMED"):
            answered.setdefault(event.approval_id, set()).add(event.type)
        if not event.effect_key or event.type not in ("EFFECT_RESERVED", "EXECUTION_COMMITTED", "EFFECT_RESOLVED"):
            continue
        try:
            data = json.loads(event.data)
        except ValueError:
            continue  # an unreadable row is already a named break
        if event.type == "EFFECT_RESERVED" and isinstance(data.get("attempt"), int):
            reserved[event.effect_key] = max(reserved.get(event.effect_key, 0), data["attempt"])
        elif event.type == "EXECUTION_COMMITTED" or data.get("state") == "committed":
            committed.add(event.effect_key)
    return reserved, committed, answered


#: What each approval event implies about the row's status, whatever came after.
_APPROVAL_IMPLIES = {"APPROVAL_CONSUMED": {"consumed"}, "APPROVAL_GRANTED": {"granted", "consumed", "expired"},
                     "APPROVAL_DENIED": {"denied"}}


def _approval_breaks(row: Approval, answered: dict[str, set[str]]) -> list[ChainBreak]:
    """What is wrong with one approval row: its signature, or a status the event chain contradicts."""
    if not _approval_ok(row):
        return [ChainBreak(
            "signature_invalid", None, f"approval {row.approval_id} ({row.status}, approver "
            f"{row.approver or '-'}) does not carry ctrlrun's signature: it was written or changed "
            f"outside ctrlrun, and will not be used", kind="approval", subject=row.approval_id)]
    return [ChainBreak(
        "rewound", None, f"approval {row.approval_id} says {row.status}, but the event chain "
        f"records {kind}: the row and the chain disagree (an older row was put back, or the event "
        f"was forged)", kind="approval", subject=row.approval_id)
        for kind in sorted(answered.get(row.approval_id, ())) if str(row.status) not in _APPROVAL_IMPLIES[kind]]


def _effect_breaks(record: EffectRecord, reserved: dict[str, int], committed: set[str]) -> list[ChainBreak]:
    """What is wrong with one effect record: its signature, or an attempt or state the chain contradicts."""
    if not _effect_ok(record):
        return [ChainBreak(
            "signature_invalid", None, f"effect record {record.effect_key} ({record.state}, attempt "
            f"{record.attempt}) does not carry ctrlrun's signature: it was written or changed outside "
            f"ctrlrun, and will not be retried, swept or resolved", kind="effect", subject=record.effect_key)]
    later = reserved.get(record.effect_key, 0)
    if record.attempt < later or (record.effect_key in committed and record.state != S.COMMITTED):
        return [ChainBreak(
            "rewound", None, f"effect record {record.effect_key} says {record.state} at attempt "
            f"{record.attempt}, but the event chain records attempt {later}"
            + (" and a commit" if record.effect_key in committed else "") + ": the row and the chain "
            "disagree (an older row was put back, or the events were forged)",
            kind="effect", subject=record.effect_key)]
    return []


def verify(progress: Any = None) -> ChainReport:
    """Re-hash every receipt and event, walk both chains (§9.4), check every signature, and check
    that each signed row agrees with what the event chain says happened to it, without stopping
    writers.

    Evidence and the head move in one transaction, so after reading the rows and then the head,
    every row up to the head is committed: any the first read missed (written meanwhile) is read
    once more. A row beyond the head can then only be one written around ctrlrun. A signed row put
    back from an earlier moment (a committed key's record rewound to failed, a consumed approval
    back to granted) carries a genuine signature: the chain is what shows it is out of date.

    ``progress(text)``, if given, hears about long work (every ``PROGRESS_EVERY`` rows re-hashed).
    """
    say = _progress_reporter(progress)
    with _reading():
        receipts = _stored_receipts()
        events = _stored_events()
        seq, hash_, event_seq, event_hash_, mac, key_id = _read_head()
        seen = max((r.seq for r in receipts if r.seq is not None), default=0)
        if seq > seen:
            receipts += _stored_receipts(seen, seq)
        seen = max((e.seq for e in events if e.seq is not None), default=0)
        if event_seq > seen:
            events += _stored_events(seen, event_seq)
        if say:
            say(f"read {len(receipts):,} receipts and {len(events):,} events")
        report = verify_chain(receipts, seq, hash_, progress=say and (
            lambda done: say(f"{done:,} of {len(receipts):,} receipts re-hashed")))
        verify_events(events, event_seq, event_hash_, report, progress=say and (
            lambda done: say(f"{done:,} of {len(events):,} events re-hashed")))
        problem = _head_problem(seq, hash_, event_seq, event_hash_, mac, key_id)
        if problem is not None:
            report.breaks.append(ChainBreak("signature_invalid", seq, problem, kind="head"))
        checked = 1
        reserved, committed, answered = _chain_facts(
            sorted((e for e in events if e.seq is not None and e.seq <= event_seq), key=lambda e: e.seq))
        for row in _q(Approval).order_by("created_at").iterator():
            checked += 1
            report.breaks += _approval_breaks(row, answered)
        for record in _q(EffectRecord).order_by("effect_key").iterator():
            checked += 1
            report.breaks += _effect_breaks(record, reserved, committed)
        report.signatures_checked = checked
    return report


# --------------------------------------------------------------------------- recorded checks
#
# Each verification is recorded (``ChainCheck``, append-only and signed), so the console can show
# the last result without re-hashing anything, and an incremental check can start where the last
# intact one stopped.

CHECK_DOMAIN = "ctrlrun.check/v1"
#: How far before the last intact check an incremental one still re-reads signed rows by their
#: times: a phase reads its clock before it commits, so a row may carry a time a little before
#: the check that could not yet see it.
_SINCE_MARGIN = dt.timedelta(minutes=15)
#: Rows an incremental check reads per statement.
_BATCH = 10_000


def _progress_reporter(progress: Any) -> Any:
    """``progress`` with the time since the start on each line (None stays None)."""
    if progress is None:
        return None
    import time

    started = time.monotonic()
    return lambda text: progress(f"{text} ({time.monotonic() - started:.1f} s)")


@dataclass(frozen=True)
class ChainCheckView:
    """One recorded verification."""

    id: int
    checked_at: dt.datetime
    mode: str
    from_receipt_seq: int
    receipt_seq: int
    receipt_hash: str
    from_event_seq: int
    event_seq: int
    event_hash: str
    ok: bool
    breaks: int
    receipts_checked: int
    events_checked: int
    signatures_checked: int
    summary: str
    duration_seconds: float
    ran_by: str
    #: Whether the row carries ctrlrun's signature (a row written around ctrlrun does not).
    signature_ok: bool


def _check_document(row: ChainCheck) -> tuple:
    return (_iso(row.checked_at), row.mode, row.from_receipt_seq, row.receipt_seq, row.receipt_hash,
            row.from_event_seq, row.event_seq, row.event_hash, bool(row.ok), row.breaks, row.receipts_checked,
            row.events_checked, row.signatures_checked, _digest(row.summary), repr(float(row.duration_seconds)),
            row.ran_by)


def _check_ok(row: ChainCheck) -> bool:
    return _signed_ok(CHECK_DOMAIN, _check_document, row)


def _check_view(row: ChainCheck) -> ChainCheckView:
    return ChainCheckView(
        id=row.id, checked_at=row.checked_at, mode=row.mode, from_receipt_seq=row.from_receipt_seq,
        receipt_seq=row.receipt_seq, receipt_hash=row.receipt_hash, from_event_seq=row.from_event_seq,
        event_seq=row.event_seq, event_hash=row.event_hash, ok=bool(row.ok), breaks=row.breaks,
        receipts_checked=row.receipts_checked, events_checked=row.events_checked,
        signatures_checked=row.signatures_checked, summary=row.summary, duration_seconds=row.duration_seconds,
        ran_by=row.ran_by, signature_ok=_check_ok(row))


def _summary(report: ChainReport) -> str:
    """A check's verdict in a line or a few: what was walked, and the first breaks."""
    walked = (f"{report.verified:,} of {report.chained + report.unchained:,} receipts, {report.events_verified:,} "
              f"of {report.events_chained + report.events_unchained:,} events, {report.signatures_checked or 0:,} "
              f"signed rows")
    if report.mode != "full":
        walked += f" (after receipt {report.from_seq:,}, event {report.from_event_seq:,})"
    if report.ok:
        return f"intact: {walked}"
    shown = [f"{b.name} ({b.kind}{'' if b.seq is None else f' seq {b.seq}'}"
             f"{'' if b.subject is None or b.kind in ('receipt', 'event') else f' {b.subject}'})"
             for b in report.breaks[:10]]
    more = f"; and {len(report.breaks) - 10} more" if len(report.breaks) > 10 else ""
    return f"broken: {len(report.breaks)} break(s): {'; '.join(shown)}{more}. Checked {walked}"


def record_check(report: ChainReport, *, started: dt.datetime, duration: float, ran_by: str) -> ChainCheckView:
    """Record a verification's result (signed, append-only); returns what was recorded."""
    row = ChainCheck(
        checked_at=started, mode=ChainCheck.INCREMENTAL if report.mode == "incremental" else ChainCheck.FULL,
        from_receipt_seq=report.from_seq, receipt_seq=report.head_seq, receipt_hash=report.head_hash,
        from_event_seq=report.from_event_seq, event_seq=report.event_head_seq, event_hash=report.event_head_hash,
        ok=report.ok, breaks=len(report.breaks), receipts_checked=report.chained + report.unchained,
        events_checked=report.events_chained + report.events_unchained,
        signatures_checked=report.signatures_checked or 0, summary=_summary(report),
        duration_seconds=round(float(duration), 6), ran_by=ran_by[:200])
    row.mac = signing.sign(CHECK_DOMAIN, _check_document(row))
    with _phase(clock=False):
        row.save(using=_db(), force_insert=True)
    return _check_view(row)


def run_check(*, incremental: bool, ran_by: str, progress: Any = None) -> tuple[ChainReport, CTRLRunError | None]:
    """Run a full (or incremental) check, timed on the store's clock, and record it. Returns the
    report and, when the result could not be recorded, why (the report stands either way)."""
    started, clock = now(), time.monotonic()
    report = verify_incremental(progress) if incremental else verify(progress)
    try:
        record_check(report, started=started, duration=time.monotonic() - clock, ran_by=ran_by)
    except CTRLRunError as exc:
        return report, exc
    return report, None


def last_check() -> ChainCheckView | None:
    """The newest recorded verification, or None (never checked)."""
    with _reading():
        row = _q(ChainCheck).order_by("-id").first()
        return _check_view(row) if row else None


_HEAD_FIELDS = ("seq", "hash", "event_seq", "event_hash", "mac", "key_id")


def _read_head() -> tuple[Any, ...]:
    """The chain head as (seq, hash, event seq, event hash, mac, key id); the genesis when there is none."""
    row = _q(ChainHead).filter(pk=1).values_list(*_HEAD_FIELDS).first()
    return tuple(row) if row is not None else (0, GENESIS_HASH, 0, GENESIS_HASH, None, None)


def head_position() -> tuple[int, int]:
    """(receipt seq, event seq) of the chain head: how much evidence there is, in one indexed read."""
    with _reading():
        row = _q(ChainHead).filter(pk=1).values_list("seq", "event_seq").first()
        return (row[0], row[1]) if row else (0, 0)


def _ordered_batches(read: Any, after: int) -> Iterator[list[Any]]:
    """Rows with seq > ``after`` in seq order, ``_BATCH`` at a time (keyset: each batch starts after the
    last seq seen, so a long chain is never held in memory at once)."""
    while True:
        rows = read(after)
        if not rows:
            return
        yield rows
        after = rows[-1].seq
        if len(rows) < _BATCH:
            return


def _receipts_after(after: int, upto: int | None = None) -> list[StoredReceipt]:
    """Chained receipts with ``after < seq`` (``<= upto``), in seq order, at most ``_BATCH``."""
    return _stored_receipts_where('"seq" > %s' + (' AND "seq" <= %s' if upto is not None else ""),
                                  [after] + ([upto] if upto is not None else []), order=True)


def _stored_receipts_where(condition: str, params: list[Any], *, order: bool = False) -> list[StoredReceipt]:
    connection = connections[_db()]
    columns = ",".join(f'"{c}"' for c in _RECEIPT_COLUMNS[:-1])
    sql = (f'SELECT "receipt_id","seq","prev_hash","hash","document",{columns},{_time_column(connection)} '
           f'FROM "ctrlrun_receipt" WHERE {condition}')
    if order:
        sql += f' ORDER BY "seq" LIMIT {_BATCH}'
    with _cursor() as cursor:
        rows = cursor.execute(sql, params).fetchall()
    out = []
    for receipt_id, seq, prev, digest, document, *values in rows:
        moment = _read_time(values[-1], connection)
        values[-1] = evidence_time(moment) if moment is not None else values[-1]
        out.append(StoredReceipt(receipt_id, seq, prev, digest, document, tuple(zip(_RECEIPT_COLUMNS, values))))
    return out


def _stored_events_where(condition: str, params: list[Any], *, order: bool = False) -> list[StoredEvent]:
    connection = connections[_db()]
    fields = ",".join(_time_column(connection) if f == "ts" else f'"{f}"' for f in _EVENT_FIELDS)
    sql = f'SELECT {fields},"data" FROM "ctrlrun_event" WHERE {condition}'
    if order:
        sql += f' ORDER BY "seq", "id" LIMIT {_BATCH}'
    with _cursor() as cursor:
        rows = cursor.execute(sql, params).fetchall()
    return [StoredEvent(id_, seq, prev, digest, _read_time(ts, connection), type_, action_id, key, approval_id,
                        data) for id_, seq, prev, digest, ts, type_, action_id, key, approval_id, data in rows]


def _events_after(after: int, upto: int | None = None) -> list[StoredEvent]:
    return _stored_events_where('"seq" > %s' + (' AND "seq" <= %s' if upto is not None else ""),
                                [after] + ([upto] if upto is not None else []), order=True)


def _anchor_breaks(kind: str, table: str, seq: int, hash_: str, check: ChainCheck) -> list[ChainBreak]:
    """Whether the position an incremental check starts from is still as the last intact check left it:
    the row at that seq still holds the hash it had, and exactly ``seq`` chained rows lie at or before it
    (nothing removed there, nothing added)."""
    if seq == 0:
        return []
    noun = "receipt" if kind == "receipt" else "event"
    when = f"check {check.id} of {evidence_time(check.checked_at)}"
    with _cursor() as cursor:
        found = cursor.execute(f'SELECT "hash" FROM "{table}" WHERE "seq" = %s', [seq]).fetchall()
        count = cursor.execute(f'SELECT COUNT(*) FROM "{table}" WHERE "seq" <= %s', [seq]).fetchone()[0]
    out = []
    if [h for (h,) in found] != [hash_]:
        out.append(ChainBreak(
            "missing" if not found else "content_altered", seq,
            f"the {noun} at seq {seq}, where the last intact {when} stopped, "
            + ("is gone" if not found else f"no longer holds the hash {hash_} it had")
            + ": evidence already verified was changed; run a full check", kind=kind))
    if count != seq:
        out.append(ChainBreak(
            "missing", seq, f"{count:,} {noun}s lie at or before seq {seq:,}, where the last intact {when} "
            f"stopped with {seq:,}: {noun}s already verified were removed or added; run a full check", kind=kind))
    return out


def _in_batches(values: Sequence[Any], size: int = 500) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


def _facts_for(keys: Sequence[str], approvals: Sequence[str], event_seq: int) -> tuple:
    """The chain facts (as :func:`_chain_facts`) about these effect keys and approvals only, from their
    whole story in the event chain (up to ``event_seq``), read through the indexes on those columns."""
    events: list[StoredEvent] = []
    for batch in _in_batches(list(keys)):
        marks = ",".join(["%s"] * len(batch))
        events += _stored_events_where(
            f'"effect_key" IN ({marks}) AND "type" IN (\'EFFECT_RESERVED\', \'EXECUTION_COMMITTED\', '
            f'\'EFFECT_RESOLVED\') AND "seq" <= %s', [*batch, event_seq])
    for batch in _in_batches(list(approvals)):
        marks = ",".join(["%s"] * len(batch))
        events += _stored_events_where(
            f'"approval_id" IS NOT NULL AND "approval_id" IN ({marks}) AND "type" IN (\'APPROVAL_GRANTED\', '
            f'\'APPROVAL_DENIED\', \'APPROVAL_CONSUMED\') AND "seq" <= %s', [*batch, event_seq])
    return _chain_facts(events)


def _last_intact_check() -> ChainCheck | None:
    return _q(ChainCheck).filter(ok=True).order_by("-id").first()


def verify_incremental(progress: Any = None) -> ChainReport:
    """Check what was added since the last intact recorded check, starting from its position.

    Walks the receipts with seq past that check's (from its hash) and the events likewise, in
    batches; checks that the row at that position still holds its hash and that nothing was removed
    or added at or before it; reads the rows with no seq; checks the head's signature; and checks
    the signed rows that moved since that check (by their stored times, less a margin) or that a new
    event names, each against its whole story in the event chain. With no intact check recorded, it
    walks everything from the genesis (in batches).

    Not covered (a full check covers it): a row at or before the checked position changed in place
    with the same count and the anchor row untouched (its content, or its hash rewritten); a signed
    row changed around ctrlrun that keeps its stored time and that no new event names (such a row is
    still refused where it is used: its signature, or the event chain, does not agree).
    """
    say = _progress_reporter(progress)
    with _reading():
        base = _last_intact_check()
        report = ChainReport(mode="incremental")
        breaks: list[ChainBreak] = []
        if base is not None and not _check_ok(base):
            breaks.append(ChainBreak(
                "signature_invalid", None, f"chain check {base.id} (intact, up to receipt {base.receipt_seq}) does "
                f"not carry ctrlrun's signature: it was written outside ctrlrun, so this check starts from the "
                f"genesis", kind="check", subject=str(base.id)))
            base = None
        # A break a check found stays until a full check comes back intact: an incremental check starts
        # from the last intact one and never re-reads what a later check found broken.
        found_broken = _q(ChainCheck).filter(ok=False)
        if base is not None:
            found_broken = found_broken.filter(id__gt=base.id)
        latest_broken = found_broken.order_by("-id").first()
        if latest_broken is not None:
            breaks.append(ChainBreak(
                "unresolved", None, f"chain check {latest_broken.id} ({latest_broken.mode}, "
                f"{evidence_time(latest_broken.checked_at)}) found {latest_broken.breaks} break(s), and no full "
                f"check has come back intact since; an incremental check does not re-read them. Restore the "
                f"store, then run a full check (receipts --verify-chain)", kind="check",
                subject=str(latest_broken.id)))
        r_from, r_hash, e_from, e_hash = ((base.receipt_seq, base.receipt_hash, base.event_seq, base.event_hash)
                                          if base is not None else (0, GENESIS_HASH, 0, GENESIS_HASH))
        report.from_seq, report.from_event_seq = r_from, e_from
        report.from_check = base.id if base is not None else None
        start_id = None
        if base is not None:
            breaks += _anchor_breaks("receipt", "ctrlrun_receipt", r_from, r_hash, base)
            breaks += _anchor_breaks("event", "ctrlrun_event", e_from, e_hash, base)
            with _cursor() as cursor:
                found = cursor.execute('SELECT MAX("id") FROM "ctrlrun_event" WHERE "seq" = %s', [e_from]).fetchone()
            start_id = found[0] if found else None

        receipts = ReceiptWalk(report, r_from, r_hash)
        for row in _stored_receipts_where('"seq" IS NULL', []):
            receipts.unchained(row)
        seen = r_from
        for batch in _ordered_batches(_receipts_after, r_from):
            for row in batch:
                receipts.add(row)
            seen = batch[-1].seq
            if say and report.chained // PROGRESS_EVERY != (report.chained - len(batch)) // PROGRESS_EVERY:
                say(f"{report.chained:,} receipts re-hashed")
        events = EventWalk(report, e_from, e_hash, start_id)
        for row in _stored_events_where('"seq" IS NULL', []):
            events.unchained(row)
        event_seen = e_from
        named_keys: set[str] = set()
        named_approvals: set[str] = set()

        def walk_events(batch: list[StoredEvent]) -> None:
            for row in batch:
                events.add(row)
                if row.effect_key:
                    named_keys.add(row.effect_key)
                if row.approval_id:
                    named_approvals.add(row.approval_id)

        for batch in _ordered_batches(_events_after, e_from):
            walk_events(batch)
            event_seen = batch[-1].seq
            if say and report.events_chained // PROGRESS_EVERY != (
                    report.events_chained - len(batch)) // PROGRESS_EVERY:
                say(f"{report.events_chained:,} events re-hashed")

        seq, hash_, event_seq, event_hash_, mac, key_id = _read_head()
        # Written while the walk ran: every row up to the head is committed now (as in verify()).
        while seq > seen:
            batch = _receipts_after(seen, seq)
            if not batch:
                break
            for row in batch:
                receipts.add(row)
            seen = batch[-1].seq
        while event_seq > event_seen:
            batch = _events_after(event_seen, event_seq)
            if not batch:
                break
            walk_events(batch)
            event_seen = batch[-1].seq
        report.head_seq, report.head_hash = seq, hash_
        report.event_head_seq, report.event_head_hash = event_seq, event_hash_
        if base is not None and (seq < r_from or event_seq < e_from):
            breaks.append(ChainBreak(
                "head_mismatch", seq, f"the chain head (receipt seq {seq}, event seq {event_seq}) is behind the "
                f"position the last intact check {base.id} verified (receipt seq {r_from}, event seq {e_from}): "
                f"the head was set back", kind="head"))
        receipts.finish(seq, hash_)
        events.finish(event_seq, event_hash_)
        problem = _head_problem(seq, hash_, event_seq, event_hash_, mac, key_id)
        if problem is not None:
            report.breaks.append(ChainBreak("signature_invalid", seq, problem, kind="head"))

        since = base.checked_at - _SINCE_MARGIN if base is not None else None
        approvals: dict[str, Approval] = {}
        query = _q(Approval)
        if since is not None:
            query = query.filter(Q(created_at__gte=since) | Q(answered_at__gte=since) | Q(consumed_at__gte=since))
        approvals.update((row.approval_id, row) for row in query.iterator())
        missing = sorted(named_approvals - set(approvals))
        for batch in _in_batches(missing):
            approvals.update((row.approval_id, row) for row in _q(Approval).filter(pk__in=list(batch)))
        records: dict[str, EffectRecord] = {}
        query = _q(EffectRecord)
        if since is not None:
            query = query.filter(updated_at__gte=since)
        records.update((row.effect_key, row) for row in query.iterator())
        for batch in _in_batches(sorted(named_keys - set(records))):
            records.update((row.effect_key, row) for row in _q(EffectRecord).filter(pk__in=list(batch)))
        reserved, committed, answered = _facts_for(sorted(records), sorted(approvals), event_seq)
        for approval_id in sorted(approvals, key=lambda a: (approvals[a].created_at, a)):
            report.breaks += _approval_breaks(approvals[approval_id], answered)
        for key in sorted(records):
            report.breaks += _effect_breaks(records[key], reserved, committed)
        report.signatures_checked = 1 + len(approvals) + len(records)
        report.breaks[:0] = breaks
    return report


@dataclass(frozen=True)
class Overview:
    """What needs a person now, for the console's front page."""

    pending_approvals: int
    ambiguous_effects: int
    lapsed_leases: int
    receipts: int
    #: Waiting requests whose row does not carry ctrlrun's signature: nobody can answer them.
    tampered_approvals: int = 0


def overview() -> Overview:
    with _reading():
        cutoff = _clock()
        # Each waiting request's signature is checked (an HMAC each: few are ever waiting at once).
        waiting = [_approval_ok(row) for row in _q(Approval).filter(
            status=ApprovalStatus.PENDING, expires_at__gt=cutoff).iterator()]
        return Overview(
            pending_approvals=sum(waiting),
            tampered_approvals=len(waiting) - sum(waiting),
            ambiguous_effects=_q(EffectRecord).filter(state=S.AMBIGUOUS).count(),
            lapsed_leases=_q(EffectRecord).filter(state__in=[S.RESERVED, S.EXECUTING],
                                                  lease_expires_at__lte=cutoff).count(),
            # The head's position, not COUNT(*): one indexed read on any size of store (the two
            # differ only when rows were removed or added around ctrlrun, which a check names).
            receipts=_q(ChainHead).filter(pk=1).values_list("seq", flat=True).first() or 0,
        )
