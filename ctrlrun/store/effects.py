"""Effect records: reserve a key, renew its lease, record the outcome, sweep, reconcile, resolve.

Every write of a record's state goes through ``move_effect``, which checks the edge against
``states.TRANSITIONS`` before the statement runs (a frozenset-cheap lookup) and fills the
statement's target and source states: the table is what the code does, and the database's
triggers (``ctrlrun.guard``, built from the same table) refuse every other edge.

The reservation is one unit of work in one phase (``base.write_phase``), its steps in this order,
each from the sibling that owns it (the package's inside names, see ``store/__init__``):

1. ``_open_reservation``: the key's record as an ``EffectView`` (locked on PostgreSQL, where the
   same statement brings the server's time) and the chain head, checked (``signatures``);
2. ``chain.started_call`` and ``chain.opening_events``: the call stamped, its opening events;
3. ``delegations.revoked_beneath``: a revoked delegation refuses (rows read ``FOR SHARE``);
4. the attempt ceiling (``max_attempts``), then ``approvals.take_presented`` (the approval row
   locked), then ``budgets.exhausted`` (the budgets' advisory locks, sorted);
5. taking the key: ``_insert_fresh`` or ``_renew`` (through ``move_effect``), ``budgets.charge``,
   ``approvals.mark_consumed``; the opening events wait on the record (``chain.stash``) until
   the outcome phase seals them;
6. or a refusal: ``lapse`` for a held record past its lease, then ``chain.seal`` writes the
   refusal's events and receipt (the head locked last).

Lock order is the package's: effect row, approval row, budget locks, chain head.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from django.db import connections

from .. import messages
from ..canonical import evidence_text, evidence_time
from ..errors import (
    ActionDenied, AmbiguousEffect, AuthorityDenied, CTRLRunError, DuplicateEffect, EvidenceTampered,
    IllegalTransition, InvalidArgument,
)
from ..models import Approval, ChainHead, EffectRecord, Event, Receipt
from ..states import HOLDING_STATES, INITIAL_STATE, TRANSITIONS, Decision, EffectState, EventType, Result, held_lapsed
from ..values import Call, EffectView, EventRow, Observation, OutcomeWrite, Pending, Refused, Reserved
from . import budgets, sql
from .approvals import (check_presented, consumption_event, give_back, mark_consumed, matching_approval,
                        take_presented)
from .base import alias, as_datetime, dialect, objects, read_clock, statements, time_param, write_phase
from .chain import (
    Built,
    call_from_events,
    event_row,
    opening_events,
    ReceiptSpec,
    seal,
    started_call,
    stash,
    unstash,
)
from .delegations import revoked_beneath
from .signatures import effect_fields_ok, effect_mac, head_problem

logger = logging.getLogger("ctrlrun.store")
S = EffectState
AMBIGUOUS = S.AMBIGUOUS.value
#: The error an attempt whose lease lapsed is recorded with (evidence: compared, never reworded).
LEASE_LAPSED_ERROR = "lease expired: the worker holding this effect never finished"


def move_effect(cursor: Any, statement: str, source: EffectState, target: EffectState, params: Sequence[Any]) -> Any:
    """THE state write: run ``statement`` (from ``sql``: target state first, source state last, none for an
    insert from ``new``) moving a record ``source -> target``, after checking the edge is in the state table."""
    if (source, target) not in TRANSITIONS:
        raise IllegalTransition(source.value, target.value)
    return cursor.execute(statement, [target.value, *params] if source is S.NEW else
                          [target.value, *params, source.value])


#: Refusals of a call the policy let through, made by its grant's budgets: their receipts say ``deny``, as
#: an authority refusal's (``authority_constraint``) does; POLICY_EVALUATED still says what the policy said.
BUDGET_REFUSALS = frozenset({"budget_exhausted", "budget_unmeasurable", "budget_unkeyed"})


def record_denial(call: Call, data: dict[str, Any], *, with_policy: bool = True) -> None:
    """A call refused before any effect: opening events, ACTION_DENIED, a ``denied`` receipt."""

    def build(when: dt.datetime) -> Built:
        denied = started_call(call, when)
        events = opening_events(denied, when, with_policy=with_policy)
        events.append(event_row(EventType.ACTION_DENIED, denied, denied.effect_key, data, when, denied.approval_id))
        refused = Decision.DENY if data["reason"] in BUDGET_REFUSALS else None  # the policy allowed; a budget refused
        return events, [ReceiptSpec(denied, Result.DENIED, data.get("error"), None, data["reason"], decision=refused)]

    with write_phase(clock=False) as when:
        seal((), (), when, build=build, sizes=(2 + bool(with_policy) + (call.authority is not None), 1))


def _revoked_refusal(call: Call, when: dt.datetime, events: list[EventRow]) -> Refused | None:
    """A call whose authority rests on a delegation revoked since it was judged: refused here, in the
    transaction that would have taken its key (``authority_revoked``), its evidence written."""
    revoked = revoked_beneath(call.delegations)
    if revoked is None:
        return None
    error = AuthorityDenied(f"{call.action.name} denied: authority_revoked (delegation {revoked!r} was revoked "
                            f"while the call was being decided)", reason="authority_revoked",
                            grant_id=call.authority_grant_id, delegation_id=revoked, action_id=call.action.action_id)
    events.append(event_row(EventType.ACTION_DENIED, call, call.effect_key,
                            {"reason": "authority_revoked", "delegation_id": revoked}, when, call.approval_id))
    seal(events, [ReceiptSpec(call, Result.DENIED, None, None, "authority_revoked")], when)
    return Refused(error, None, True, call)


def begin_unkeyed(call: Call, presented: str | None = None) -> Reserved | Refused:
    """A call with no effect key: nothing to reserve; the approval (if any) is checked and used.

    With no record to keep them on, its opening events join the chain now.
    """
    if call.budget_charges:
        raise InvalidArgument(messages.budget_needs_key(call.action.name))
    with write_phase() as when:
        call = started_call(call, when)
        events = opening_events(call, when)
        refusal = _revoked_refusal(call, when, events)
        if refusal is not None:
            return refusal
        call, approval, refusal = take_presented(call, presented, when, events)
        if refusal is not None:
            return refusal
        if approval is None and presented is not None and call.decision is Decision.ALLOW:
            approval, call = matching_approval(call, presented, when)
        _start_unkeyed(call, approval, events, when)
    return Reserved(1, when, call)


def _start_unkeyed(call: Call, approval: Approval | None, events: list[EventRow], when: dt.datetime) -> None:
    """An unkeyed call starts: the approval it uses (if any) consumed, its events sealed with EXECUTION_STARTED."""
    if approval is not None:
        events.append(consumption_event(approval, call, when, required=call.decision is Decision.APPROVE))
        mark_consumed(approval, call, when)
    events.append(event_row(EventType.EXECUTION_STARTED, call, None, {"task": call.task, "hop": call.hop}, when,
                            call.approval_id))
    seal(events, [], when)


# --------------------------------------------------------------------------- reservation


def _refusal_for(record: Any, tampered: bool = False) -> CTRLRunError:
    """Why a reservation of ``record``'s key is refused, as the error the protected call raises."""
    key, holder = record.effect_key, record.action_id
    if tampered:
        return AmbiguousEffect(messages.tampered_effect(key, record.state), effect_key=key, action_id=holder)
    if record.state == S.COMMITTED:
        return DuplicateEffect(messages.already_committed(key, holder), state="committed", effect_key=key)
    if record.state in HOLDING_STATES:
        return DuplicateEffect(messages.in_progress(key, holder, record.attempt, record.lease_expires_at),
                               state="in_progress", effect_key=key)
    if record.error == LEASE_LAPSED_ERROR:
        return AmbiguousEffect(messages.lease_lapsed(key, holder), effect_key=key, action_id=holder)
    return AmbiguousEffect(messages.unknown_outcome(key, holder), effect_key=key, action_id=holder)


