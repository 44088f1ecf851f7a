"""Reading the evidence and checking it: views of records, receipts and events; chain verification,
recorded checks, the head's position, the console's overview.

Reads never lock. A check walks both chains in batches (``_verify``: the full check is the
incremental walk from the genesis) and checks every signed row it is given against the story
the event chain tells about it.
"""
from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Q

from .. import signing
from ..canonical import GENESIS_HASH, evidence_time, new_id
from ..errors import CTRLRunError, InvalidArgument
from ..models import Approval, ChainCheck, ChainHead, EffectRecord, Event, Receipt
from ..receipts import (
    INDEXED_COLUMNS,
    PROGRESS_EVERY,
    ChainBreak,
    ChainReport,
    EventWalk,
    ReceiptWalk,
    StoredEvent,
    StoredReceipt,
)
from ..states import HOLDING_STATES, ApprovalStatus, EffectState
from ..values import ChainCheckView, EffectView, EventView, Overview, ReceiptView
from .base import alias, as_datetime, dialect, now, objects, read_clock, reading, statements, write_phase
from .chain import unstash
from .integrity import delegation_events, row_breaks
from .signatures import CHECK_DOMAIN, HEAD_FIELDS, approval_ok, check_document, check_ok, effect_ok, head_problem

S = EffectState


def effect_view(record: EffectRecord) -> EffectView:
    return EffectView(
        effect_key=record.effect_key, action=record.action, state=record.state, action_id=record.action_id,
        attempt=record.attempt, lease_expires_at=record.lease_expires_at, error=record.error,
        resolved_by=record.resolved_by, reconcile_failures=record.reconcile_failures,
        reconcile_after=record.reconcile_after, created_at=record.created_at, updated_at=record.updated_at,
        signature_ok=effect_ok(record), pending=record.pending, mac=record.mac,
    )


def _receipt_view(row: Receipt) -> ReceiptView:
    return ReceiptView(
        receipt_id=row.receipt_id, seq=row.seq, action_id=row.action_id, action=row.action, agent=row.agent,
        decision=row.decision, result=row.result, effect_key=row.effect_key, ts=row.ts, document=row.document,
    )


def _event_view(row: Event) -> EventView:
    return EventView(id=row.id, ts=row.ts, type=row.type, action_id=row.action_id, effect_key=row.effect_key,
                     approval_id=row.approval_id, data=row.data, seq=row.seq)


def _waiting_views(records: Any) -> list[EventView]:
    """The opening events of running attempts, not yet in the chain (shown with id 0)."""
    views = []
    for text in records:
        try:
            _, _, waiting = unstash(text)
        except (ValueError, KeyError, TypeError, CTRLRunError):
            continue
        views += [EventView(0, e.ts, e.type, e.action_id, e.effect_key, e.approval_id, e.data) for e in waiting]
    return views


def get_effect(effect_key: str) -> EffectView | None:
    with reading():
        record = objects(EffectRecord).filter(pk=effect_key).first()
        return effect_view(record) if record else None


def list_effects(state: str | None = None) -> list[EffectView]:
    query = objects(EffectRecord).order_by("updated_at", "effect_key")
    if state:
        query = query.filter(state=state)
    return [effect_view(r) for r in query]


def _citing_sql(connection: Any) -> str:
    """The SQL condition "this receipt's ``controls`` list holds the id %s, exactly" (one parameter).

    Done in the database with its JSON functions; a list element is compared whole, so ``pci``
    does not match ``pci-3.4``, and a ``controls`` that is not a list (a row altered outside
    ctrlrun) cites nothing. On SQLite a document that is not JSON cites nothing; PostgreSQL cannot
    ask that before version 16, so there the query fails (see ``citing_control``)."""
    return dialect(connection).citing_condition(f'{connection.ops.quote_name(Receipt._meta.db_table)}."document"')


def check_control_id(control: str) -> str:
    """A control id as asked for (a command's argument, a console URL): refused in one line when
    it cannot be one (empty, or holding a NUL, which no database can be sent)."""
    if not isinstance(control, str) or control == "":
        raise InvalidArgument("a control id is needed: --control ID (e.g. --control pci-3.4)")
    if "\x00" in control:
        raise InvalidArgument("a control id never holds a NUL character")
    return control


