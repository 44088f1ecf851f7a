"""Suspended attempts (spec A5): a continuation held with its effect key, taken once by a resume.

``hold_continuation`` runs after the executor raised ``ctrlrun.Suspended``, in one transaction: the
attempt's record stays ``executing`` (its lease moved to the suspension's end, never earlier), its
opening events join the chain with ``EXECUTION_SUSPENDED {held: true, round: N}``, and the key's
continuation row is written (signed), naming the SHA-256 of the token, never the token.

``take_continuation`` is the resume's first phase: the row whose digest matches, whose signature
holds, whose attempt still holds its record and whose suspension has not lapsed, is taken by ONE
conditional UPDATE (``continuation`` emptied where it still equals the digest): of two processes
resuming the same token, exactly one moves the row. It writes ``EXECUTION_RESUMED {round: N}`` and
hands back the suspended call. Anything else is ``InvalidArgument``, and nothing is written.

A suspension nobody resumes lapses like a lease: its record is ``executing`` with a past lease, so
the sweeper (or the next reservation of the key) records it ambiguous.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import replace
from typing import Any

from django.db import connections

from ..errors import InvalidArgument
from ..models import Continuation
from ..times import when_text
from ..states import EffectState as S, EventType
from ..values import Call
from . import sql
from .base import alias, objects, statements, time_param, write_phase
from .chain import event_row, seal, stash, unstash
from .effects import move_effect, peek
from .signatures import continuation_mac, continuation_ok, effect_mac

NO_SUCH = ("no held suspension matches this continuation (it was resumed already, never issued, or its "
           "attempt has ended); a continuation resumes its call once")


def digest(continuation: str | bytes) -> str:
    """The stored name of a continuation token: ``sha256:<hex>`` of its bytes (text as UTF-8)."""
    if isinstance(continuation, str):
        continuation = continuation.encode("utf-8")
    if not isinstance(continuation, bytes) or not continuation:
        raise InvalidArgument("a continuation is a non-empty str or bytes (what the executor raised Suspended with)")
    return "sha256:" + hashlib.sha256(continuation).hexdigest()


def hold_continuation(call: Call, attempt: int, continuation: str | bytes, timeout: dt.timedelta) -> int:
    """Hold ``call``'s key under ``continuation`` until ``timeout`` from now; the round (1, 2, ...).
    ``InvalidArgument`` when the attempt no longer holds its record (swept meanwhile)."""
    key = call.effect_key
    assert key is not None
    name = digest(continuation)
    with write_phase() as when:
        record = peek(key)
        if record is None or record.state != S.EXECUTING or record.action_id != call.action.action_id \
                or record.attempt != attempt:
            raise InvalidArgument(f"{call.action.name}: effect {key!r} is no longer held by this attempt; the "
                                  "suspension could not be held (its lease lapsed before it suspended)")
        until = when + timeout
        if record.lease_expires_at is not None and record.lease_expires_at > until:
            until = record.lease_expires_at  # a lease only moves later
        stamp = time_param(connections[alias()])(until)
        with statements() as cursor:
            move_effect(cursor, sql.SUSPEND_HOLD, S.EXECUTING, S.EXECUTING, [
                stamp, effect_mac(key, call.action.name, S.EXECUTING, call.action.action_id, attempt, until, None, None),
                key, call.action.action_id, attempt])
            if cursor.rowcount != 1:  # pragma: no cover - the row is locked above
                raise InvalidArgument(f"{call.action.name}: effect {key!r} moved while it was being suspended")
        row = objects(Continuation).filter(pk=key).first()
        same = row is not None and row.action_id == call.action.action_id and row.attempt == attempt \
            and continuation_ok(row)
        bare = replace(call, pending=None)
        row = Continuation(effect_key=key, action_id=call.action.action_id, attempt=attempt,
                           action_json=stash(bare, attempt, ()).text, continuation=name,
                           rounds=(row.rounds if same else 0) + 1, held_until=until, updated_at=when)
        row.mac = continuation_mac(row)
        row.save(using=objects(Continuation).db)
        waiting = list(call.pending.events) if call.pending else []
        seal([*waiting, event_row(EventType.EXECUTION_SUSPENDED, call, key, {"held": True, "round": row.rounds}, when,
                                  call.approval_id)], (), when)
        return row.rounds


def take_continuation(continuation: str | bytes) -> tuple[Call, int, int]:
    """Take the suspension ``continuation`` names, once: (its call, attempt, round)."""
    name = digest(continuation)
    with write_phase() as when:
        row = objects(Continuation).filter(continuation=name).first()
        if row is None:
            raise InvalidArgument(NO_SUCH)
        if not continuation_ok(row):
            raise InvalidArgument(f"the suspension of effect {row.effect_key!r} does not carry ctrlrun's signature "
                                  "(its row was written or changed around ctrlrun): it is not resumed; "
                                  "'receipts --verify-chain' and 'effects' show the key")
        record = peek(row.effect_key)
        if record is None or record.state != S.EXECUTING or record.action_id != row.action_id \
                or record.attempt != row.attempt or not record.signature_ok:
            raise InvalidArgument(NO_SUCH)
        if record.lease_expires_at is None or record.lease_expires_at <= when or row.held_until <= when:
            raise InvalidArgument(f"the suspension of effect {row.effect_key!r} lapsed at {when_text(row.held_until)} "
                                  f"(suspend_timeout): it is recorded ambiguous, not resumed; reconcile or resolve "
                                  f"the key")
        taken = objects(Continuation).filter(pk=row.pk, continuation=name, rounds=row.rounds).update(
            continuation=None, updated_at=when, mac=continuation_mac(replace_continuation(row, None)))
        if taken != 1:
            raise InvalidArgument(NO_SUCH)
        call, _, _ = unstash(row.action_json)
        seal([event_row(EventType.EXECUTION_RESUMED, call, row.effect_key, {"round": row.rounds}, when,
                        call.approval_id)], (), when)
        return call, row.attempt, row.rounds


def held_principal(continuation: str | bytes) -> Any:
    """Who the call suspended under ``continuation`` acts for (its action's principal), read without
    taking it; None when no signed suspension has that name."""
    from .base import reading

    name = digest(continuation)
    with reading():
        row = objects(Continuation).filter(continuation=name).first()
    if row is None or not continuation_ok(row):
        return None
    call, _, _ = unstash(row.action_json)
    return call.action.principal


def replace_continuation(row: Continuation, continuation: str | None) -> Any:
    copy = Continuation(**{f.attname: getattr(row, f.attname) for f in Continuation._meta.concrete_fields})
    copy.continuation = continuation
    return copy


def continuation_rounds(effect_key: str) -> int:
    """How many times the key's current attempt was suspended (0: never)."""
    from .base import reading

    with reading():
        row = objects(Continuation).filter(pk=effect_key).first()
        return row.rounds if row is not None and continuation_ok(row) else 0
