"""The store writes an approval's status only through ``store.approvals._move_approval``, which refuses
a pair the approval table (``states.APPROVAL_TRANSITIONS``) lacks before anything is written."""
from __future__ import annotations

import pytest

from ctrlrun.errors import IllegalTransition
from ctrlrun.models import Approval
from ctrlrun.states import APPROVAL_TRANSITIONS, ApprovalStatus
from ctrlrun.store import approvals

NOT_EDGES = [(a, b) for a in ApprovalStatus for b in ApprovalStatus if (a, b) not in APPROVAL_TRANSITIONS]


@pytest.mark.parametrize(("source", "target"), NOT_EDGES, ids=[f"{a}->{b}" for a, b in NOT_EDGES])
def test_the_one_status_write_refuses_a_pair_not_in_the_table(source, target):
    row = Approval(approval_id="apr_" + "0" * 32, status=source)  # unsaved: a write would need the database
    with pytest.raises(IllegalTransition) as caught:
        approvals._move_approval(row, target, approver="bob")
    assert (caught.value.source, caught.value.target) == (source.value, target.value)
    assert "approval table has no such edge" in str(caught.value)
    assert row.status == source and row.approver is None