def _record(effect_key: str, row: Sequence[Any], connection: Any) -> EffectView:
    """The key's row as ``sql.PEEK_COLUMNS`` reads it, with its signature checked."""
    (action, state, action_id, attempt, lease, error, resolved_by, failures, after, created, updated, pending,
     mac) = row
    lease, after, created, updated = (as_datetime(v, connection) for v in (lease, after, created, updated))
    ok = effect_fields_ok(effect_key, action, state, action_id, attempt, lease, resolved_by, pending, mac)
    return EffectView(effect_key, action, state, action_id, attempt, lease, error, resolved_by, failures, after,
                      created, updated, ok, pending, mac)


def peek(effect_key: str, *, lock: bool = True) -> EffectView | None:
    """The key's record as a decision reads it (locked, on PostgreSQL), without building a model."""
    connection = connections[alias()]
    with statements() as cursor:
        row = cursor.execute(sql.PEEK + (dialect(connection).ROW_LOCK if lock else ""), [effect_key]).fetchone()
    return None if row is None else _record(effect_key, row, connection)


def _open_reservation(effect_key: str, when: dt.datetime | None) -> tuple[dt.datetime, EffectView | None]:
    """The store's time and the key's record (locked), after making sure the chain head is ctrlrun's
    own: one statement. A call must not act when its evidence could not be kept."""
    connection = connections[alias()]
    database = dialect(connection)
    with statements() as cursor:
        row = cursor.execute(database.OPEN_RESERVATION, [effect_key]).fetchone()
        # No head, but evidence: either it was removed, or (a brand-new store's first writers) another
        # writer's head and evidence committed after this statement's snapshot, PostgreSQL reading
        # each statement afresh. Evidence is looked for first: a head commits with its evidence, so
        # evidence seen means its head is there too; the statement is then read again, head and all.
        # Evidence is looked for once: asked again below, it could appear in between (another first
        # writer committing) and be taken for a removed head.
        evidence = database.split_open(row)[1][0] is None and (objects(Receipt).exists() or objects(Event).exists())
        if evidence and objects(ChainHead).filter(pk=1).exists():
            row = cursor.execute(database.OPEN_RESERVATION, [effect_key]).fetchone()
    database_now, row = database.split_open(row)
    when = when or database_now
    assert when is not None
    head, beyond, found = row[:6], row[6], row[7:]
    if head[0] is not None:
        problem = head_problem(*head) or (messages.BEYOND_HEAD if beyond else None)
    elif evidence:  # a store emptied on purpose (a flush) has no head
        problem = messages.HEAD_MISSING
    else:
        problem = None
    if problem is not None:
        raise EvidenceTampered(messages.refuses_to_act(problem))
    return when, None if found[0] is None else _record(effect_key, found, connection)



