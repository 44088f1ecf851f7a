"""Retention: the one transaction allowed to delete receipts, its checkpoints, and legal holds.

The guard (v12) lets a receipt be deleted only while the row of ``ctrlrun_retentionlock`` is open, at or
below a checkpoint, outside every live hold. Opening the lock takes the next preimage of a hash chain
whose seed is derived from ctrlrun's signing key (kept outside the database): the row holds
``H^r(seed)`` and ``r``; a prune writes ``H^(r-1)(seed)`` (the guard checks that its hash is the old
digest) and closes the row again before it commits, so no other transaction ever sees it open, and a
preimage once used is spent (the next opening needs the one before it). On PostgreSQL the
transaction-local ``ctrlrun.retention`` must also name it; on SQLite the hash the guard calls,
``ctrlrun_sha256``, exists only on the connection of this module's transaction.

Each batch is its own transaction: the lock row first (a hold being placed waits on it), the holds
read again, a checkpoint written, the receipts at or below it deleted, the lock closed.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

from django.db import connections

from .. import signing
from ..canonical import GENESIS_HASH, evidence_time
from ..errors import InvalidArgument
from ..models import Hold, PruneCheckpoint, Receipt
from ..receipts import ChainReport, ReceiptWalk
from ..lift import LIFT_DOMAIN, LOCK_TABLE, links, sha
from .base import alias, dialect, objects, reading, statements, write_phase

CHECKPOINT_DOMAIN, HOLD_DOMAIN = "ctrlrun.prune-checkpoint/v1", "ctrlrun.hold/v1"


# --------------------------------------------------------------------------- checkpoints and holds


def _checkpoint_fields(row: PruneCheckpoint) -> list[Any]:
    return [row.seq, row.hash, row.schema, evidence_time(row.at), row.by, row.reason]


def checkpoint_ok(row: PruneCheckpoint) -> bool:
    return signing.is_valid(CHECKPOINT_DOMAIN, _checkpoint_fields(row), row.mac)


def latest_checkpoint() -> PruneCheckpoint | None:
    """The checkpoint the receipt chain now starts from (the highest), or None (never pruned)."""
    with reading():
        return objects(PruneCheckpoint).order_by("-seq").first()


def _hold_fields(row: Hold) -> list[Any]:
    return [row.hold_id, row.from_seq, row.to_seq, row.reason, row.placed_by, evidence_time(row.placed_at),
            evidence_time(row.released_at) if row.released_at else None, row.released_by]


def hold_ok(row: Hold) -> bool:
    return signing.is_valid(HOLD_DOMAIN, _hold_fields(row), row.mac)


def hold_live(row: Hold) -> bool:
    """Live unless released *by ctrlrun*: a release written around it (its signature fails) still holds."""
    return row.released_at is None or not hold_ok(row)


def _take_lock(cursor: Any) -> tuple[str, int, bool, str]:
    row = cursor.execute(f'SELECT "digest", "remaining", "open", "key_id" FROM "{LOCK_TABLE}" WHERE "id" = 1'
                         f'{dialect().ROW_LOCK}', []).fetchone()
    if row is None:
        raise InvalidArgument("this store has no retention lock row: run 'manage.py migrate' as the tables' owner")
    return row[0], int(row[1]), bool(row[2]), row[3]


def place_hold(hold_id: str, from_seq: int, to_seq: int | None, reason: str, by: str) -> tuple[Hold, int]:
    """Place a hold; it waits for a prune batch in flight (the lock row). Returns it and the checkpoint
    seq it found (receipts at or below it were already pruned)."""
    if not hold_id or not reason or not by:
        raise InvalidArgument("a hold needs --id, --reason and --by")
    if from_seq < 1 or (to_seq is not None and to_seq < from_seq):
        raise InvalidArgument(f"a hold's range must start at 1 or later and end at or after its start "
                              f"(got {from_seq}..{to_seq}); omit --to-seq to hold to the end of the chain")
    with write_phase() as when:
        with statements() as cursor:
            _take_lock(cursor)
        if objects(Hold).filter(pk=hold_id).exists():
            raise InvalidArgument(f"there is already a hold '{hold_id}': choose another --id")
        row = Hold(hold_id=hold_id, from_seq=from_seq, to_seq=to_seq, reason=reason, placed_by=by, placed_at=when)
        row.mac = signing.sign(HOLD_DOMAIN, _hold_fields(row))
        row.save(using=alias(), force_insert=True)
        found = objects(PruneCheckpoint).order_by("-seq").values_list("seq", flat=True).first() or 0
    return row, found


def release_hold(hold_id: str, by: str) -> Hold:
    if not by:
        raise InvalidArgument("releasing a hold needs --by")
    with write_phase() as when:
        row = objects(Hold).filter(pk=hold_id, released_at__isnull=True).first()
        if row is None:
            raise InvalidArgument(f"no live hold '{hold_id}' (hold list shows them)")
        row.released_at, row.released_by = when, by
        row.mac = signing.sign(HOLD_DOMAIN, _hold_fields(row))
        row.save(using=alias(), update_fields=["released_at", "released_by", "mac"])
    return row


def list_holds() -> list[Hold]:
    with reading():
        return list(objects(Hold).order_by("placed_at", "hold_id"))


def blocking_hold(upto: int) -> Hold | None:
    """The live hold with the lowest start at or below ``upto`` (a prune through ``upto`` would touch it)."""
    with reading():
        found = [h for h in objects(Hold).filter(from_seq__lte=upto).order_by("from_seq") if hold_live(h)]
    return found[0] if found else None


# --------------------------------------------------------------------------- the prune's batches


@dataclasses.dataclass
class Batch:
    end: int  # the checkpoint seq this batch wrote (0: nothing deleted)
    deleted: int
    held: Hold | None  # a hold that cut it short


def receipt_at(seq: int) -> tuple[int, str, str, dt.datetime] | None:
    """(seq, hash, schema, ts) of the chained receipt with the highest seq at or below ``seq``."""
    with reading():
        row = (objects(Receipt).filter(seq__lte=seq, seq__isnull=False).order_by("-seq")
               .values_list("seq", "hash", "document", "ts").first())
    if row is None:
        return None
    try:
        schema = json.loads(row[2]).get("schema", "")
    except ValueError:
        schema = ""
    return row[0], row[1], schema, row[3]


def walk_range(after: int, after_hash: str, upto: int, batch: int = 2000) -> Iterator[ChainReport]:
    """Re-hash the receipts ``after < seq <= upto`` before they are deleted (a prune never launders a
    break away); yields a report per batch of rows read."""
    from .evidence import receipts_after

    report = ChainReport()
    walk = ReceiptWalk(report, after, after_hash)
    position = after
    while position < upto:
        rows = receipts_after(position, upto)
        if not rows:
            break
        for row in rows:
            walk.add(row)
        position = rows[-1].seq
        yield report
    walk.finish(upto, (receipt_at(upto) or (0, GENESIS_HASH))[1])
    yield report


def prune_batch(start: int, target: int, size: int, token: str, by: str, reason: str) -> Batch:
    """One transaction: open the lock with ``token`` (``H^(r-1)``), checkpoint at most ``size`` seqs past
    ``start`` (never past ``target``, never into a live hold), delete, close."""
    connection = connections[alias()]
    with write_phase() as when:
        with statements() as cursor:
            digest, remaining, _, _ = _take_lock(cursor)
            if sha(token) != digest:
                raise InvalidArgument("the retention lock has moved since this prune began (another prune ran): "
                                      "run it again")
            end = min(target, start + size)
            held = next((h for h in objects(Hold).filter(from_seq__lte=end).order_by("from_seq") if hold_live(h)),
                        None)
            if held is not None:
                end = min(end, held.from_seq - 1)
            found = receipt_at(end) if end > start else None
            if found is None or found[0] <= start:
                return Batch(0, 0, held)
            end, hash_, schema, _ = found
            with dialect().lock_hash(connection, sha):  # SQLite: the function the guard checks the lock with
                cursor.execute(f'UPDATE "{LOCK_TABLE}" SET "digest" = %s, "remaining" = %s, "open" = %s WHERE "id" = 1',
                               [token, remaining - 1, True])
            dialect().name_lift(cursor, token)
            row = PruneCheckpoint(seq=end, hash=hash_, schema=schema, at=when, by=by, reason=reason)
            row.mac = signing.sign(CHECKPOINT_DOMAIN, _checkpoint_fields(row))
            row.save(using=alias(), force_insert=True)
            deleted = cursor.execute('DELETE FROM "ctrlrun_receipt" WHERE "seq" > %s AND "seq" <= %s',
                                     [start, end]).rowcount
            cursor.execute(f'UPDATE "{LOCK_TABLE}" SET "open" = %s WHERE "id" = 1', [False])
            dialect().name_lift(cursor, "")
    return Batch(end, deleted, held)


def lock_tokens(count: int) -> list[str]:
    """The next ``count`` preimages of the lock's chain (fewer if the chain is nearly spent), in use order."""
    with reading(), statements() as cursor:
        digest, remaining, _, key_id = _take_lock(cursor)
    if key_id != signing.key_id() or links(remaining, remaining)[remaining] != digest:
        raise InvalidArgument(
            "the retention lock was not made with this signing key (the key changed, or the row was written "
            "around ctrlrun): a prune cannot lift the guard; the tables' owner re-seeds it (docs/retention.md)")
    stop = max(0, remaining - count)
    chain = links(max(stop, 1), remaining - 1) if remaining > 1 else {}
    if stop == 0:
        chain[0] = signing.sign(LIFT_DOMAIN, ["seed"])
    return [chain[k] for k in range(remaining - 1, stop - 1, -1)]


def receipt_before(cutoff: dt.datetime, upto: int) -> int | None:
    """The highest chained seq at or below ``upto`` written before ``cutoff``."""
    with reading():
        return (objects(Receipt).filter(seq__lte=upto, seq__isnull=False, ts__lt=cutoff).order_by("-seq")
                .values_list("seq", flat=True).first())


def receipt_hash_at(seq: int) -> str | None:
    with reading():
        return objects(Receipt).filter(seq=seq).values_list("hash", flat=True).first()


def record_applied(data: dict[str, Any]) -> None:
    """The ``RETENTION_APPLIED`` event: what a prune did, on the event chain."""
    from ..states import EventType
    from .chain import event_row, seal

    with write_phase() as when:
        seal([event_row(EventType.RETENTION_APPLIED, None, None, data, when)], [], when)
