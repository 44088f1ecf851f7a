"""The only module that talks to the database: every transaction, row lock and conflict.

Design
------
A protected call is a few short *phases*, each one ``transaction.atomic(durable=True)`` with a
closed set of results, and never a transaction open while the user's function runs:

1. ``reserve``: write the call's opening events and take the effect key (insert the row, or
   renew a ``failed`` one) and mark it executing, in ONE transaction. A refusal writes its
   events and its ``blocked`` receipt in that same transaction.
2. the function runs, outside any transaction;
3. ``record_outcome``: move the row (if this attempt still holds it), write the outcome event
   and the receipt, in ONE transaction.

So an allowed call costs two write transactions; a denied or refused one costs one.

Serialisation. On SQLite every transaction is ``BEGIN IMMEDIATE`` (see ``standalone.
sqlite_options``), so a read-then-write decision cannot interleave with another writer. On
PostgreSQL a first reservation is ``INSERT ... ON CONFLICT DO NOTHING`` on the key (a concurrent
insert of the same key waits for the winner, then does nothing), and every other decision
reads the row with ``SELECT ... FOR UPDATE``. Receipt appends lock the single ``ChainHead`` row,
always last in a transaction, so the chain stays linear and the lock is short. Lock order is
always approval row, then effect row, then chain head: no deadlocks.

The hot path (reserve, outcome, events, receipts) is plain SQL over the models' tables: the
ORM's query building cost more than the database work (profiled). Everything else uses the ORM.

The store returns frozen dataclasses and raises ctrlrun's own errors, never QuerySets or
database exceptions. A transaction cannot be nested inside a caller's open transaction
(``durable=True``): evidence must not roll back with someone else's work.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from . import conf
from .canonical import GENESIS_HASH, Action, evidence_text, evidence_time
from .errors import (
    ActionDenied,
    AmbiguousEffect,
    ApprovalMismatch,
    CTRLRunError,
    DuplicateEffect,
    InvalidArgument,
    StoreUnavailable,
)
from .models import Approval, ChainHead, EffectRecord, Event, PolicyDocument, Receipt, dumps_json
from .receipts import StoredReceipt, build_receipt, dump_receipt, receipt_hash, verify_chain, ChainReport
from .states import ApprovalStatus, Decision, EffectState, EventType, Result

logger = logging.getLogger("ctrlrun.store")

__all__ = [
    "Call",
    "Reserved",
    "Refused",
    "OutcomeWrite",
    "HookAnswer",
    "EffectView",
    "EventView",
    "ReceiptView",
    "ensure_policy",
    "record_denial",
    "begin_unkeyed",
    "reserve",
    "record_refusal",
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
]

S = EffectState
LEASE_LAPSED_ERROR = "lease expired: the worker holding this effect never finished"


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Call:
    """What the store needs to know about one protected call."""

    action: Action
    decision: Decision
    reason: str
    policy_hash: str | None
    effect_key: str | None
    started_at: dt.datetime
    approval_id: str | None = None
    approver: str | None = None


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
    """What a reconcile hook said, as recorded: ``outcome`` is always one of the three answers."""

    outcome: str
    reason: str | None = None  # "raised" | "invalid_return" when the hook could not say
    error: str | None = None
    started_at: dt.datetime | None = None

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

    @property
    def doc(self) -> dict[str, Any]:
        return json.loads(self.document)


# --------------------------------------------------------------------------- plumbing


def _db() -> str:
    return conf.database_alias()


def _q(model: Any) -> Any:
    return model.objects.db_manager(_db())


@contextlib.contextmanager
def _phase() -> Iterator[None]:
    """One short, durable transaction; database trouble becomes ``StoreUnavailable``."""
    try:
        with transaction.atomic(using=_db(), durable=True):
            yield
    except RuntimeError as exc:
        if "durable" in str(exc):
            raise InvalidArgument(
                "a protected call cannot run inside an open transaction on ctrlrun's database: its "
                "evidence would roll back with your work. Call it outside transaction.atomic(), or "
                "give ctrlrun a database of its own (settings.CTRLRUN_DATABASE)"
            ) from None
        raise
    except DatabaseError as exc:
        # A dropped connection stays broken until closed; close it now so that the next call
        # reconnects (Django would only do this at the end of a web request).
        connections[_db()].close_if_unusable_or_obsolete()
        raise StoreUnavailable(
            f"the ctrlrun store could not complete a write ({type(exc).__name__}: {exc}); nothing was "
            f"recorded by that step"
        ) from exc


EventRow = tuple  # (ts, type, action_id, effect_key, approval_id, data): one row of ctrlrun_event


def _event(type_: EventType, call_or_id: Call | str | None, effect_key: str | None, data: dict[str, Any],
           now: dt.datetime, approval_id: str | None = None) -> EventRow:
    action_id = call_or_id.action.action_id if isinstance(call_or_id, Call) else call_or_id
    return (now, type_.value, action_id, effect_key, approval_id, data)


def _cursor() -> Any:
    return connections[_db()].cursor()


def _insert_events(events: Sequence[EventRow]) -> None:
    """All of one step's events in a single INSERT (the ORM's bulk_create costs more to build)."""
    if not events:
        return
    ops = connections[_db()].ops
    params: list[Any] = []
    for ts, type_, action_id, effect_key, approval_id, data in events:
        params += [ops.adapt_datetimefield_value(ts), type_, action_id, effect_key, approval_id,
                   dumps_json(data)]
    values = ",".join(["(%s,%s,%s,%s,%s,%s)"] * len(events))
    with _cursor() as cursor:
        cursor.execute(
            'INSERT INTO "ctrlrun_event" ("ts","type","action_id","effect_key","approval_id","data") VALUES '
            + values, params)


def _opening_events(call: Call, now: dt.datetime) -> list[Event]:
    return [
        _event(EventType.ACTION_PROPOSED, call, call.effect_key,
               {"action_hash": call.action.hash, "action": call.action.canonical()}, call.started_at),
        _event(EventType.POLICY_EVALUATED, call, call.effect_key,
               {"decision": call.decision.value, "reason": call.reason}, now),
    ]


def _append_receipt(call: Call, result: Result, error: str | None, attempt: int | None, now: dt.datetime,
                    *, decision_reason: str | None = None) -> dict[str, Any]:
    """Chain a receipt for ``call``. Must run inside a phase; takes the chain-head lock last."""
    action = call.action
    doc = build_receipt(
        receipt_id=_new_receipt_id(),
        action_id=action.action_id,
        action=action.name,
        action_hash=action.hash,
        principal=action.principal.as_evidence(),
        resource=action.resource,
        arguments=action.arguments,
        environment=action.environment,
        decision=call.decision.value,
        decision_reason=decision_reason or call.reason,
        approval_id=call.approval_id,
        approver=call.approver,
        effect_key=call.effect_key,
        attempt=attempt,
        result=result.value,
        error=error,
        started_at=evidence_time(call.started_at),
        finished_at=evidence_time(now),
        policy_hash=call.policy_hash,
    )
    ops = connections[_db()].ops
    with _cursor() as cursor:
        # Taking the next seq locks the head row until commit: every writer queues here, briefly.
        cursor.execute('UPDATE "ctrlrun_chainhead" SET "seq" = "seq" + 1 WHERE "id" = 1 RETURNING "seq", "hash"')
        head = cursor.fetchone()
        if head is None:
            # Only a store whose tables were emptied (e.g. a test flush) has no head; with receipts
            # present that would hide a deletion, so it is refused rather than silently restarted.
            if _q(Receipt).exists():
                raise StoreUnavailable(
                    "the receipt chain head row is missing while receipts exist; run 'ctrlrun receipts "
                    "--verify-chain' and restore the store from a backup"
                )
            # Two first writers may race here: the loser's insert does nothing, and its UPDATE then
            # waits for the winner's transaction and takes the next seq after it.
            cursor.execute('INSERT INTO "ctrlrun_chainhead" ("id","seq","hash") VALUES (1, 0, %s) '
                           'ON CONFLICT ("id") DO NOTHING', [GENESIS_HASH])
            cursor.execute('UPDATE "ctrlrun_chainhead" SET "seq" = "seq" + 1 WHERE "id" = 1 RETURNING "seq", "hash"')
            head = cursor.fetchone()
        doc["seq"], doc["prev_hash"] = head
        digest = receipt_hash(doc, trusted=True)
        cursor.execute(
            'INSERT INTO "ctrlrun_receipt" ("receipt_id","seq","action_id","action","agent","decision","result",'
            '"effect_key","ts","document","prev_hash","hash") VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)',
            [doc["receipt_id"], doc["seq"], action.action_id, action.name, action.principal.agent,
             call.decision.value, result.value, call.effect_key, ops.adapt_datetimefield_value(now),
             dump_receipt(doc), doc["prev_hash"], digest],
        )
        cursor.execute('UPDATE "ctrlrun_chainhead" SET "hash" = %s WHERE "id" = 1', [digest])
    return doc


def _new_receipt_id() -> str:
    from .canonical import new_id

    return new_id("ctr_")


_known_policies: set[str] = set()


def forget_known_policies() -> None:
    _known_policies.clear()


def ensure_policy(policy_hash: str, schema: str, source: str, text: str, environment: str) -> None:
    """Store the policy document once (per process, the first time it decides anything)."""
    if policy_hash in _known_policies:
        return
    with _phase():
        _q(PolicyDocument).get_or_create(
            hash=policy_hash,
            defaults={"schema": schema, "source": source, "text": text, "environment": environment,
                      "first_seen": conf.now()},
        )
    _known_policies.add(policy_hash)


# --------------------------------------------------------------------------- refusals before any effect


def record_denial(call: Call, data: dict[str, Any], *, with_policy: bool = True) -> None:
    """A call refused before any effect: opening events, ACTION_DENIED, a ``denied`` receipt."""
    now = conf.now()
    with _phase():
        events = _opening_events(call, now) if with_policy else _opening_events(call, now)[:1]
        events.append(_event(EventType.ACTION_DENIED, call, call.effect_key, data, now, call.approval_id))
        _insert_events(events)
        _append_receipt(call, Result.DENIED, data.get("error"), None, now, decision_reason=data["reason"])


def begin_unkeyed(call: Call, presented: str | None = None) -> Reserved | Refused:
    """A call with no effect key: nothing to reserve; the approval (if any) is checked and used."""
    now = conf.now()
    with _phase():
        events = _opening_events(call, now)
        call, approval, refusal = _take_presented(call, presented, now, events)
        if refusal is not None:
            return refusal
        if approval is not None:
            _consume(approval, call, now, events)
        elif presented is not None and call.decision is Decision.ALLOW:
            call = _consume_if_matching(call, presented, now, events)
        events.append(_event(EventType.EXECUTION_STARTED, call, None, {"task": None, "hop": None}, now,
                             call.approval_id))
        _insert_events(events)
    return Reserved(1, now, call)


# --------------------------------------------------------------------------- reservation


def _refusal_for(record: Any, now: dt.datetime) -> CTRLRunError:
    key = record.effect_key
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
    resolve_hint = f"'ctrlrun resolve {key} --committed' or '--failed'"
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


def _refusal_evidence(call: Call, error: CTRLRunError, attempt: int, now: dt.datetime,
                      events: Sequence[EventRow] = ()) -> None:
    """The refusal's event (after ``events`` not yet written, in the same INSERT) and blocked receipt."""
    if isinstance(error, DuplicateEffect):
        data = {"reason": "duplicate", "state": error.state}
    else:
        data = {"reason": "ambiguous"}
    _insert_events([
        *events, _event(EventType.EFFECT_RESERVATION_REFUSED, call, call.effect_key, data, now, call.approval_id)
    ])
    _append_receipt(call, Result.BLOCKED, str(error), attempt, now)