def _rewound(record: EffectView) -> bool:
    """Whether the event chain shows this failed record is out of date: a later attempt was reserved, or
    the key was committed. A row put back from before (its signature is genuine) must not license a
    retry; this is read only before a retry renews a failed record, which is rare."""
    with statements() as cursor:
        rows = cursor.execute(sql.LATER_HISTORY, [record.effect_key]).fetchall()
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


def lapse(record: EffectView, when: dt.datetime, events: list[EventRow], receipts: list[ReceiptSpec]) -> EffectView:
    """A held record whose lease ran out: nobody knows what its worker did. Mark it ambiguous, and
    write what the worker could not: its opening events, its ambiguous event and its receipt. Returns
    the record as it now stands."""
    mac = effect_mac(record.effect_key, record.action, S.AMBIGUOUS, record.action_id, record.attempt, None, None, None)
    with statements() as cursor:
        move_effect(cursor, sql.EFFECT_LAPSE, S.EXECUTING, S.AMBIGUOUS, [
            LEASE_LAPSED_ERROR, time_param(connections[alias()])(when), mac, record.effect_key])
    dead: Call | None = None
    if record.pending:
        dead, _, waiting = unstash(record.pending)
        events += waiting
    else:
        dead = call_from_events(record.action_id, record.effect_key)
    events.append(event_row(EventType.EXECUTION_AMBIGUOUS, record.action_id, record.effect_key,
                            {"error": LEASE_LAPSED_ERROR, "reason": "lease_expired"}, when,
                            dead.approval_id if dead else None))
    if dead is not None:
        receipts.append(ReceiptSpec(dead, Result.AMBIGUOUS, LEASE_LAPSED_ERROR, record.attempt,
                                    would_have=dict(dead.would_have) if dead.would_have else None))
    else:
        logger.warning("effect %s (attempt %s) was swept, but its call could not be rebuilt from the evidence: no "
                       "receipt was written for it", record.effect_key, record.attempt)
    return replace(record, state=S.AMBIGUOUS, error=LEASE_LAPSED_ERROR, lease_expires_at=None, pending=None, mac=mac,
                   updated_at=when)