def citing_control(control: str) -> tuple[str, list[str]]:
    """The SQL condition on ctrlrun's receipts table, and its parameters, that holds for the receipts
    whose ``controls`` list holds ``control`` exactly, on the store's database: the console's list
    filter narrows its rows with it (``.extra(where=[sql], params=params)``), in the database."""
    check_control_id(control)
    return _citing_sql(connections[alias()]), [control]


def unreadable_documents(exc: DatabaseError) -> CTRLRunError:
    return CTRLRunError(
        f"a receipt's document could not be read as JSON, so receipts cannot be searched by control "
        f"(a row was altered outside ctrlrun): run 'receipts --verify-chain', which names it "
        f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})")


def list_receipts(last: int | None = None, control: str | None = None) -> list[ReceiptView]:
    """The receipts in chain order (the ``last`` N of them); with ``control``, only those citing it."""
    query = objects(Receipt).all()
    if control is not None:
        condition, params = citing_control(control)
        query = query.extra(where=[condition], params=params)
    query = query.order_by("-seq") if last else query.order_by("seq")
    try:
        with transaction.atomic(using=query.db):
            rows = list(query[:last]) if last else list(query)
    except DatabaseError as exc:
        if control is None:
            raise
        raise unreadable_documents(exc) from None
    if last:
        rows.reverse()
    return [_receipt_view(r) for r in rows]


def receipt_documents_since(since: dt.datetime, *, chunk_size: int = 1000,
                            limit: int | None = None) -> Iterator[dict[str, Any] | None]:
    """Every receipt finished at or after ``since`` (its ``ts`` column, indexed), as its parsed
    document, or None for a row whose document is not a JSON object; read in batches of
    ``chunk_size``, never all at once (a server-side cursor on PostgreSQL). In no particular order;
    with ``limit``, only the most recent ``limit`` of them."""
    with reading():
        rows = objects(Receipt).filter(ts__gte=since)
        rows = (rows.order_by("-ts")[:limit] if limit is not None else rows.order_by()).values_list(
            "document", flat=True)
        for text in rows.iterator(chunk_size=chunk_size):
            try:
                doc = json.loads(text)
            except (TypeError, ValueError, RecursionError):  # a row altered around ctrlrun: counted, not fatal
                doc = None
            yield doc if isinstance(doc, dict) else None


def get_receipt(receipt_id: str) -> ReceiptView | None:
    row = objects(Receipt).filter(pk=receipt_id).first()
    return _receipt_view(row) if row else None


def receipts_for_action(action_id: str) -> list[ReceiptView]:
    return [_receipt_view(r) for r in objects(Receipt).filter(action_id=action_id).order_by("seq")]


def events_for_action(action_id: str) -> list[EventView]:
    """Every event of one action, in the order written; a running call's waiting events last."""
    chained = [_event_view(e) for e in objects(Event).filter(action_id=action_id).order_by("id")]
    rows = objects(EffectRecord).filter(action_id=action_id, pending__isnull=False)
    waiting = [r.pending for r in rows if effect_ok(r)]
    return chained + [e for e in _waiting_views(waiting) if e.action_id == action_id]


def events_for_effect(effect_key: str) -> list[EventView]:
    chained = [_event_view(e) for e in objects(Event).filter(effect_key=effect_key).order_by("id")]
    waiting = [r.pending for r in objects(EffectRecord).filter(pk=effect_key, pending__isnull=False) if effect_ok(r)]
    return chained + _waiting_views(waiting)


def receipts_for_effect(effect_key: str) -> list[ReceiptView]:
    return [_receipt_view(r) for r in objects(Receipt).filter(effect_key=effect_key).order_by("seq")]


#: Receipt columns that repeat a field of the hashed document (``agent`` is principal.agent,
#: ``ts`` is finished_at): lists, filters and the date hierarchy read them, so each is checked.
_RECEIPT_COLUMNS = (*INDEXED_COLUMNS, "ts")
_EVENT_FIELDS = ("id", "seq", "prev_hash", "hash", "ts", "type", "action_id", "effect_key", "approval_id")


def _time_column(connection: Any) -> str:
    """The ts column as read for verification: on SQLite its text (a row altered into an impossible
    time must be a named break, not a crash in the driver's converter)."""
    return dialect(connection).VERIFY_TIME