def _lapse(record: EffectRecord, now: dt.datetime, events: list[EventRow]) -> None:
    """A held record whose lease ran out: nobody knows what its worker did. Mark it ambiguous."""
    record.state = S.AMBIGUOUS
    record.error = LEASE_LAPSED_ERROR
    record.lease_expires_at = None
    record.updated_at = now
    record.save(update_fields=["state", "error", "lease_expires_at", "updated_at"])
    events.append(
        _event(EventType.EXECUTION_AMBIGUOUS, record.action_id, record.effect_key,
               {"error": LEASE_LAPSED_ERROR, "reason": "lease_expired"}, now)
    )


def _insert_fresh(call: Call, now: dt.datetime, lease_until: dt.datetime) -> bool:
    """Insert the key's record as this call's, executing at attempt 1; False if the key exists.

    ``ON CONFLICT DO NOTHING`` makes losing the race an answer, not an error: on PostgreSQL a
    concurrent insert of the same key waits for the other transaction and then does nothing.
    """
    ops = connections[_db()].ops
    stamp = ops.adapt_datetimefield_value(now)
    with _cursor() as cursor:
        cursor.execute(
            'INSERT INTO "ctrlrun_effectrecord" ("effect_key","action","state","action_id","attempt",'
            '"lease_expires_at","reconcile_failures","created_at","updated_at") '
            'VALUES (%s,%s,%s,%s,1,%s,0,%s,%s) ON CONFLICT ("effect_key") DO NOTHING RETURNING "attempt"',
            [call.effect_key, call.action.name, S.EXECUTING.value, call.action.action_id,
             ops.adapt_datetimefield_value(lease_until), stamp, stamp],
        )
        return cursor.fetchone() is not None


