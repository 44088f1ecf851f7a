"""Paused runs of agent frameworks (``ctrlrun.resumption``): stored, found once answered, claimed once.

Mutable application data beside the approvals, not evidence: nothing is sealed here. What a resume
is made of (the request it waits on, the framework, its state, the resumer) is signed when the run
is stored (``signatures.paused_mac``; the request id is unique, so a copy of a row keeps no
signature of its own), and a run whose signature fails is never resumed (``resumption`` skips it;
``receipts --verify-chain`` names it). The claim bookkeeping (status, who, when) is not signed: a
forged status can only resume a run again, whose tool call still needs ctrlrun's grant for its
exact action hash. The one rule the bookkeeping keeps is that a run is claimed by one process only:
``claim_paused_run`` is a conditional UPDATE (``status = 'pending'``), and only the process whose
UPDATE changed the row runs the resumer.
"""
from __future__ import annotations

import datetime as dt

from django.db import IntegrityError
from django.db.models import Q

from ..errors import InvalidArgument
from ..models import Approval, PausedRun
from ..states import ApprovalStatus
from ..times import when_text
from ..values import PausedRunView
from .base import objects, read_clock, reading, write_phase
from .signatures import paused_mac, paused_ok

_FIELDS = [f for f in PausedRunView.__dataclass_fields__ if f != "signature_ok"]
#: An approval in one of these has been answered (or has run out): its paused run may be resumed.
ANSWERED = (ApprovalStatus.GRANTED.value, ApprovalStatus.DENIED.value, ApprovalStatus.EXPIRED.value,
            ApprovalStatus.CONSUMED.value)


def _view(row: PausedRun) -> PausedRunView:
    return PausedRunView(**{f: getattr(row, f) for f in _FIELDS}, signature_ok=paused_ok(row))


def save_paused_run(approval_id: str, framework: str, state: str, resume_with: str) -> PausedRunView:
    """Store a run paused on ``approval_id``: one per request, never replaced."""
    try:
        with write_phase() as when:
            if not objects(Approval).filter(pk=approval_id).exists():
                raise InvalidArgument(f"no approval request {approval_id!r}: a paused run is stored beside the "
                                      "ctrlrun request it waits on (the adapter's request id, apr_...)")
            existing = objects(PausedRun).filter(approval_id=approval_id).first()
            if existing is not None:
                raise InvalidArgument(f"a paused run is already stored for {approval_id} (paused run {existing.id}, "
                                      f"{existing.status}); it is never replaced")
            row = PausedRun(approval_id=approval_id, framework=framework, state=state, resume_with=resume_with,
                            created_at=when)
            row.mac = paused_mac(row)
            row.save(using=objects(PausedRun).db, force_insert=True)
    except IntegrityError:  # pragma: no cover - a concurrent pause of the same request, after our check
        raise InvalidArgument(f"a paused run is already stored for {approval_id}; it is never replaced") from None
    return _view(row)


def get_paused_run(paused_id: int) -> PausedRunView | None:
    with reading():
        row = objects(PausedRun).filter(pk=paused_id).first()
        return _view(row) if row else None


def paused_run_for(approval_id: str) -> PausedRunView | None:
    with reading():
        row = objects(PausedRun).filter(approval_id=approval_id).first()
        return _view(row) if row else None


def list_paused_runs(status: str | None = None) -> list[PausedRunView]:
    with reading():
        query = objects(PausedRun).all()
        if status:
            query = query.filter(status=status)
        return [_view(row) for row in query.order_by("created_at", "id")]


def ready_paused_runs(limit: int | None = None) -> list[PausedRunView]:
    """Pending paused runs whose request was answered or ran out (by the store's clock), oldest first."""
    with reading():
        now = read_clock()
        answered = objects(Approval).filter(Q(status__in=ANSWERED) | Q(expires_at__lte=now)).values("approval_id")
        query = objects(PausedRun).filter(status=PausedRun.PENDING, approval_id__in=answered)
        query = query.order_by("created_at", "id")
        return [_view(row) for row in (query[:limit] if limit else query)]


def claim_paused_run(paused_id: int, answer: str, by: str) -> dt.datetime | None:
    """Take a pending paused run for resuming: the claim's time (truthy) only for the one process
    whose UPDATE moved it, else None. ``by`` and that time name the claim (``finish_paused_run``)."""
    with write_phase() as when:
        moved = objects(PausedRun).filter(pk=paused_id, status=PausedRun.PENDING).update(
            status=PausedRun.RESUMING, answer=answer, claimed_by=by[:200], claimed_at=when)
    return when if moved == 1 else None


def finish_paused_run(paused_id: int, *, error: str | None = None,
                      claim: tuple[str, dt.datetime] | None = None) -> PausedRunView | None:
    """A claimed run's resumer came back: resumed, or failed with ``error``.

    With ``claim`` (``(by, claimed_at)``), only while the run is still under that claim: a resumer
    whose claim a person released (and another process took since) never finishes the other's."""
    with write_phase() as when:
        query = objects(PausedRun).filter(pk=paused_id, status=PausedRun.RESUMING)
        if claim is not None:
            query = query.filter(claimed_by=claim[0][:200], claimed_at=claim[1])
        query.update(status=PausedRun.FAILED if error is not None else PausedRun.RESUMED, resumed_at=when, error=error)
    return get_paused_run(paused_id)


def _seconds(delta: dt.timedelta) -> str:
    seconds = delta.total_seconds()
    return f"{seconds:g} seconds" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def release_paused_run(approval_id: str, *, by: str, reason: str | None, older_than: dt.timedelta) -> PausedRunView:
    """Move a run stuck in ``resuming`` back to ``pending``, for a person who judged its process dead.

    Only a claim made more than ``older_than`` ago (by the store's clock) is released, and only
    the very claim that was read (one conditional UPDATE on the claim's process and time): a
    claim made meanwhile by another process is never released in its place. Who released it,
    when, why and which claim are recorded on the row. Anything else is ``InvalidArgument``."""
    with write_phase() as now:
        row = objects(PausedRun).filter(approval_id=approval_id).first()
        if row is None:
            raise InvalidArgument(f"no paused run waits on request {approval_id!r}")
        if row.status != PausedRun.RESUMING:
            raise InvalidArgument(f"the run paused on {approval_id} is {row.status}, not resuming: only a run "
                                  "claimed by a process that never finished it can be released")
        claimed_at = row.claimed_at
        age = now - claimed_at if claimed_at is not None else None
        if age is not None and age <= older_than:
            raise InvalidArgument(
                f"the run paused on {approval_id} was claimed by {row.claimed_by} at {when_text(claimed_at)}, "
                f"{_seconds(max(age, dt.timedelta(0)))} ago: a claim is released only once it is older than "
                f"{_seconds(older_than)} (CTRLRUN_RESUME_RELEASE_AFTER_SECONDS); its process may still be running")
        claim = f"{row.claimed_by or '?'} at {when_text(claimed_at)}"[:300]
        moved = objects(PausedRun).filter(pk=row.pk, status=PausedRun.RESUMING, claimed_by=row.claimed_by,
                                          claimed_at=claimed_at).update(
            status=PausedRun.PENDING, released_by=by[:200], released_at=now, release_reason=reason,
            released_claim=claim)
        if moved != 1:  # pragma: no cover - the row moved between our read and our update
            raise InvalidArgument(f"the run paused on {approval_id} changed while it was being released; look again")
    return get_paused_run(row.pk)  # type: ignore[return-value]
