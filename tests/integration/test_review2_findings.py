"""Review findings (review2): each test fails on main as merged."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.identity import StaticIdentityProvider
from ctrlrun.models import Approval
from tests.integration.test_policy_change import GOVERNED, WIDER

pytestmark = pytest.mark.usefixtures("store_db")


def test_a_policy_proposal_keeps_its_proposer_under_an_identity_provider(use_policy, tmp_path):
    """The approved-policy flow names the proposer explicitly (console user, --by); an identity
    provider answering for ordinary calls must not replace them, or the requester rule (the proposer
    cannot approve their own change) no longer has anyone to exclude."""
    path = use_policy(GOVERNED)
    wider = tmp_path / "wider.yaml"
    wider.write_text(WIDER)
    control = Control.from_file(path, identity=StaticIdentityProvider("service-bot"))
    olivia = ctrlrun.Principal(agent="console", user="olivia")
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        control._propose_policy(wider, principal=olivia)
    row = Approval.objects.get(pk=asked.value.request_id)
    assert (row.agent, row.user) == ("console", "olivia")
    with pytest.raises(ctrlrun.InvalidArgument, match="cannot answer it"):
        store.answer_approval(asked.value.request_id, True, by="olivia")