@dataclass(frozen=True)
class _Peek:
    """The columns a refusal needs, read (and locked, on PostgreSQL) without building a model."""

    effect_key: str
    state: str
    action_id: str
    attempt: int
    lease_expires_at: dt.datetime | None
    error: str | None
    resolved_by: str | None


def _as_datetime(value: Any, connection: Any) -> dt.datetime | None:
    """A timestamp column read by raw SQL, as the ORM would read it (SQLite hands back text in the
    connection's time zone)."""
    if value is None or isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value
    if isinstance(value, str):
        value = parse_datetime(value)
    return timezone.make_aware(value, connection.timezone) if value.tzinfo is None else value


def _peek(effect_key: str) -> _Peek:
    connection = connections[_db()]
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""  # SQLite: BEGIN IMMEDIATE
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT "state","action_id","attempt","lease_expires_at","error","resolved_by" '
            'FROM "ctrlrun_effectrecord" WHERE "effect_key" = %s' + lock, [effect_key])
        state, action_id, attempt, lease, error, resolved_by = cursor.fetchone()
    return _Peek(effect_key, state, action_id, attempt, _as_datetime(lease, connection), error, resolved_by)


def reserve(call: Call, lease: dt.timedelta, *, opening: bool, hold_ambiguous: bool,
            presented: str | None = None) -> Reserved | Refused:
    """Take the call's effect key and mark it executing, or refuse (§5.3, §8.4).

    ``opening`` writes the call's opening events first. With ``hold_ambiguous`` an ambiguous
    record is refused *without* evidence (``final=False``) so the caller can ask a reconcile
    hook and try once more; every other refusal writes its event and receipt here.

    ``presented`` is the approval the caller holds. For an ``approve`` decision it is checked
    first (its refusal wins) and consumed only if the reservation succeeds, in this same
    transaction: a refused reservation leaves it granted. For an ``allow`` decision it is
    consumed only if it matches, and never blocks the call.
    """
    now = conf.now()
    lease_until = now + lease
    events = _opening_events(call, now) if opening else []
    with _phase():
        call, approval, refusal = _take_presented(call, presented, now, events)
        if refusal is not None:
            return refusal
        if presented is not None and call.decision is Decision.ALLOW:
            # Lock order is always approval row, then effect row (as on the approve path): no deadlock.
            _q(Approval).select_for_update().filter(pk=presented).first()
        record: Any = None
        if _insert_fresh(call, now, lease_until):
            attempt, inserted = 1, True
        else:
            record = _peek(call.effect_key)
            attempt, inserted = record.attempt, False
            if record.state == S.FAILED or (record.state in (S.RESERVED, S.EXECUTING)
                                            and record.lease_expires_at <= now):
                record = _q(EffectRecord).select_for_update().get(pk=call.effect_key)  # it will change
        if record is not None and record.state == S.FAILED:
            record.state = S.EXECUTING
            record.action = call.action.name
            record.action_id = call.action.action_id
            record.attempt += 1
            record.lease_expires_at = lease_until
            record.result_json = record.error = record.resolved_by = None
            record.reconcile_failures = 0
            record.reconcile_after = None
            record.updated_at = now
            record.save()
            attempt, inserted = record.attempt, True
        if inserted:
            if approval is not None:
                _consume(approval, call, now, events)
            elif presented is not None and call.decision is Decision.ALLOW:
                call = _consume_if_matching(call, presented, now, events)
            events += [
                _event(EventType.EFFECT_RESERVED, call, call.effect_key,
                       {"attempt": attempt, "lease_expires_at": evidence_time(lease_until)}, now,
                       call.approval_id),
                _event(EventType.EXECUTION_STARTED, call, call.effect_key, {"task": None, "hop": None}, now,
                       call.approval_id),
            ]
            _insert_events(events)
            return Reserved(attempt, lease_until, call)
        assert record is not None
        if record.state in (S.RESERVED, S.EXECUTING) and record.lease_expires_at <= now:
            _lapse(record, now, events)  # kept even though this attempt is refused
        error = _refusal_for(record, now)
        if isinstance(error, AmbiguousEffect) and hold_ambiguous:
            _insert_events(events)
            return Refused(error, record.attempt, False, call)
        _refusal_evidence(call, error, record.attempt, now, events)
        return Refused(error, record.attempt, True, call)


