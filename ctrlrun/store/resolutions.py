"""The ends of an AMBIGUOUS effect: a reconcile hook's answer, a person's resolution, the sweep of
lapsed leases, and the list reconciliation works through. Every state write still goes through
``effects.move_effect``, which checks the state table."""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from django.db import connections
from django.db.models import Q

from .. import conf, messages
from ..canonical import evidence_text
from ..errors import InvalidArgument, StateConflict
from ..models import EffectRecord
from ..states import HOLDING_STATES, EffectState, EventType, Result, held_lapsed
from ..values import Call, EffectView, EventRow, HookAnswer
from . import budgets, sql
from .approvals import give_back
from .base import alias, objects, read_clock, reading, statements, time_param, write_phase
from .chain import event_row, ReceiptSpec, seal
from .evidence import effect_view, get_effect
from .signatures import effect_mac, effect_ok
from .effects import AMBIGUOUS, S, lapse, move_effect, peek

logger = logging.getLogger("ctrlrun.store")


def _move_ambiguous(record: EffectRecord, state: EffectState, resolver: str, when: dt.datetime) -> None:
    """ambiguous -> committed | failed on the locked ``record``, and on the model read; failed gives the
    attempt's budget charges back, in the same phase."""
    record.error = f"resolved {state.value} by {resolver} (was: {record.error})"
    record.resolved_by = resolver
    record.reconcile_after = None
    record.updated_at = when
    record.mac = effect_mac(record.effect_key, record.action, state, record.action_id, record.attempt, None,
                            resolver, None)
    with statements() as cursor:
        move_effect(cursor, sql.EFFECT_RESOLVE, S.AMBIGUOUS, state, [
            record.error, resolver, time_param(connections[alias()])(when), record.mac, record.effect_key])
    record.state = state
    if state is S.FAILED:  # it did not happen: the attempt's budget charges are given back
        budgets.release(record.effect_key, record.attempt, when)


def record_reconciliation(effect_key: str, action_id: str | None, resolver: str, trigger: str,
                          answer: HookAnswer, *, attempt: int, receipt_for: Call | None = None,
                          receipt_attempt: int | None = None, receipt_error: str | None = None,
                          requested_by: str | None = None, receipt_would_have: dict[str, Any] | None = None
                          ) -> str | None:
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
    with write_phase() as when:
        record = objects(EffectRecord).select_for_update().filter(pk=effect_key).first()
        events = [
            event_row(EventType.RECONCILIATION_STARTED, action_id, effect_key,
                      {"effect_key": effect_key, "trigger": trigger,
                       **({"requested_by": requested_by} if requested_by else {})},
                      when - dt.timedelta(seconds=max(answer.duration, 0.0))),
            event_row(EventType.RECONCILIATION_RESOLVED, action_id, effect_key, answer.data(), when),
        ]
        if record is None or record.state != S.AMBIGUOUS or record.attempt != attempt or not effect_ok(record):
            if record is not None and record.state == S.AMBIGUOUS and record.attempt == attempt:
                now_is = f"ambiguous at attempt {attempt}, but {messages.TAMPERED_HINT}"
            else:
                now_is = f"{record.state} at attempt {record.attempt}" if record else "gone"
            logger.warning("reconcile answer %r for %s (attempt %s) dropped: the record is %s now", answer.outcome,
                           effect_key, attempt, now_is)
            events[-1].data["dropped"] = f"the record is {now_is}; this answer was about attempt {attempt}"
            moved = "dropped"
        elif answer.outcome in ("committed", "not_executed"):
            state = S.COMMITTED if answer.outcome == "committed" else S.FAILED
            _move_ambiguous(record, state, resolver, when)
            moved = state.value
            events.append(event_row(EventType.EFFECT_RESOLVED, action_id, effect_key,
                                    {"state": state.value, "resolver": resolver, "resolved_by": "reconcile"}, when))
            if state is S.FAILED:  # the hook says it never happened: the approval it used is given back
                events += give_back(None, effect_key, record.action_id, record.attempt, when,
                                    {"reason": "reconcile_not_executed", "resolver": resolver})
        else:
            first, cap = conf.reconcile_backoff()
            delay = min(first * (2 ** min(record.reconcile_failures, 30)), cap)
            record.reconcile_failures += 1
            record.reconcile_after = when + delay
            with statements() as cursor:
                move_effect(cursor, sql.RECONCILE_BACKOFF, S.AMBIGUOUS, S.AMBIGUOUS,
                            [time_param(connections[alias()])(record.reconcile_after), effect_key])
        receipts = [] if receipt_for is None else [
            ReceiptSpec(receipt_for, Result.AMBIGUOUS, receipt_error, receipt_attempt, would_have=receipt_would_have)]
        seal(events, receipts, when)
    return moved