def _read_time(value: Any, connection: Any) -> dt.datetime | None:
    try:
        return as_datetime(value, connection)
    except (TypeError, ValueError):
        return None


def _chain_facts(events: list[StoredEvent]) -> tuple[dict[str, int], set[str], dict[str, list[str]]]:
    """What the event chain says happened, by effect key and approval: the highest attempt reserved,
    the keys committed (which stay committed for ever), and each approval's answers and use."""
    reserved: dict[str, int] = {}
    committed: set[str] = set()
    answered: dict[str, list[str]] = {}
    for event in events:
        if event.approval_id and event.type in _APPROVAL_EVENTS:
            answered.setdefault(event.approval_id, []).append(event.type)
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
                     "APPROVAL_DENIED": {"denied"}, "APPROVAL_RETURNED": {"granted", "expired"}}
_APPROVAL_EVENTS = ("APPROVAL_GRANTED", "APPROVAL_DENIED", "APPROVAL_CONSUMED", "APPROVAL_RETURNED")


def _approval_told(told: list[str]) -> tuple[set[str], int]:
    """What an approval's events imply (a use given back as often as it was made implies the give-back,
    not the use), and how many times it was given back."""
    used, returned = told.count("APPROVAL_CONSUMED"), told.count("APPROVAL_RETURNED")
    kinds = set(told) - {"APPROVAL_CONSUMED", "APPROVAL_RETURNED"}
    if used > returned:
        kinds.add("APPROVAL_CONSUMED")
    elif returned:
        kinds.add("APPROVAL_RETURNED")
    return kinds, returned


def _approval_breaks(row: Approval, answered: dict[str, list[str]]) -> list[ChainBreak]:
    """What is wrong with one approval row: its signature, or a status the event chain contradicts."""
    if not approval_ok(row):
        return [ChainBreak(
            "signature_invalid", None, f"approval {row.approval_id} ({row.status}, approver "
            f"{row.approver or '-'}) does not carry ctrlrun's signature: it was written or changed "
            f"outside ctrlrun, and will not be used", kind="approval", subject=row.approval_id)]
    kinds, returned = _approval_told(answered.get(row.approval_id, []))
    stale = [kind for kind in sorted(kinds) if str(row.status) not in _APPROVAL_IMPLIES[kind]]
    if row.returned != returned:
        stale.append(f"{returned} give-back(s) (APPROVAL_RETURNED) where the row counts {row.returned}")
    return [ChainBreak(
        "rewound", None, f"approval {row.approval_id} says {row.status}, but the event chain "
        f"records {kind}: the row and the chain disagree (an older row was put back, or the event "
        f"was forged)", kind="approval", subject=row.approval_id) for kind in stale]


def _effect_breaks(record: EffectRecord, reserved: dict[str, int], committed: set[str]) -> list[ChainBreak]:
    """What is wrong with one effect record: its signature, or an attempt or state the chain contradicts."""
    if not effect_ok(record):
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


# --------------------------------------------------------------------------- recorded checks
#
# Each verification is recorded (``ChainCheck``, append-only and signed), so the console can show
# the last result without re-hashing anything, and an incremental check can start where the last
# intact one stopped.

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
    started = time.monotonic()
    return lambda text: progress(f"{text} ({time.monotonic() - started:.1f} s)")




def _check_view(row: ChainCheck) -> ChainCheckView:
    return ChainCheckView(
        id=row.id, checked_at=row.checked_at, mode=row.mode, from_receipt_seq=row.from_receipt_seq,
        receipt_seq=row.receipt_seq, receipt_hash=row.receipt_hash, from_event_seq=row.from_event_seq,
        event_seq=row.event_seq, event_hash=row.event_hash, ok=bool(row.ok), breaks=row.breaks,
        receipts_checked=row.receipts_checked, events_checked=row.events_checked,
        signatures_checked=row.signatures_checked, summary=row.summary, duration_seconds=row.duration_seconds,
        ran_by=row.ran_by, signature_ok=check_ok(row))


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
        nonce=new_id("chk_"), checked_at=started, mode=ChainCheck.INCREMENTAL if report.mode == "incremental" else ChainCheck.FULL,
        from_receipt_seq=report.from_seq, receipt_seq=report.head_seq, receipt_hash=report.head_hash,
        from_event_seq=report.from_event_seq, event_seq=report.event_head_seq, event_hash=report.event_head_hash,
        ok=report.ok, breaks=len(report.breaks), receipts_checked=report.chained + report.unchained,
        events_checked=report.events_chained + report.events_unchained,
        signatures_checked=report.signatures_checked or 0, summary=_summary(report),
        duration_seconds=round(float(duration), 6), ran_by=ran_by[:200])
    row.mac = signing.sign(CHECK_DOMAIN, check_document(row))
    with write_phase(clock=False):
        row.save(using=alias(), force_insert=True)
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
    with reading():
        row = objects(ChainCheck).order_by("-id").first()
        return _check_view(row) if row else None