def _insert_fresh(call: Call, when: dt.datetime, lease_until: dt.datetime, pending: Pending) -> bool:
    """Insert the key's record as this call's, executing at attempt 1; False if the key exists.

    ``ON CONFLICT DO NOTHING`` makes losing the race an answer, not an error: on PostgreSQL a
    concurrent insert of the same key waits for the other transaction and then does nothing.
    """
    adapt = time_param(connections[alias()])
    stamp = adapt(when)
    key, action_id = call.effect_key, call.action.action_id
    with statements() as cursor:
        move_effect(cursor, sql.EFFECT_INSERT, S.NEW, INITIAL_STATE, [
            key, call.action.name, action_id, adapt(lease_until), stamp, stamp, pending.text,
            effect_mac(key, call.action.name, INITIAL_STATE, action_id, 1, lease_until, None, pending.text)])
        return cursor.fetchone() is not None


def _renew(record: EffectView, call: Call, attempt: int, when: dt.datetime, lease_until: dt.datetime,
           pending: Pending) -> None:
    """failed -> executing: the only automatic retry hands the key to this call at ``attempt``."""
    adapt = time_param(connections[alias()])
    key, action_id = call.effect_key, call.action.action_id
    with statements() as cursor:
        move_effect(cursor, sql.EFFECT_RENEW, S.FAILED, S.EXECUTING, [
            call.action.name, action_id, attempt, adapt(lease_until), adapt(when), pending.text,
            effect_mac(key, call.action.name, S.EXECUTING, action_id, attempt, lease_until, None, pending.text),
            key, record.attempt])


def _taking_events(call: Call, attempt: int, when: dt.datetime, lease_until: dt.datetime,
                   approval: Approval | None) -> list[EventRow]:
    events = []
    if approval is not None:
        events.append(consumption_event(approval, call, when, required=call.decision is Decision.APPROVE))
    events += [
        event_row(EventType.EFFECT_RESERVED, call, call.effect_key,
                  {"attempt": attempt, "lease_expires_at": evidence_time(lease_until)}, when, call.approval_id),
        event_row(EventType.EXECUTION_STARTED, call, call.effect_key, {"task": call.task, "hop": call.hop}, when,
                  call.approval_id),
    ]
    return events


def _over_ceiling(record: EffectView | None, max_attempts: int | None) -> bool:
    """Whether renewing ``record`` (a failed key) would run attempt ``max_attempts + 1`` or later."""
    return (max_attempts is not None and record is not None and record.state == S.FAILED
            and record.attempt + 1 > max_attempts)


def _ceiling_refusal(call: Call, record: EffectView, max_attempts: int, when: dt.datetime,
                     events: list[EventRow]) -> Refused:
    """Refuse attempt ``record.attempt + 1`` of a key whose policy allows ``max_attempts``: the event, a
    ``blocked`` receipt at the refused attempt, the row left failed as it is. Sealed here."""
    attempt = record.attempt + 1
    error = ActionDenied(messages.attempt_ceiling(call.action.name, call.effect_key, attempt, max_attempts),
                         reason="attempt_ceiling", action_id=call.action.action_id)
    events.append(event_row(EventType.EFFECT_RESERVATION_REFUSED, call, call.effect_key,
                            {"reason": "attempt_ceiling", "attempt": attempt, "max_attempts": max_attempts}, when,
                            call.approval_id))
    seal(events, [ReceiptSpec(call, Result.BLOCKED, str(error), attempt)], when)
    return Refused(error, attempt, True, call)


