"""The models take their choices from the pure layer's enums: nothing can be stored that the code
does not know, and nothing the code knows is missing from the database's choices."""
from __future__ import annotations

from ctrlrun.models import Approval, EffectRecord, Event, Receipt
from ctrlrun.states import ApprovalStatus, EffectState, EventType, Result


def choices(model, field: str) -> set[str]:
    return {value for value, _ in model._meta.get_field(field).choices}


def test_effect_states_match_the_enum():
    """Every stored effect state is an EffectState (NEW is never stored)."""
    assert choices(EffectRecord, "state") == {s.value for s in EffectState} - {"new"}


def test_event_types_match_the_enum():
    """Every event type the kernel can write is a choice of the event model."""
    assert choices(Event, "type") == {t.value for t in EventType}


def test_receipt_results_match_the_enum():
    """Every receipt result is a Result."""
    assert choices(Receipt, "result") == {r.value for r in Result}


def test_approval_statuses_match_the_enum():
    """Every approval status is an ApprovalStatus."""
    assert choices(Approval, "status") == {s.value for s in ApprovalStatus}