def _read_head() -> tuple[Any, ...]:
    """The chain head as (seq, hash, event seq, event hash, mac, key id); the genesis when there is none."""
    row = objects(ChainHead).filter(pk=1).values_list(*HEAD_FIELDS).first()
    return tuple(row) if row is not None else (0, GENESIS_HASH, 0, GENESIS_HASH, None, None)


def head_position() -> tuple[int, int]:
    """(receipt seq, event seq) of the chain head: how much evidence there is, in one indexed read."""
    with reading():
        row = objects(ChainHead).filter(pk=1).values_list("seq", "event_seq").first()
        return (row[0], row[1]) if row else (0, 0)


def receipts_after(after: int, upto: int | None = None) -> list[StoredReceipt]:
    """Chained receipts with ``after < seq`` (``<= upto``), in seq order, at most ``_BATCH``."""
    return _stored_receipts_where('"seq" > %s' + (' AND "seq" <= %s' if upto is not None else ""),
                                  [after] + ([upto] if upto is not None else []), order=True)


def _stored_receipts_where(condition: str, params: list[Any], *, order: bool = False) -> list[StoredReceipt]:
    connection = connections[alias()]
    columns = ",".join(f'"{c}"' for c in _RECEIPT_COLUMNS[:-1])
    sql = (f'SELECT "receipt_id","seq","prev_hash","hash","document",{columns},{_time_column(connection)} '
           f'FROM "ctrlrun_receipt" WHERE {condition}')
    if order:
        sql += f' ORDER BY "seq" LIMIT {_BATCH}'
    with statements() as cursor:
        rows = cursor.execute(sql, params).fetchall()
    out = []
    for receipt_id, seq, prev, digest, document, *values in rows:
        moment = _read_time(values[-1], connection)
        values[-1] = evidence_time(moment) if moment is not None else values[-1]
        out.append(StoredReceipt(receipt_id, seq, prev, digest, document, tuple(zip(_RECEIPT_COLUMNS, values))))
    return out


def _stored_events_where(condition: str, params: list[Any], *, order: bool = False) -> list[StoredEvent]:
    connection = connections[alias()]
    fields = ",".join(_time_column(connection) if f == "ts" else f'"{f}"' for f in _EVENT_FIELDS)
    sql = f'SELECT {fields},"data" FROM "ctrlrun_event" WHERE {condition}'
    if order:
        sql += f' ORDER BY "seq", "id" LIMIT {_BATCH}'
    with statements() as cursor:
        rows = cursor.execute(sql, params).fetchall()
    return [StoredEvent(id_, seq, prev, digest, _read_time(ts, connection), type_, action_id, key, approval_id,
                        data) for id_, seq, prev, digest, ts, type_, action_id, key, approval_id, data in rows]


def _events_after(after: int, upto: int | None = None) -> list[StoredEvent]:
    return _stored_events_where('"seq" > %s' + (' AND "seq" <= %s' if upto is not None else ""),
                                [after] + ([upto] if upto is not None else []), order=True)