def _budget_refusal(call: Call, when: dt.datetime, events: list[EventRow]) -> Refused | None:
    """Check every budget charge of ``call`` (under the budgets' locks, held to the end of this phase):
    None when all fit; else refuse (ACTION_DENIED, a ``denied`` receipt, sealed here), nothing taken,
    the approval it presented left as it is."""
    found = budgets.exhausted(call.budget_charges, when)
    if found is None:
        return None
    charge, spent = found
    denied = replace(call, budget_charges=())
    error = ActionDenied(messages.budget_exhausted(charge.metric, charge.grant_id, charge.window_seconds, spent,
                                                   charge.limit, charge.amount),
                         reason="budget_exhausted", action_id=call.action.action_id)
    events.append(event_row(EventType.ACTION_DENIED, denied, denied.effect_key,
                            {"reason": "budget_exhausted", "grant_id": charge.grant_id, "metric": charge.metric,
                             "window": charge.window_seconds}, when, denied.approval_id))
    seal(events, [ReceiptSpec(denied, Result.DENIED, str(error), None, "budget_exhausted",
                              decision=Decision.DENY)], when)
    return Refused(error, None, True, denied)


def check_ceiling(call: Call, max_attempts: int) -> Refused | None:
    """The attempt ceiling's fast path, before an approval is asked for (§B6): a refusal (its evidence
    written) when the key's next attempt would pass ``max_attempts``, else None and nothing written."""
    with write_phase() as when:
        record = peek(call.effect_key, lock=False)
        if not _over_ceiling(record, max_attempts):
            return None
        assert record is not None
        call = started_call(call, when)
        return _ceiling_refusal(call, record, max_attempts, when, opening_events(call, when))


def reserve(call: Call, lease: dt.timedelta, *, opening: bool, hold_ambiguous: bool,
            presented: str | None = None, max_attempts: int | None = None) -> Reserved | Refused:
    """Take the call's effect key and mark it executing, or refuse (§5.3, §8.4).

    ``opening`` includes the call's opening events. With ``hold_ambiguous`` an ambiguous record is
    refused *without* a receipt (``final=False``) so the caller can ask a reconcile hook and try
    once more; every other refusal writes its event and receipt here.

    ``presented`` is the approval the caller holds. For an ``approve`` decision it is checked
    first (its refusal wins) and consumed only if the reservation succeeds, in this same
    transaction: a refused reservation leaves it granted. For an ``allow`` decision it is
    consumed only if it matches, and never blocks the call.

    ``max_attempts`` (the policy's attempt ceiling) refuses renewing a failed key past it, before
    the approval is looked at: the ceiling is the earlier decision point.

    ``call.budget_charges`` (authority, §C5) are checked after the ceiling and the approval, when the
    key would be taken, and charged to the ledger with the reservation; a charge that does not fit
    refuses the call (``ActionDenied(reason="budget_exhausted")``), nothing taken, the approval not
    used. A refused call comes back without charges.
    """
    with write_phase(clock=False) as when:
        # One statement: the key's record (locked), the chain head (checked: nothing acts on a forged
        # one) and, on PostgreSQL, the database's time, which the lease is computed from.
        when, record = _open_reservation(call.effect_key, when)
        call = started_call(call, when)
        events = opening_events(call, when) if opening else []
        revoked = _revoked_refusal(call, when, events)  # authority (2) before the ceiling (4)
        if revoked is not None:
            return revoked
        if _over_ceiling(record, max_attempts):
            assert record is not None and max_attempts is not None
            uncharged = replace(call, budget_charges=())
            return _ceiling_refusal(replace(uncharged, approval_id=presented) if presented else uncharged, record,
                                    max_attempts, when, events)
        call, approval, refusal = take_presented(call, presented, when, events)
        if refusal is not None:
            return replace(refusal, call=replace(refusal.call, budget_charges=()))
        taker = call
        if approval is None and presented is not None and call.decision is Decision.ALLOW:
            approval, taker = matching_approval(call, presented, when)
        lease_until = when + lease
        if record is None:
            if call.budget_charges:
                refused = _budget_refusal(call, when, events)
                if refused is not None:
                    return refused
            pending = stash(taker, 1, [*events, *_taking_events(taker, 1, when, lease_until, approval)])
            if _insert_fresh(taker, when, lease_until, pending):
                budgets.charge(taker.budget_charges, taker.effect_key, 1, when)
                if approval is not None:
                    mark_consumed(approval, taker, when)
                return Reserved(1, lease_until, replace(taker, pending=pending))
            # A concurrent first reservation won (on PostgreSQL the insert waited for it to commit).
            record = peek(call.effect_key)
        assert record is not None  # the insert found it, and a record is never deleted
        tampered = False
        lapsed = held_lapsed(record.state, record.lease_expires_at, when)
        if record.state == S.FAILED or lapsed:
            tampered = not record.signature_ok or (record.state == S.FAILED and _rewound(record))
        if record.state == S.FAILED and not tampered:
            attempt = record.attempt + 1
            if max_attempts is not None and attempt > max_attempts:  # lost a race to the last attempt
                return _ceiling_refusal(replace(call, budget_charges=()), record, max_attempts, when, events)
            if call.budget_charges:
                refused = _budget_refusal(call, when, events)
                if refused is not None:
                    return refused
            pending = stash(taker, attempt, [*events, *_taking_events(taker, attempt, when, lease_until, approval)])
            _renew(record, taker, attempt, when, lease_until, pending)
            budgets.charge(taker.budget_charges, taker.effect_key, attempt, when)
            if approval is not None:
                mark_consumed(approval, taker, when)
            return Reserved(attempt, lease_until, replace(taker, pending=pending))
        lapsed_events: list[EventRow] = []
        lapsed_receipts: list[ReceiptSpec] = []
        if lapsed and not tampered:
            record = lapse(record, when, lapsed_events, lapsed_receipts)  # kept even though this attempt is refused
        error = _refusal_for(record, tampered)
        call = replace(call, budget_charges=())  # refused: nothing charged
        if tampered:
            logger.error("effect %s: its record does not carry ctrlrun's signature; refusing to retry or sweep it",
                         call.effect_key)
        if isinstance(error, AmbiguousEffect) and hold_ambiguous and not tampered:
            seal([*lapsed_events, *events], lapsed_receipts, when)
            return Refused(error, record.attempt, False, call)
        seal([*lapsed_events, *events, _refusal_event(call, error, when)],
             [*lapsed_receipts, ReceiptSpec(call, Result.BLOCKED, str(error), record.attempt)], when)
        return Refused(error, record.attempt, True, call)