def record_refusal(refused: Refused) -> None:
    """Write the evidence of a refusal that ``reserve`` held back."""
    with _phase():
        _refusal_evidence(refused.call, refused.error, refused.attempt or 1, conf.now())


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

    @property
    def canonical_action(self) -> dict[str, Any]:
        return json.loads(self.action_json)

    @property
    def arguments(self) -> dict[str, Any]:
        return self.canonical_action.get("arguments", {})


def _approval_view(row: Approval) -> ApprovalView:
    return ApprovalView(**{f: getattr(row, f) for f in ApprovalView.__dataclass_fields__})


def request_approval(call: Call, ttl: dt.timedelta) -> ApprovalView:
    """An ``approve`` decision with nothing presented: a pending request bound to the action hash."""
    from .canonical import new_id

    now = conf.now()
    action = call.action
    row = Approval(
        approval_id=new_id("apr_"), status=ApprovalStatus.PENDING, action=action.name, action_id=action.action_id,
        action_hash=action.hash, action_json=json.dumps(action.canonical(), ensure_ascii=False, sort_keys=True),
        agent=action.principal.agent, user=action.principal.user, effect_key=call.effect_key,
        policy_hash=call.policy_hash, decision_reason=call.reason, created_at=now, expires_at=now + ttl,
    )
    with _phase():
        row.save(using=_db(), force_insert=True)
        events = _opening_events(call, now)
        events.append(_event(EventType.APPROVAL_REQUESTED, call, call.effect_key,
                             {"action_hash": action.hash, "expires_at": evidence_time(row.expires_at)}, now,
                             row.approval_id))
        _insert_events(events)
    return _approval_view(row)