def _anchor_breaks(kind: str, table: str, seq: int, hash_: str, check: ChainCheck, pruned: int = 0) -> list[ChainBreak]:
    """Whether the position an incremental check starts from is still as the last intact check left it:
    the row at that seq still holds the hash it had, and exactly ``seq`` chained rows lie at or before it
    (nothing removed there, nothing added)."""
    if seq == 0:
        return []
    noun = "receipt" if kind == "receipt" else "event"
    when = f"check {check.id} of {evidence_time(check.checked_at)}"
    with statements() as cursor:
        found = cursor.execute(f'SELECT "hash" FROM "{table}" WHERE "seq" = %s', [seq]).fetchall()
        count = cursor.execute(f'SELECT COUNT(*) FROM "{table}" WHERE "seq" <= %s', [seq]).fetchone()[0]
    out = []
    if [h for (h,) in found] != [hash_]:
        out.append(ChainBreak(
            "missing" if not found else "content_altered", seq,
            f"the {noun} at seq {seq}, where the last intact {when} stopped, "
            + ("is gone" if not found else f"no longer holds the hash {hash_} it had")
            + ": evidence already verified was changed; run a full check", kind=kind))
    if count != seq - pruned:  # (a prune's checkpoint at seq ``pruned``: the rows at or below it are gone)
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
            f'\'APPROVAL_DENIED\', \'APPROVAL_CONSUMED\', \'APPROVAL_RETURNED\') AND "seq" <= %s', [*batch, event_seq])
    return _chain_facts(events)


def _last_intact_check() -> ChainCheck | None:
    return objects(ChainCheck).filter(ok=True).order_by("-id").first()


def verify(progress: Any = None) -> ChainReport:
    """Re-hash every receipt and event, walk both chains (§9.4) from the genesis, check every signature,
    and check that each signed row agrees with what the event chain says happened to it, without
    stopping writers.

    Evidence and the head move in one transaction, so after walking the rows and then reading the
    head, every row up to the head is committed: any the walk missed (written meanwhile) is read
    then. A row beyond the head can then only be one written around ctrlrun. A signed row put back
    from an earlier moment (a committed key's record rewound to failed, a consumed approval back to
    granted) carries a genuine signature: the chain is what shows it is out of date.

    ``progress(text)``, if given, hears about long work (every ``PROGRESS_EVERY`` rows re-hashed).
    """
    return _verify(incremental=False, progress=progress)


def verify_incremental(progress: Any = None) -> ChainReport:
    """Check what was added since the last intact recorded check, starting from its position.

    Walks the receipts with seq past that check's (from its hash) and the events likewise, in
    batches; checks that the row at that position still holds its hash and that nothing was removed
    or added at or before it; reads the rows with no seq; checks the head's signature; and checks
    the signed rows that moved since that check (by their stored times, less a margin) or that a new
    event names, each against its whole story in the event chain. With no intact check recorded, it
    walks everything from the genesis, as :func:`verify` does.

    Not covered (a full check covers it): a row at or before the checked position changed in place
    with the same count and the anchor row untouched (its content, or its hash rewritten); a signed
    row changed around ctrlrun that keeps its stored time and that no new event names (such a row is
    still refused where it is used: its signature, or the event chain, does not agree).
    """
    return _verify(incremental=True, progress=progress)


def _starting_point() -> tuple[ChainCheck | None, list[ChainBreak]]:
    """Where an incremental check starts (the last intact recorded check, if it is genuine), and the
    breaks recorded checks carry: a forged base, a break found since and not yet cleared."""
    base = _last_intact_check()
    breaks: list[ChainBreak] = []
    if base is not None and not check_ok(base):
        breaks.append(ChainBreak(
            "signature_invalid", None, f"chain check {base.id} (intact, up to receipt {base.receipt_seq}) does "
            f"not carry ctrlrun's signature: it was written outside ctrlrun, so this check starts from the "
            f"genesis", kind="check", subject=str(base.id)))
        base = None
    # A break a check found stays until a full check comes back intact: an incremental check starts
    # from the last intact one and never re-reads what a later check found broken.
    found_broken = objects(ChainCheck).filter(ok=False)
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
    return base, breaks


def _checkpoint() -> tuple[Any, list[ChainBreak]]:
    """The prune checkpoint the receipt chain starts from (None: never pruned), and a break if it is not
    ctrlrun's."""
    from .retention import checkpoint_ok, latest_checkpoint

    found = latest_checkpoint()
    if found is None or checkpoint_ok(found):
        return found, []
    return found, [ChainBreak("signature_invalid", found.seq, f"the prune checkpoint at seq {found.seq} does not "
                              "carry ctrlrun's signature: it was written outside ctrlrun", kind="checkpoint",
                              subject=str(found.id))]