def _refusal_event(call: Call, error: CTRLRunError, when: dt.datetime) -> EventRow:
    if isinstance(error, DuplicateEffect):
        data = {"reason": "duplicate", "state": error.state}
    else:
        data = {"reason": "ambiguous"}
    return event_row(EventType.EFFECT_RESERVATION_REFUSED, call, call.effect_key, data, when, call.approval_id)


def record_refusal(refused: Refused) -> None:
    """Write the evidence of a refusal that ``reserve`` held back."""
    with write_phase() as when:
        call = refused.call
        seal([_refusal_event(call, refused.error, when)],
             [ReceiptSpec(call, Result.BLOCKED, str(refused.error), refused.attempt or 1)], when)


def _problem_name(error: CTRLRunError) -> str:
    """A reservation refusal as observe mode's ``blocked_reason``."""
    if isinstance(error, DuplicateEffect):
        return "duplicate" if error.state == "committed" else "in_progress"
    return "ambiguous"


def observe_begin(call: Call, lease: dt.timedelta, *, presented: str | None = None,
                  max_attempts: int | None = None, with_policy: bool = True, budget_problem: str | None = None,
                  scope_problem: str | None = None) -> Observation:
    """Begin an observe-mode call (§B3): record it, and take its effect key if the key is free, but
    refuse nothing. What would have refused it is returned, for its receipt.

    A free key (none yet, or failed under the ceiling) is reserved as usual, so the record says what
    really happened; a key that is committed, held or ambiguous is left as it is and the refusal is
    recorded (``EFFECT_RESERVATION_REFUSED``) before the call runs anyway. A presented approval is
    checked as enforcement would and used up only if it is valid and the key was taken (or there is
    no key); one that would be refused is left as it is. ``with_policy=False``: the policy did not
    decide the call (its effect key could not be made), so no POLICY_EVALUATED is written.

    Budget charges are checked where enforcement would check them (the key would be taken) and a
    charge that does not fit is reported (``budget_exhausted``); none is written to the ledger.
    """
    key = call.effect_key
    with write_phase(clock=False) as when:
        record = None
        if key is not None:
            when, record = _open_reservation(key, when)
        when = when or read_clock()
        charges, call = call.budget_charges, replace(started_call(call, when), budget_charges=())
        events = opening_events(call, when, with_policy=with_policy)
        approval, problem = None, None
        if presented is not None:
            if call.decision is Decision.APPROVE:
                call, approval, error = check_presented(call, presented, when, events)
                problem = getattr(error, "reason", None) if error is not None else None
            elif call.decision is Decision.ALLOW:
                approval, call = matching_approval(call, presented, when)
            else:
                call = replace(call, approval_id=presented)
        if key is None:
            _start_unkeyed(call, approval, events, when)
            return Observation(call, 1, False, approval_problem=problem)
        lease_until = when + lease
        attempt = 1 if record is None else record.attempt + 1
        taking = record is None or (record.state == S.FAILED and not _over_ceiling(record, max_attempts)
                                    and record.signature_ok and not _rewound(record))
        # Budgets are read as enforcement would (when the key would be taken), but nothing is charged:
        # observe mode writes no ledger rows.
        budget = taking and bool(charges) and budgets.exhausted(charges, when, lock=False) is not None
        if taking:
            # Held: kept with the record, so a sweeper writing this attempt's receipt writes an observed one.
            call = replace(call, would_have=Observation(call, attempt, True, approval_problem=problem,
                                                        budget_exhausted=budget).would_have(
                presented is not None, budget_problem=budget_problem, scope_problem=scope_problem))
            pending = stash(call, attempt, [*events, *_taking_events(call, attempt, when, lease_until, approval)])
            if record is None:
                taking = _insert_fresh(call, when, lease_until, pending)
                if not taking:  # a concurrent first reservation won
                    record = peek(key)
            else:
                _renew(record, call, attempt, when, lease_until, pending)
            if taking:
                if approval is not None:
                    mark_consumed(approval, call, when)
                return Observation(replace(call, pending=pending), attempt, True, approval_problem=problem,
                                   budget_exhausted=budget)
        assert record is not None
        ceiling = _over_ceiling(record, max_attempts)
        lapsed_events: list[EventRow] = []
        lapsed_receipts: list[ReceiptSpec] = []
        # As ``reserve`` reads it: the signature matters only where a retry or a sweep would act on the
        # row (failed, or held past its lease); a committed or live-held key is refused as such.
        lapsed = held_lapsed(record.state, record.lease_expires_at, when)
        tampered = (record.state == S.FAILED or lapsed) and (
            not record.signature_ok or (record.state == S.FAILED and _rewound(record)))
        if ceiling:
            refused = {"reason": "attempt_ceiling", "attempt": record.attempt + 1, "max_attempts": max_attempts}
            reservation = None
        else:
            if lapsed and not tampered:
                record = lapse(record, when, lapsed_events, lapsed_receipts)
            error = _refusal_for(record, tampered)
            refused = _refusal_event(call, error, when).data
            reservation = _problem_name(error)
        events += [event_row(EventType.EFFECT_RESERVATION_REFUSED, call, key, refused, when, call.approval_id),
                   event_row(EventType.EXECUTION_STARTED, call, key, {"task": call.task, "hop": call.hop}, when,
                             call.approval_id)]
        seal([*lapsed_events, *events], lapsed_receipts, when)
        return Observation(call, record.attempt + 1 if ceiling else record.attempt, False, ceiling=ceiling,
                           approval_problem=problem, reservation_problem=reservation)


