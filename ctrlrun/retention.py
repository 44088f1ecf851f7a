"""``prune`` (§F2): delete a prefix of the receipt chain, leaving a signed checkpoint it verifies from.

The refusals come first, before anything is written: the checkpoint would not move forward, the head
would go, a live hold overlaps (its reason named), the receipt at ``--through`` is younger than
``--older-than``, or the range to delete does not verify (a prune never launders a break away). Then
the checkpoint is anchored (if a provider is given), and the batches run (``store.retention``), each
its own transaction; a hold placed meanwhile stops the prune short of it. ``RETENTION_APPLIED`` is
recorded at the end.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Callable
from typing import Any

from .canonical import GENESIS_HASH, evidence_time
from .errors import InvalidArgument
from .store import retention as kept
from .store.base import now
from .store.evidence import head_position

BATCH = 10_000
_DURATION = re.compile(r"^(\d+)([dhms])$")


def parse_duration(text: str) -> dt.timedelta:
    """``90d``, ``12h``, ``30m``, ``45s`` (no weeks)."""
    found = _DURATION.match(text or "")
    if not found:
        raise InvalidArgument(f"--older-than takes <n>d, <n>h, <n>m or <n>s (e.g. 90d), not {text!r}")
    unit = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}[found.group(2)]
    return dt.timedelta(**{unit: int(found.group(1))})


@dataclasses.dataclass
class PruneResult:
    through: int
    receipts_deleted: int = 0
    ledger_rows_deleted: int = 0
    checkpoint: dict[str, Any] | None = None
    anchored: bool = False
    dry_run: bool = False
    stopped_by: str | None = None  # a hold placed while the prune ran

    def as_dict(self) -> dict[str, Any]:
        return {"through": self.through, "receipts_deleted": self.receipts_deleted,
                "ledger_rows_deleted": self.ledger_rows_deleted, "checkpoint": self.checkpoint,
                "anchored": self.anchored, "dry_run": self.dry_run, "stopped_by": self.stopped_by}


def plan(through: int, older_than: dt.timedelta) -> tuple[int, str, tuple]:
    """Check every refusal; (start seq, start hash, the receipt at ``through``)."""
    current = kept.latest_checkpoint()
    start, start_hash = (current.seq, current.hash) if current else (0, GENESIS_HASH)
    if through <= start:
        raise InvalidArgument(f"the checkpoint is at seq {start}: a prune --through {through} would move it "
                              f"backwards or leave it where it is")
    head, _ = head_position()
    if through >= head:
        raise InvalidArgument(f"--through {through} would take the head (seq {head}): at least one chained "
                              f"receipt must remain; prune through {head - 1} at most")
    hold = kept.blocking_hold(through)
    if hold is not None:
        raise InvalidArgument(f"seqs {start + 1}..{through} overlap the live hold '{hold.hold_id}' "
                              f"({hold.from_seq}..{hold.to_seq or 'end'}): {hold.reason}")
    found = kept.receipt_at(through)
    if found is None or found[0] <= start:
        raise InvalidArgument(f"there is no chained receipt between seq {start + 1} and {through}")
    cutoff = now() - older_than
    if found[3] > cutoff:
        raise InvalidArgument(f"receipt seq {found[0]} was written at {evidence_time(found[3])}, inside "
                              f"--older-than (after {evidence_time(cutoff)}): pick an older --through")
    return start, start_hash, found


def prune(*, through: int, older_than: dt.timedelta, by: str, reason: str, anchor: Any = None,
          dry_run: bool = False, progress: Callable[[str], None] | None = None, batch: int = BATCH) -> PruneResult:
    if not by or not reason:
        raise InvalidArgument("a prune needs --by WHO and --reason TEXT")
    start, start_hash, found = plan(through, older_than)
    through = found[0]
    for report in kept.walk_range(start, start_hash, through):
        if not report.ok:
            first = report.breaks[0]
            raise InvalidArgument(f"the receipts to prune do not verify ({first.name} at seq {first.seq}: "
                                  f"{first.detail}); a prune never removes a break: restore, or check the store")
    result = PruneResult(through=through, dry_run=dry_run)
    if dry_run:
        result.receipts_deleted = through - start
        result.checkpoint = {"seq": through, "hash": found[1], "schema": found[2], "at": None}
        return result
    if anchor is not None:
        from .anchor import make_anchor

        make_anchor(anchor, seq=through, hash_=found[1], kind="checkpoint")
        result.anchored = True
    tokens = kept.lock_tokens(-(-(through - start) // batch) + 1)
    position = start
    for token in tokens:
        if position >= through:
            break
        done = kept.prune_batch(position, through, batch, token, by, reason)
        if done.end == 0:
            if done.held is not None:
                result.stopped_by = f"{done.held.hold_id} ({done.held.reason})"
            break
        position = done.end
        result.receipts_deleted += done.deleted
        if progress:
            progress(f"pruned through seq {position:,} ({result.receipts_deleted:,} receipts deleted)")
        if done.held is not None and position < through:
            result.stopped_by = f"{done.held.hold_id} ({done.held.reason})"
            break
    last = kept.latest_checkpoint()
    if last is not None and last.seq > start:
        result.checkpoint = {"seq": last.seq, "hash": last.hash, "schema": last.schema, "at": evidence_time(last.at)}
        result.through = last.seq
        kept.record_applied({"through": last.seq, "older_than": str(older_than), "reason": reason, "by": by,
                             "receipts_deleted": result.receipts_deleted, "checkpoint_hash": last.hash,
                             "anchored": result.anchored, "stopped_by": result.stopped_by})
    return result


def oldest_through(older_than: dt.timedelta) -> int | None:
    """For ``--loop``: the highest seq below the head older than ``older_than`` (and below every live
    hold), past the checkpoint; None when there is nothing to prune."""
    head, _ = head_position()
    current = kept.latest_checkpoint()
    start = current.seq if current else 0
    found = kept.receipt_before(now() - older_than, head - 1)
    if found is None or found <= start:
        return None
    hold = kept.blocking_hold(found)
    if hold is not None:
        found = hold.from_seq - 1
    return found if found > start else None
