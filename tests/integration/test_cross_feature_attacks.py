"""Attacks across features: a policy proposal under an identity provider, the gateway facing a grant the kernel cannot use."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.identity import StaticIdentityProvider
from ctrlrun.models import Approval
from tests.support import GOVERNED_POLICY as GOVERNED, WIDER_GOVERNED_POLICY as WIDER

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


ROLE_POLICY = """\
schema: ctrlrun.policy/v6
controls:
  four-eyes: {title: "finance approves a refund", approver_role: finance}
actions:
  mcp.pay.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: approve
        controls: [four-eyes]
"""


@pytest.mark.slow
def test_the_gateway_asks_again_after_a_grant_the_kernel_cannot_use(tmp_path):
    """A role request granted on the command line (it verifies nobody) is refused at use
    (approver_unverified) and left granted. The gateway re-presented that same granted row on every
    re-sent call until it expired, so no new request could be asked of a person of finance."""
    from tests.support import sdk_client_calls as sdk
    from tests.support import run_command, start_gateway, start_upstream

    upstream = start_upstream(tmp_path)
    gateway = start_gateway(tmp_path, upstream.url, ROLE_POLICY)
    try:
        _, gated = sdk(gateway.url, ("refund", {"payment_id": "p2", "amount": 5000}))
        first = gated.error.data["request_id"]
        run_command("approve", first, "--by", "cli:ops")
        _, again = sdk(gateway.url, ("refund", {"payment_id": "p2", "amount": 5000}))
        # On main: -41006 blocked (approver_unverified) on the same request, on every re-send until it expires.
        assert again.error.code == -41002 and again.error.data["request_id"] != first, again.error.data
    finally:
        gateway.stop()
        upstream.stop()