def renew_lease(call: Call, attempt: int, lease: dt.timedelta) -> bool:
    """The heartbeat: extend a live attempt's lease from the store's clock. False when the record
    has moved on (swept after this worker stopped renewing, or finished). A lease only moves later
    (the database refuses otherwise), so a clock that stepped back leaves the later lease in place."""
    key = call.effect_key
    assert key is not None
    text = call.pending.text if call.pending else None
    with write_phase() as when:
        until = when + lease
        stamp = time_param(connections[alias()])(until)
        with statements() as cursor:
            move_effect(cursor, sql.LEASE_RENEW, S.EXECUTING, S.EXECUTING, [
                stamp,
                effect_mac(key, call.action.name, S.EXECUTING, call.action.action_id, attempt, until, None, text),
                key, call.action.action_id, attempt, stamp])
            if cursor.rowcount == 1:
                return True
        record = peek(key)
        return (record is not None and record.state == S.EXECUTING and record.action_id == call.action.action_id
                and record.attempt == attempt)


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
def record_outcome(call: Call, attempt: int | None, result: Result, *, error: str | None = None,
                   value: Any = None, write_receipt: bool = True, would_have: dict[str, Any] | None = None,
                   held: bool = True) -> OutcomeWrite:
    """Record how the function ended (§5.4), if this attempt still holds the row.

    ``result`` is committed, failed or ambiguous. When the row moved on meanwhile (this attempt's
    lease lapsed and someone swept it, or a human resolved it since), the row is left as it is
    and the call is recorded ambiguous: the function may have acted, and nobody recorded it.

    Observe mode: ``would_have`` makes the receipt ``observed``; ``held=False`` is a call that ran
    without taking its key (the row is not touched; only the events and the receipt are written).
    """
    key = call.effect_key
    data = {} if result is Result.COMMITTED else {"error": error}

    def outcome(when: dt.datetime) -> EventRow:
        return event_row(_EVENT_FOR[result], call, key, data, when, call.approval_id)

    def receipts() -> list[ReceiptSpec]:
        return [ReceiptSpec(call, result, error, attempt, would_have=would_have)] if write_receipt else []

    with write_phase(clock=False) as when:
        if key is None or not held:
            seal((), (), when, build=lambda at: ([outcome(at)], receipts()), sizes=(1, len(receipts())))
            return OutcomeWrite(True)
        state = _STATE_FOR[result]
        fields = [error, _jsonable_result(value) if result is Result.COMMITTED else None]
        holder = [effect_mac(key, call.action.name, state, call.action.action_id, attempt, None, None, None), key,
                  call.action.action_id, attempt]
        with statements() as cursor:
            # One conditional UPDATE both checks that this attempt still holds the row and moves it.
            for held in ((S.EXECUTING,) if result is not Result.AMBIGUOUS else (S.EXECUTING, S.AMBIGUOUS)):
                # Swept while it ran, and now it knows it hit an exception: that is recorded too
                # (ambiguous, idempotently); whoever swept it already wrote its opening events.
                if when is None:
                    row = move_effect(cursor, sql.OUTCOME_UPDATE_NOW, held, state, [*fields, *holder]).fetchone()
                    moved, at = row is not None, row[0] if row is not None else None
                else:
                    move_effect(cursor, sql.OUTCOME_UPDATE_AT, held, state,
                                [*fields, time_param(cursor.connection)(when), *holder])
                    moved, at = cursor.rowcount == 1, when
                if moved:
                    returned: list[EventRow] = []
                    if state is S.FAILED:  # NotExecuted: the attempt's budget charges and approval are given back
                        budgets.release(key, attempt, at)
                        if call.approval_id is not None:
                            returned = give_back(call.approval_id, key, call.action.action_id, attempt, at,
                                                 {"reason": "not_executed", "error": error})
                    waiting = call.pending.events if call.pending and held is S.EXECUTING else ()
                    seal([*waiting, outcome(at), *returned], receipts(), at)
                    return OutcomeWrite(True)
        when = when or read_clock()
        record = objects(EffectRecord).filter(pk=key).first()
        refusal = _outcome_refusal(key, record)
        why = messages.outcome_refused(result.value, error, str(refusal))
        seal([event_row(EventType.EXECUTION_AMBIGUOUS, call, key, {"error": why}, when, call.approval_id)],
             [ReceiptSpec(call, Result.AMBIGUOUS, why, attempt, would_have=would_have)], when)
        return OutcomeWrite(False, refusal)


def _outcome_refusal(key: str, record: EffectRecord | None) -> AmbiguousEffect:
    text = messages.outcome_not_recorded(
        key, found=str(record.state) if record else None, resolved_by=record.resolved_by if record else None,
        action_id=record.action_id if record else None, attempt=record.attempt if record else None)
    return AmbiguousEffect(text, effect_key=key, action_id=record.action_id if record else None)