def _pruned_meanwhile(walk: ReceiptWalk, row: StoredReceipt) -> None:
    """A gap in the walk that a prune made while this check ran is no break: a batch of the prune
    ended exactly before ``row`` (a genuine checkpoint at ``row.seq - 1``), so the walk goes on from it."""
    from ..models import PruneCheckpoint
    from .retention import checkpoint_ok

    if row.seq is None or row.seq <= walk.expected_seq:
        return
    found = objects(PruneCheckpoint).filter(seq=row.seq - 1).first()
    if found is not None and checkpoint_ok(found):
        walk.expected_seq, walk.previous_hash = found.seq + 1, found.hash


def _verify(*, incremental: bool, progress: Any) -> ChainReport:
    """The one walk behind :func:`verify` (from the genesis, everything) and :func:`verify_incremental`
    (from the last intact recorded check, what was added or moved since)."""
    say = _progress_reporter(progress)
    with reading():
        report = ChainReport(mode="incremental" if incremental else "full")
        base, breaks = _starting_point() if incremental else (None, [])
        r_from, r_hash, e_from, e_hash = ((base.receipt_seq, base.receipt_hash, base.event_seq, base.event_hash)
                                          if base is not None else (0, GENESIS_HASH, 0, GENESIS_HASH))
        report.from_seq, report.from_event_seq = r_from, e_from
        report.from_check = base.id if base is not None else None
        start_id = None
        checkpoint, checkpoint_breaks = _checkpoint()
        breaks += checkpoint_breaks
        if checkpoint is not None and checkpoint.seq >= r_from:
            # Pruned (docs/retention.md): the receipt chain starts at the signed checkpoint.
            r_from, r_hash = checkpoint.seq, checkpoint.hash
            report.from_seq = r_from
        elif base is not None:
            breaks += _anchor_breaks("receipt", "ctrlrun_receipt", r_from, r_hash, base,
                                     checkpoint.seq if checkpoint is not None else 0)
        if base is not None:
            breaks += _anchor_breaks("event", "ctrlrun_event", e_from, e_hash, base)
            with statements() as cursor:
                found = cursor.execute('SELECT MAX("id") FROM "ctrlrun_event" WHERE "seq" = %s', [e_from]).fetchone()
            start_id = found[0] if found else None
        receipt_total = event_total = 0
        if say and not incremental:
            receipt_total, event_total = objects(Receipt).count(), objects(Event).count()
            say(f"read {receipt_total:,} receipts and {event_total:,} events")

        def told(done: int, total: int, noun: str) -> None:
            if say and done % PROGRESS_EVERY == 0:
                say(f"{done:,} {noun} re-hashed" if incremental else f"{done:,} of {total:,} {noun} re-hashed")

        receipts = ReceiptWalk(report, r_from, r_hash)
        for row in _stored_receipts_where('"seq" IS NULL', []):
            receipts.unchained(row)
        events = EventWalk(report, e_from, e_hash, start_id)
        for row in _stored_events_where('"seq" IS NULL', []):
            events.unchained(row)
        named_keys: set[str] = set()
        named_approvals: set[str] = set()
        delegation_rows: list[StoredEvent] = []

        def walk_receipts(batch: list[StoredReceipt]) -> None:
            for row in batch:
                if row.seq != receipts.expected_seq:
                    _pruned_meanwhile(receipts, row)  # a prune ran during this check: go on from its checkpoint
                receipts.add(row)
                told(report.chained, receipt_total, "receipts")

        def walk_events(batch: list[StoredEvent]) -> None:
            for row in batch:
                events.add(row)
                told(report.events_chained, event_total, "events")
                if row.effect_key:
                    named_keys.add(row.effect_key)
                if row.approval_id:
                    named_approvals.add(row.approval_id)
                if row.type in ("DELEGATION_CREATED", "DELEGATION_REVOKED"):
                    delegation_rows.append(row)

        seen = _walk_batches(receipts_after, r_from, None, walk_receipts)
        event_seen = _walk_batches(_events_after, e_from, None, walk_events)
        seq, hash_, event_seq, event_hash_, mac, key_id = _read_head()
        # Written while the walk ran: every row up to the head is committed now.
        _walk_batches(receipts_after, seen, seq, walk_receipts)
        _walk_batches(_events_after, event_seen, event_seq, walk_events)
        report.head_seq, report.head_hash = seq, hash_
        report.event_head_seq, report.event_head_hash = event_seq, event_hash_
        if base is not None and (seq < r_from or event_seq < e_from):
            breaks.append(ChainBreak(
                "head_mismatch", seq, f"the chain head (receipt seq {seq}, event seq {event_seq}) is behind the "
                f"position the last intact check {base.id} verified (receipt seq {r_from}, event seq {e_from}): "
                f"the head was set back", kind="head"))
        receipts.finish(seq, hash_)
        events.finish(event_seq, event_hash_)
        # The receipt chain's breaks, then the event chain's (the walks interleave their rows).
        report.breaks.sort(key=lambda b: b.kind != "receipt")
        problem = head_problem(seq, hash_, event_seq, event_hash_, mac, key_id)
        if problem is not None:
            report.breaks.append(ChainBreak("signature_invalid", seq, problem, kind="head"))

        since = base.checked_at - _SINCE_MARGIN if base is not None else None
        approvals: dict[str, Approval] = {}
        query = objects(Approval)
        if since is not None:
            query = query.filter(Q(created_at__gte=since) | Q(answered_at__gte=since) | Q(consumed_at__gte=since))
        approvals.update((row.approval_id, row) for row in query.iterator())
        for batch in _in_batches(sorted(named_approvals - set(approvals))):
            approvals.update((row.approval_id, row) for row in objects(Approval).filter(pk__in=list(batch)))
        records: dict[str, EffectRecord] = {}
        query = objects(EffectRecord)
        if since is not None:
            query = query.filter(updated_at__gte=since)
        records.update((row.effect_key, row) for row in query.iterator())
        for batch in _in_batches(sorted(named_keys - set(records))):
            records.update((row.effect_key, row) for row in objects(EffectRecord).filter(pk__in=list(batch)))
        reserved, committed, answered = _facts_for(sorted(records), sorted(approvals), event_seq)
        for approval_id in sorted(approvals, key=lambda a: (approvals[a].created_at, a)):
            report.breaks += _approval_breaks(approvals[approval_id], answered)
        for key in sorted(records):
            report.breaks += _effect_breaks(records[key], reserved, committed)
        beside, checked = row_breaks(since, delegation_events(delegation_rows), event_seq)
        named = {(b.name, b.kind, b.subject) for b in breaks}
        report.breaks += [b for b in beside if (b.name, b.kind, b.subject) not in named]
        report.signatures_checked = 1 + len(approvals) + len(records) + checked
        report.breaks[:0] = breaks
    return report


