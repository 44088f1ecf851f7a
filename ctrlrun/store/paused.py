"""Paused runs of agent frameworks (``ctrlrun.resumption``): stored, found once answered, claimed once.

Mutable application data beside the approvals, not evidence: nothing is sealed or signed here. The
one rule these rows keep is that a run is claimed by one process only: ``claim_paused_run`` is a
conditional UPDATE (``status = 'pending'``), and only the process whose UPDATE changed the row
runs the resumer.
"""
from __future__ import annotations

from django.db import IntegrityError
from django.db.models import Q

from ..errors import InvalidArgument
from ..models import Approval, PausedRun
from ..states import ApprovalStatus
from ..values import PausedRunView
from .base import _clock, _phase, _q, _reading

_FIELDS = list(PausedRunView.__dataclass_fields__)
#: An approval in one of these has been answered (or has run out): its paused run may be resumed.
ANSWERED = (ApprovalStatus.GRANTED.value, ApprovalStatus.DENIED.value, ApprovalStatus.EXPIRED.value,
            ApprovalStatus.CONSUMED.value)


def _view(row: PausedRun) -> PausedRunView:
    return PausedRunView(**{f: getattr(row, f) for f in _FIELDS})


def save_paused_run(approval_id: str, framework: str, state: str, resume_with: str) -> PausedRunView:
    """Store a run paused on ``approval_id``: one per request, never replaced."""
    try:
        with _phase() as when:
            if not _q(Approval).filter(pk=approval_id).exists():
                raise InvalidArgument(f"no approval request {approval_id!r}: a paused run is stored beside the "
                                      "ctrlrun request it waits on (the adapter's request id, apr_...)")
            existing = _q(PausedRun).filter(approval_id=approval_id).first()
            if existing is not None:
                raise InvalidArgument(f"a paused run is already stored for {approval_id} (paused run {existing.id}, "
                                      f"{existing.status}); it is never replaced")
            row = PausedRun(approval_id=approval_id, framework=framework, state=state, resume_with=resume_with,
                            created_at=when)
            row.save(using=_q(PausedRun).db, force_insert=True)
    except IntegrityError:  # pragma: no cover - a concurrent pause of the same request, after our check
        raise InvalidArgument(f"a paused run is already stored for {approval_id}; it is never replaced") from None
    return _view(row)


def get_paused_run(paused_id: int) -> PausedRunView | None:
    with _reading():
        row = _q(PausedRun).filter(pk=paused_id).first()
        return _view(row) if row else None


def paused_run_for(approval_id: str) -> PausedRunView | None:
    with _reading():
        row = _q(PausedRun).filter(approval_id=approval_id).first()
        return _view(row) if row else None


def list_paused_runs(status: str | None = None) -> list[PausedRunView]:
    with _reading():
        query = _q(PausedRun).all()
        if status:
            query = query.filter(status=status)
        return [_view(row) for row in query.order_by("created_at", "id")]


def ready_paused_runs(limit: int | None = None) -> list[PausedRunView]:
    """Pending paused runs whose request was answered or ran out (by the store's clock), oldest first."""
    with _reading():
        now = _clock()
        answered = _q(Approval).filter(Q(status__in=ANSWERED) | Q(expires_at__lte=now)).values("approval_id")
        query = _q(PausedRun).filter(status=PausedRun.PENDING, approval_id__in=answered).order_by("created_at", "id")
        return [_view(row) for row in (query[:limit] if limit else query)]


def claim_paused_run(paused_id: int, answer: str, by: str) -> bool:
    """Take a pending paused run for resuming; True only for the one process whose UPDATE moved it."""
    with _phase() as when:
        moved = _q(PausedRun).filter(pk=paused_id, status=PausedRun.PENDING).update(
            status=PausedRun.RESUMING, answer=answer, claimed_by=by[:200], claimed_at=when)
    return moved == 1


def finish_paused_run(paused_id: int, *, error: str | None = None) -> PausedRunView | None:
    """A claimed run's resumer came back: resumed, or failed with ``error``."""
    with _phase() as when:
        _q(PausedRun).filter(pk=paused_id, status=PausedRun.RESUMING).update(
            status=PausedRun.FAILED if error is not None else PausedRun.RESUMED, resumed_at=when, error=error)
    return get_paused_run(paused_id)