def _expire(row: Approval, now: dt.datetime, events: list[EventRow], call: Call | None = None) -> None:
    """Mark ``row`` expired; the event belongs to ``call`` when a call presenting it found it lapsed."""
    row.status = ApprovalStatus.EXPIRED
    row.save(update_fields=["status"])
    owner, key = (call, call.effect_key) if call is not None else (row.action_id, row.effect_key)
    events.append(_event(EventType.APPROVAL_EXPIRED, owner, key, {}, now, row.approval_id))


def answer_approval(approval_id: str, grant: bool, *, by: str, note: str | None = None) -> ApprovalView:
    """A human grants or denies a pending request. Used by the commands and the console alike.

    Only a pending, unexpired request can be answered; an expired one is marked expired (that
    write is kept) and refused. The person who asked (the principal's ``user``) cannot answer.
    """
    if not isinstance(by, str) or not by.strip():
        raise InvalidArgument("an approval needs the name of the person answering (--by NAME)")
    by = by.strip()
    now = conf.now()
    expired: ApprovalView | None = None
    with _phase():
        row = _q(Approval).select_for_update().filter(pk=approval_id).first()
        if row is None:
            raise InvalidArgument(f"no approval request {approval_id}; 'approvals' lists the requests")
        if row.status != ApprovalStatus.PENDING:
            raise InvalidArgument(f"approval request {approval_id} is already {row.status}")
        if row.expires_at <= now:
            events: list[EventRow] = []
            _expire(row, now, events)
            _insert_events(events)
            expired = _approval_view(row)
        else:
            if row.user is not None and row.user == by:
                raise InvalidArgument(
                    f"this request for {row.action} was made on behalf of user {by}, who cannot answer it; another "
                    f"person must"
                )
            row.status = ApprovalStatus.GRANTED if grant else ApprovalStatus.DENIED
            row.approver = by
            row.note = note or None
            row.answered_at = now
            row.save(update_fields=["status", "approver", "note", "answered_at"])
            data: dict[str, Any] = {"approver": by}
            if grant:
                data["action_hash"] = row.action_hash
            if note:
                data["note"] = note
            kind = EventType.APPROVAL_GRANTED if grant else EventType.APPROVAL_DENIED
            _insert_events([_event(kind, row.action_id, row.effect_key, data, now, row.approval_id)])
    if expired is not None:
        raise InvalidArgument(
            f"approval {approval_id} expired at {evidence_time(expired.expires_at)}; the agent must ask again"
        )
    return _approval_view(row)


def expire_if_due(approval_id: str) -> ApprovalView | None:
    """Mark a pending or granted request expired if its time is up (``wait=True`` giving up)."""
    now = conf.now()
    with _phase():
        row = _q(Approval).select_for_update().filter(pk=approval_id).first()
        if row is None:
            return None
        if row.status in (ApprovalStatus.PENDING, ApprovalStatus.GRANTED) and row.expires_at <= now:
            events: list[EventRow] = []
            _expire(row, now, events)
            _insert_events(events)
    return _approval_view(row)


def get_approval(approval_id: str) -> ApprovalView | None:
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


def _take_presented(call: Call, presented: str | None, now: dt.datetime,
                    events: list[EventRow]) -> tuple[Call, Approval | None, Refused | None]:
    """Check a presented approval for an ``approve`` decision, in §8.4's order.

    Returns the call stamped with the approval, the row to consume once the effect is taken,
    or a refusal whose evidence (and the events so far) is already written.
    """
    if presented is None or call.decision is not Decision.APPROVE:
        if presented is not None and call.decision is Decision.DENY:
            call = replace(call, approval_id=presented)
        return call, None, None
    row = _q(Approval).select_for_update().filter(pk=presented).first()
    call = replace(call, approval_id=presented, approver=row.approver if row else None)
    error: CTRLRunError | None = None
    if row is None:
        error = ApprovalMismatch(f"no approval {presented}", reason="unknown", approval_id=presented)
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
    elif row.expires_at <= now:
        _expire(row, now, events, call)
        error = ApprovalMismatch(f"approval {presented} expired at {evidence_time(row.expires_at)}; ask again",
                                 reason="expired", approval_id=presented)
    if error is None:
        return call, row, None
    if isinstance(error, ActionDenied):
        events.append(_event(EventType.APPROVAL_DENIED, call, call.effect_key, {"approver": row.approver}, now,
                             presented))
        events.append(_event(EventType.ACTION_DENIED, call, call.effect_key, {"reason": "approval_denied"}, now))
        _insert_events(events)
        _append_receipt(call, Result.DENIED, str(error), None, now, decision_reason="approval_denied")
    else:
        events.append(_event(EventType.APPROVAL_INVALIDATED, call, call.effect_key,
                             {"reason": error.reason, "action_hash": call.action.hash}, now, presented))
        _insert_events(events)
        _append_receipt(call, Result.BLOCKED, str(error), None, now)
    return call, None, Refused(error, None, True, call)


