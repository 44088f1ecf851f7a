"""Writing a verified reference store into ours (``import``, docs/importing.md), in one transaction.

Each of the source's receipts becomes a ``RECEIPT_IMPORTED`` event holding its stored JSON byte for
byte (so its own hash can be recomputed from our chain at any time), each effect record one of ours
(same key, same state; a reference record still ``executing`` becomes ``ambiguous``: nobody knows)
with an ``EFFECT_IMPORTED`` event, and a final ``STORE_IMPORTED`` event names the source's head.
Our event chain covers all of it from then on: the source file may be archived or deleted.

An effect record enters our store the only way the guard lets one in (``executing`` at attempt 1),
then moves along the state table: ``committed``/``failed``/``ambiguous`` as the source had it, and a
record the source's operator resolved goes through ``ambiguous`` first so its resolver is kept.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import connections

from ..canonical import canonical_bytes, sha256_hash
from ..errors import InvalidArgument
from ..models import ChainHead, EffectRecord, Event
from ..states import EffectState, EventType
from . import sql
from .base import alias, objects, reading, statements, time_param, write_phase
from .chain import event_row, seal
from .effects import move_effect
from .signatures import effect_mac

S = EffectState
#: Events appended per statement (SQLite binds at most 32,766 parameters; an event takes 9).
BATCH = 500
#: The action of an effect whose action the source never named (its receipts and events were lost).
UNNAMED_ACTION = "reference.unnamed"


@dataclasses.dataclass
class Imported:
    receipts: int
    effects: dict[str, int]
    events: int
    at: dt.datetime


def already_imported(head_hash: str, first_receipt: str | None) -> dict[str, Any] | None:
    """The STORE_IMPORTED event's data of an earlier import of this source (same head, same first receipt)."""
    for data in objects(Event).filter(type=EventType.STORE_IMPORTED.value).values_list("data", flat=True):
        source = data.get("source") if isinstance(data, dict) else None  # the field parses the stored JSON
        if not isinstance(source, dict):
            continue
        if source.get("head_hash") == head_hash and source.get("first_receipt") == first_receipt:
            return source
    return None


def imported() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each import's STORE_IMPORTED source, with the RECEIPT_IMPORTED data written just before it."""
    found: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    documents: list[dict[str, Any]] = []
    with reading():
        rows = list(objects(Event).filter(type__in=[EventType.RECEIPT_IMPORTED.value, EventType.STORE_IMPORTED.value])
                    .order_by("seq").values_list("type", "data"))
    for type_, data in rows:
        if not isinstance(data, dict):  # (the field parsed it; an unreadable row is named by the chain check)
            continue
        if type_ == EventType.RECEIPT_IMPORTED.value:
            documents.append(data)
        else:
            found.append((data.get("source") or {}, documents))
            documents = []
    return found


def existing_keys(keys: Sequence[str]) -> list[str]:
    found: list[str] = []
    for start in range(0, len(keys), BATCH):
        found += objects(EffectRecord).filter(pk__in=keys[start:start + BATCH]).values_list("pk", flat=True)
    return sorted(found)


def _insert(cursor: Any, effect: Any, action: str, when: dt.datetime) -> None:
    """The record, executing at the source's attempt: in at attempt 1 (the guard's only way in), then one
    retry at a time (executing -> failed -> executing at the next attempt), so an attempt's token
    (``idempotency_token_for(key, attempt)``) means the same attempt here as there."""
    adapt = time_param(connections[alias()])
    lease = when + dt.timedelta(minutes=1)  # executing only inside this transaction: no one else sees it
    key, action_id = effect.effect_key, effect.action_id
    move_effect(cursor, sql.EFFECT_INSERT, S.NEW, S.EXECUTING, [
        key, action, action_id, adapt(lease), adapt(when), adapt(when), None,
        effect_mac(key, action, S.EXECUTING, action_id, 1, lease, None, None)])
    if cursor.fetchone() is None:
        raise InvalidArgument(f"effect {key!r} appeared in this store while importing; nothing was "
                              "imported (run import again)")
    for attempt in range(2, effect.attempt + 1):
        move_effect(cursor, sql.OUTCOME_UPDATE_AT, S.EXECUTING, S.FAILED, [
            f"attempt {attempt - 1} in the reference store (imported)", None, adapt(when),
            effect_mac(key, action, S.FAILED, action_id, attempt - 1, None, None, None), key, action_id, attempt - 1])
        move_effect(cursor, sql.EFFECT_RENEW, S.FAILED, S.EXECUTING, [
            action, action_id, attempt, adapt(lease), adapt(when), None,
            effect_mac(key, action, S.EXECUTING, action_id, attempt, lease, None, None), key, attempt - 1])