def _walk_batches(read: Any, after: int, upto: int | None, walk: Callable[[list[Any]], None]) -> int:
    """Feed ``walk`` the rows with ``after < seq`` (``<= upto``) in seq order, a batch at a time (keyset:
    each batch starts after the last seq seen, so a long chain is never held in memory at once);
    returns the last seq walked."""
    while upto is None or upto > after:
        batch = read(after, upto)
        if not batch:
            break
        walk(batch)
        after = batch[-1].seq
        if len(batch) < _BATCH:
            break
    return after


def overview() -> Overview:
    with reading():
        cutoff = read_clock()
        # Each waiting request's signature is checked (an HMAC each: few are ever waiting at once).
        waiting = [approval_ok(row) for row in objects(Approval).filter(
            status=ApprovalStatus.PENDING, expires_at__gt=cutoff).iterator()]
        return Overview(
            pending_approvals=sum(waiting),
            tampered_approvals=len(waiting) - sum(waiting),
            ambiguous_effects=objects(EffectRecord).filter(state=S.AMBIGUOUS).count(),
            lapsed_leases=objects(EffectRecord).filter(state__in=HOLDING_STATES,
                                                       lease_expires_at__lte=cutoff).count(),
            # The head's position, not COUNT(*): one indexed read on any size of store (the two
            # differ only when rows were removed or added around ctrlrun, which a check names).
            receipts=objects(ChainHead).filter(pk=1).values_list("seq", flat=True).first() or 0,
        )


def head_hash() -> tuple[int, str]:
    """(receipt seq, receipt hash) of the chain head."""
    with reading():
        row = objects(ChainHead).filter(pk=1).values_list("seq", "hash").first()
        return (row[0], row[1]) if row else (0, GENESIS_HASH)