def _consume(row: Approval, call: Call, now: dt.datetime, events: list[EventRow], *, required: bool = True) -> None:
    row.status = ApprovalStatus.CONSUMED
    row.consumed_at = now
    row.consumed_by = call.action.action_id
    row.save(update_fields=["status", "consumed_at", "consumed_by"])
    data: dict[str, Any] = {"approver": row.approver}
    if not required:
        data["required"] = False
    events.append(_event(EventType.APPROVAL_CONSUMED, call, call.effect_key, data, now, row.approval_id))


def _consume_if_matching(call: Call, presented: str, now: dt.datetime, events: list[EventRow]) -> Call:
    """An approval presented on an allowed call is used up only if it is for exactly this call."""
    row = _q(Approval).select_for_update().filter(pk=presented).first()
    if (row is None or row.action_hash != call.action.hash or row.status != ApprovalStatus.GRANTED
            or row.expires_at <= now):
        logger.info("approval %s presented on allowed call %s was not used (it does not match or is not granted)",
                    presented, call.action.action_id)
        return call
    call = replace(call, approval_id=presented, approver=row.approver)
    _consume(row, call, now, events, required=False)
    return call


# --------------------------------------------------------------------------- outcome


def _jsonable_result(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = json.dumps(repr(value))
    return evidence_text(text)


_STATE_FOR = {Result.COMMITTED: S.COMMITTED, Result.FAILED: S.FAILED, Result.AMBIGUOUS: S.AMBIGUOUS}


def record_outcome(call: Call, attempt: int | None, result: Result, *, error: str | None = None,
                   value: Any = None, write_receipt: bool = True) -> OutcomeWrite:
    """Record how the function ended (§5.4), if this attempt still holds the row.

    ``result`` is committed, failed or ambiguous. When the row moved on meanwhile (a contender
    found this attempt's lease lapsed, or a human resolved it), the row is left as it is and
    the call is recorded ambiguous: the function may have acted, and nobody recorded it.
    """
    now = conf.now()
    key = call.effect_key
    event_type = {Result.COMMITTED: EventType.EXECUTION_COMMITTED, Result.FAILED: EventType.EXECUTION_FAILED,
                  Result.AMBIGUOUS: EventType.EXECUTION_AMBIGUOUS}[result]
    with _phase():
        if key is None:
            data = {} if result is Result.COMMITTED else {"error": error}
            _insert_events([_event(event_type, call, None, data, now, call.approval_id)])
            _append_receipt(call, result, error, attempt, now)
            return OutcomeWrite(True)
        # One conditional UPDATE both checks that this attempt still holds the row and moves it.
        held = "'reserved','executing'" + (",'ambiguous'" if result is Result.AMBIGUOUS else "")
        ops = connections[_db()].ops
        with _cursor() as cursor:
            cursor.execute(
                'UPDATE "ctrlrun_effectrecord" SET "state" = %s, "lease_expires_at" = NULL, "error" = %s, '
                '"result_json" = %s, "updated_at" = %s WHERE "effect_key" = %s AND "action_id" = %s AND '
                f'"attempt" = %s AND "state" IN ({held}) AND "resolved_by" IS NULL',
                [_STATE_FOR[result].value, error, _jsonable_result(value) if result is Result.COMMITTED else None,
                 ops.adapt_datetimefield_value(now), key, call.action.action_id, attempt],
            )
            holds = cursor.rowcount == 1
        if holds:
            data = {} if result is Result.COMMITTED else {"error": error}
            _insert_events([_event(event_type, call, key, data, now, call.approval_id)])
            if write_receipt:
                _append_receipt(call, result, error, attempt, now)
            return OutcomeWrite(True)
        record = _q(EffectRecord).filter(pk=key).first()
        refusal = _outcome_refusal(key, record)
        if result is Result.COMMITTED:
            why = f"the function returned, so the remote may well have acted, and the outcome write was refused: AmbiguousEffect: {refusal}"
        elif result is Result.FAILED:
            why = f"the function raised NotExecuted: {error}, and the outcome write was refused: AmbiguousEffect: {refusal}"
        else:
            why = f"{error}; and the outcome write was refused: AmbiguousEffect: {refusal}"
        _insert_events([_event(EventType.EXECUTION_AMBIGUOUS, call, key, {"error": why}, now, call.approval_id)])
        _append_receipt(call, Result.AMBIGUOUS, why, attempt, now)
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


def _move_ambiguous(record: EffectRecord, state: EffectState, resolver: str, now: dt.datetime) -> None:
    record.error = f"resolved {state.value} by {resolver} (was: {record.error})"
    record.state = state
    record.resolved_by = resolver
    record.reconcile_after = None
    record.updated_at = now
    record.save(update_fields=["state", "error", "resolved_by", "reconcile_after", "updated_at"])


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
    answered first, or a later attempt has run since), the answer is dropped, never applied to an
    attempt it does not describe. ``receipt_for`` writes the eager trigger's
    ambiguous receipt after the reconciliation events, in the same transaction.
    """
    now = conf.now()
    moved: str | None = None
    with _phase():
        record = _q(EffectRecord).select_for_update().filter(pk=effect_key).first()
        events = [
            _event(EventType.RECONCILIATION_STARTED, action_id, effect_key,
                   {"effect_key": effect_key, "trigger": trigger,
                    **({"requested_by": requested_by} if requested_by else {})}, answer.started_at or now),
            _event(EventType.RECONCILIATION_RESOLVED, action_id, effect_key, answer.data(), now),
        ]
        if record is None or record.state != S.AMBIGUOUS or record.attempt != attempt:
            now_is = f"{record.state} at attempt {record.attempt}" if record else "gone"
            logger.warning("reconcile answer %r for %s (attempt %s) dropped: the record is %s now", answer.outcome,
                           effect_key, attempt, now_is)
            events[-1][5]["dropped"] = f"the record is {now_is}; this answer was about attempt {attempt}"
            moved = "dropped"
        elif answer.outcome in ("committed", "not_executed"):
            state = S.COMMITTED if answer.outcome == "committed" else S.FAILED
            _move_ambiguous(record, state, resolver, now)
            moved = state.value
            events.append(_event(EventType.EFFECT_RESOLVED, action_id, effect_key,
                                 {"state": state.value, "resolver": resolver, "resolved_by": "reconcile"}, now))
        else:
            first, cap = conf.reconcile_backoff()
            delay = min(first * (2 ** min(record.reconcile_failures, 30)), cap)
            record.reconcile_failures += 1
            record.reconcile_after = now + delay
            record.save(update_fields=["reconcile_failures", "reconcile_after"])
        _insert_events(events)
        if receipt_for is not None:
            _append_receipt(receipt_for, Result.AMBIGUOUS, receipt_error, receipt_attempt, now)
    return moved


def write_ambiguous_receipt(call: Call, attempt: int | None, error: str) -> None:
    """The eager trigger's receipt when the hook itself never returned (it raised a BaseException)."""
    with _phase():
        _append_receipt(call, Result.AMBIGUOUS, error, attempt, conf.now())