def _finish(cursor: Any, effect: Any, action: str, target: EffectState, when: dt.datetime) -> str | None:
    """executing -> the source's state (through ambiguous when a person resolved it there), at its attempt."""
    adapt = time_param(connections[alias()])
    attempt = effect.attempt
    resolver = f"{effect.resolved_by} (reference)" if effect.resolved_by and target is not S.AMBIGUOUS else None
    first = S.AMBIGUOUS if resolver else target
    result = effect.result_json if target is S.COMMITTED else None  # kept through a resolution too
    error = effect.error if target is not S.COMMITTED or resolver else None
    if effect.state == "executing":
        error = "executing in the reference store when it was imported: its worker never finished here"
    move_effect(cursor, sql.OUTCOME_UPDATE_AT, S.EXECUTING, first, [
        error, result, adapt(when),
        effect_mac(effect.effect_key, action, first, effect.action_id, attempt, None, None, None),
        effect.effect_key, effect.action_id, attempt])
    if resolver:
        move_effect(cursor, sql.EFFECT_RESOLVE, S.AMBIGUOUS, target, [
            effect.error, resolver, adapt(when),
            effect_mac(effect.effect_key, action, target, effect.action_id, attempt, None, resolver, None),
            effect.effect_key])
    return resolver


def write(report: Any, source: dict[str, Any], *, by: str) -> Imported:
    """Import the verified ``report`` (``reference_store.SourceReport``); ``source`` is the STORE_IMPORTED data's."""
    from ..reference_store import STATES

    keys = [e.effect_key for e in report.effects]
    with write_phase() as when:
        # The chain head first: two imports (or an import and a call) wait for each other here, so the
        # already-imported check below sees the other's commit (PostgreSQL; SQLite's BEGIN IMMEDIATE does).
        objects(ChainHead).select_for_update().filter(pk=1).first()
        earlier = already_imported(report.head_hash, source.get("first_receipt"))
        if earlier is not None:
            raise InvalidArgument(f"this reference store (head seq {report.head_seq}, {report.head_hash}) was already "
                                  f"imported at {earlier.get('imported_at')}: nothing was imported again")
        clash = existing_keys(keys)
        if clash:
            raise InvalidArgument(f"{len(clash)} effect key(s) of the reference store already have a record here "
                                  f"({', '.join(repr(k) for k in clash[:5])}{', ...' if len(clash) > 5 else ''}): "
                                  "import into a store that has not run them; nothing was imported")
        events = [event_row(EventType.RECEIPT_IMPORTED, None, None, {
            "seq": r.seq, "receipt_id": r.receipt_id, "schema": r.schema, "hash": r.hash, "prev_hash": r.prev_hash,
            "content_hash": sha256_hash(r.text.encode("utf-8")), "document": r.text}, when)
            for r in report.receipts]
        states: dict[str, int] = {}
        with statements() as cursor:
            for effect in report.effects:
                action = effect.action or UNNAMED_ACTION
                target = S(STATES[effect.state])
                _insert(cursor, effect, action, when)
                resolver = _finish(cursor, effect, action, target, when)
                states[target.value] = states.get(target.value, 0) + 1
                events.append(event_row(EventType.EFFECT_IMPORTED, effect.action_id, effect.effect_key, {
                    "state": target.value, "source_state": effect.state, "source_attempt": effect.attempt,
                    "action": action, "error": effect.error, "resolved_by": resolver}, when))
        summary = {**source, "imported_at": when.isoformat(), "imported_by": by,
                   "receipts_digest": sha256_hash(canonical_bytes([r.hash or sha256_hash(r.text.encode("utf-8"))
                                                                   for r in report.receipts])),
                   "effects": dict(sorted(states.items()))}
        events.append(event_row(EventType.STORE_IMPORTED, None, None, {"source": summary}, when))
        for start in range(0, len(events), BATCH):
            seal(events[start:start + BATCH], [], when)
    return Imported(len(report.receipts), states, len(events), when)