def write_ambiguous_receipt(call: Call, attempt: int | None, error: str,
                            would_have: dict[str, Any] | None = None) -> None:
    """The eager trigger's receipt when the hook itself never returned (it raised a BaseException)."""
    with write_phase() as when:
        seal([], [ReceiptSpec(call, Result.AMBIGUOUS, error, attempt, would_have=would_have)], when)


def resolve(effect_key: str, outcome: str, *, by: str, reason: str | None = None,
            attempt: int | None = None, via: str | None = None) -> EffectView:
    """A human says what happened to an ambiguous effect (``committed`` or ``failed``)."""
    if outcome not in ("committed", "failed"):
        raise InvalidArgument(messages.resolve_which(outcome))
    if not by or not by.strip():
        raise InvalidArgument(messages.RESOLVE_NEEDS_NAME)
    with write_phase() as when:
        record = objects(EffectRecord).select_for_update().filter(pk=effect_key).first()
        if record is None:
            raise StateConflict("effect", effect_key, AMBIGUOUS, "missing", operation="resolve")
        if record.state != S.AMBIGUOUS:
            raise StateConflict("effect", effect_key, AMBIGUOUS, str(record.state), operation="resolve",
                                lapsed=held_lapsed(record.state, record.lease_expires_at, when))
        if not effect_ok(record):
            raise StateConflict("effect", effect_key, AMBIGUOUS, "tampered", operation="resolve")
        if attempt is not None and attempt != record.attempt:
            raise StateConflict("effect", effect_key, AMBIGUOUS, AMBIGUOUS, operation="resolve",
                                attempt=record.attempt, expected_attempt=attempt)
        resolver = evidence_text(by.strip())
        state = S.COMMITTED if outcome == "committed" else S.FAILED
        _move_ambiguous(record, state, resolver, when)
        data = {"state": state.value, "resolver": resolver, "resolved_by": "human", "attempt": record.attempt}
        if reason:
            data["reason"] = evidence_text(reason)
        if via:
            data["via"] = evidence_text(via)
        seal([event_row(EventType.EFFECT_RESOLVED, record.action_id, effect_key, data, when)], [], when)
    return effect_view(record)


def sweep_lapsed(action: str | None = None, effect_key: str | None = None) -> list[EffectView]:
    """Move every held record whose lease lapsed to ambiguous (its worker died, hung or was frozen
    past its lease), writing the dead attempt's evidence. Leases are compared with the store's clock."""
    swept: list[EffectView] = []
    with reading():
        cutoff = read_clock()
        query = objects(EffectRecord).filter(state__in=HOLDING_STATES, lease_expires_at__lte=cutoff)
        if action:
            query = query.filter(action=action)
        if effect_key:
            query = query.filter(pk=effect_key)
        keys = list(query.values_list("effect_key", flat=True))
    for key in keys:
        with write_phase() as when:
            record = peek(key)
            if record is None or record.state != S.EXECUTING or record.lease_expires_at > when:
                continue  # its worker finished or renewed, or someone else swept it, meanwhile
            if not record.signature_ok:
                logger.error("effect %s has a lapsed lease, but %s; it is not swept", key, messages.TAMPERED_HINT)
                continue
            events: list[EventRow] = []
            receipts: list[ReceiptSpec] = []
            lapse(record, when, events, receipts)
            seal(events, receipts, when)
        view = get_effect(key)
        if view is not None:
            swept.append(view)
    return swept


def reconcile_candidates(action: str | None = None, limit: int | None = None) -> list[EffectView]:
    """Ambiguous records due for a deferred reconcile (backoff respected), oldest first."""
    with reading():
        cutoff = read_clock()
        query = objects(EffectRecord).filter(state=S.AMBIGUOUS).filter(
            Q(reconcile_after__isnull=True) | Q(reconcile_after__lte=cutoff)
        ).order_by("updated_at", "effect_key")
        if action:
            query = query.filter(action=action)
        if limit:
            query = query[:limit]
        return [effect_view(r) for r in query]