def resolve(effect_key: str, outcome: str, *, by: str, reason: str | None = None,
            attempt: int | None = None) -> EffectView:
    """A human says what happened to an ambiguous effect (``committed`` or ``failed``)."""
    if outcome not in ("committed", "failed"):
        raise InvalidArgument(f"say which it was: committed or failed, not {outcome!r}")
    if not by or not by.strip():
        raise InvalidArgument("a resolution needs the name of the person who decided it (--by NAME)")
    now = conf.now()
    with _phase():
        record = _q(EffectRecord).select_for_update().filter(pk=effect_key).first()
        if record is None:
            raise InvalidArgument(f"no effect '{effect_key}' to resolve; 'ctrlrun effects' lists the keys")
        if record.state != S.AMBIGUOUS:
            hint = ""
            if record.state in (S.RESERVED, S.EXECUTING) and record.lease_expires_at <= now:
                hint = " (its lease has lapsed: 'ctrlrun reconcile' sweeps it to ambiguous first)"
            raise InvalidArgument(
                f"effect '{effect_key}' is {record.state}, not ambiguous; only an effect with an unknown "
                f"outcome is resolved by hand{hint}"
            )
        if attempt is not None and attempt != record.attempt:
            raise InvalidArgument(
                f"effect '{effect_key}' is at attempt {record.attempt}, not {attempt}: it moved since you "
                f"looked. Check it again ('ctrlrun effects') before resolving"
            )
        resolver = by.strip()
        state = S.COMMITTED if outcome == "committed" else S.FAILED
        _move_ambiguous(record, state, resolver, now)
        data = {"state": state.value, "resolver": resolver, "resolved_by": "human", "attempt": record.attempt}
        if reason:
            data["reason"] = reason
        _insert_events([_event(EventType.EFFECT_RESOLVED, record.action_id, effect_key, data, now)])
    return _effect_view(record)


def sweep_lapsed(now: dt.datetime | None = None, action: str | None = None,
                 effect_key: str | None = None) -> list[EffectView]:
    """Move every held record whose lease lapsed to ambiguous (its worker died or hung)."""
    now = now or conf.now()
    swept: list[EffectView] = []
    query = _q(EffectRecord).filter(state__in=[S.RESERVED, S.EXECUTING], lease_expires_at__lte=now)
    if action:
        query = query.filter(action=action)
    if effect_key:
        query = query.filter(pk=effect_key)
    for key in list(query.values_list("effect_key", flat=True)):
        with _phase():
            record = _q(EffectRecord).select_for_update().filter(pk=key).first()
            if record is None or record.state not in (S.RESERVED, S.EXECUTING) or record.lease_expires_at > now:
                continue  # its worker finished, or someone else swept it, meanwhile
            events: list[EventRow] = []
            _lapse(record, now, events)
            _insert_events(events)
        swept.append(_effect_view(record))
    return swept


def reconcile_candidates(now: dt.datetime | None = None, action: str | None = None,
                         limit: int | None = None) -> list[EffectView]:
    """Ambiguous records due for a deferred reconcile (backoff respected), oldest first."""
    now = now or conf.now()
    from django.db.models import Q

    query = _q(EffectRecord).filter(state=S.AMBIGUOUS).filter(
        Q(reconcile_after__isnull=True) | Q(reconcile_after__lte=now)
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
    )


def _receipt_view(row: Receipt) -> ReceiptView:
    return ReceiptView(
        receipt_id=row.receipt_id, seq=row.seq, action_id=row.action_id, action=row.action, agent=row.agent,
        decision=row.decision, result=row.result, effect_key=row.effect_key, ts=row.ts, document=row.document,
    )


def _event_view(row: Event) -> EventView:
    return EventView(id=row.id, ts=row.ts, type=row.type, action_id=row.action_id, effect_key=row.effect_key,
                     approval_id=row.approval_id, data=row.data)


def get_effect(effect_key: str) -> EffectView | None:
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
    return [_event_view(e) for e in _q(Event).filter(action_id=action_id).order_by("id")]


#: Receipt columns that repeat a field of the hashed document (``agent`` is principal.agent).
_RECEIPT_COLUMNS = ("receipt_id", "action_id", "action", "agent", "decision", "result", "effect_key")


def verify() -> ChainReport:
    """Re-hash every receipt and walk the chain (§9.4), without stopping writers.

    A receipt and the head move in one transaction, so after reading the rows and then the head,
    every receipt up to the head is committed: any the first read missed (written meanwhile) is
    read once more. A row beyond the head can then only be one written around ctrlrun, and is
    reported as such.
    """
    fields = ("seq", "prev_hash", "hash", "document", *_RECEIPT_COLUMNS)

    def stored(query: Any) -> list[StoredReceipt]:
        return [StoredReceipt(r["receipt_id"], r["seq"], r["prev_hash"], r["hash"], r["document"],
                              tuple((c, r[c]) for c in _RECEIPT_COLUMNS))
                for r in query.values(*fields).iterator()]

    rows = stored(_q(Receipt).all())
    head = _q(ChainHead).filter(pk=1).first()
    head_seq, head_hash = (head.seq, head.hash) if head else (0, GENESIS_HASH)
    seen = max((r.seq for r in rows if r.seq is not None), default=0)
    if head_seq > seen:
        rows += stored(_q(Receipt).filter(seq__gt=seen, seq__lte=head_seq))
    return verify_chain(rows, head_seq, head_hash)


def events_for_effect(effect_key: str) -> list[EventView]:
    return [_event_view(e) for e in _q(Event).filter(effect_key=effect_key).order_by("id")]


def receipts_for_effect(effect_key: str) -> list[ReceiptView]:
    return [_receipt_view(r) for r in _q(Receipt).filter(effect_key=effect_key).order_by("seq")]


@dataclass(frozen=True)
class Overview:
    """What needs a person now, for the console's front page."""

    pending_approvals: int
    ambiguous_effects: int
    lapsed_leases: int
    receipts: int


def overview(now: dt.datetime | None = None) -> Overview:
    now = now or conf.now()
    return Overview(
        pending_approvals=_q(Approval).filter(status=ApprovalStatus.PENDING, expires_at__gt=now).count(),
        ambiguous_effects=_q(EffectRecord).filter(state=S.AMBIGUOUS).count(),
        lapsed_leases=_q(EffectRecord).filter(state__in=[S.RESERVED, S.EXECUTING], lease_expires_at__lte=now).count(),
        receipts=_q(Receipt).count(),
    )
