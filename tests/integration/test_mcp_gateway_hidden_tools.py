"""``--hide-denied-tools`` (issue 23): an SDK-built upstream and ``ctrlrun gateway`` in their own
processes, the SDK's own ``ClientSession`` over streamable HTTP. Off by default the list is the
upstream's; on, the tools the policy denies outright are left out and a conditional one is kept;
the list is no enforcement (a hidden tool called anyway is ``-41001`` as before); it follows the
policy file as it changes; a list the gateway cannot read is relayed unchanged, never a traceback."""
from __future__ import annotations

import pytest

from tests.support import (
    Misbehaving,
    executions,
    mcp_post,
    receipts,
    session_calls,
    start_gateway,
    start_upstream,
)

pytestmark = pytest.mark.slow

#: refund depends on its arguments, lookup is allowed, slow_refund a bare deny, purge rules that all
#: deny, broken unlisted.
POLICY = """\
schema: ctrlrun.policy/v2
actions:
  mcp.pay.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: deny
  mcp.pay.lookup:
    decision: allow
  mcp.pay.slow_refund:
    decision: deny
  mcp.pay.purge:
    rules:
      - when: { customer_id_eq: "vip" }
        decision: deny
      - decision: deny
"""

EVERY_TOOL = ["refund", "slow_refund", "broken", "lookup", "purge"]


@pytest.fixture
def upstream(tmp_path):
    server = start_upstream(tmp_path, variant="wide")
    yield server
    server.stop()


def _gateway(tmp_path, upstream, *extra, policy=POLICY):
    return start_gateway(tmp_path, upstream.url, policy, *extra)


def test_off_by_default_the_list_is_the_upstreams(tmp_path, upstream, store_db):
    gateway = _gateway(tmp_path, upstream)
    try:
        (listed,) = session_calls(gateway.url)
    finally:
        gateway.stop()
    assert listed == EVERY_TOOL


def test_on_it_hides_what_the_policy_denies_outright_and_calling_one_is_still_refused(tmp_path, upstream, store_db):
    gateway = _gateway(tmp_path, upstream, "--hide-denied-tools")
    try:
        listed, hidden_call, unlisted_call, conditional = session_calls(
            gateway.url, ("slow_refund", {"payment_id": "s1", "amount": 1}), ("broken", {"payment_id": "b1"}),
            ("refund", {"payment_id": "r1", "amount": 5}))
    finally:
        gateway.stop()
    banner = gateway.proc.stdout.read()
    assert "hide-denied-tools: on" in banner, banner
    assert listed == ["refund", "lookup"]  # the conditional and the allowed one; upstream order kept
    assert (hidden_call.error.code, hidden_call.error.data["reason"]) == (-41001, "decision")
    assert (unlisted_call.error.code, unlisted_call.error.data["reason"]) == (-41001, "unknown_action")
    assert conditional.content[0].text == "refunded 5 on r1"
    assert executions(upstream) == ["refund r1 5"]
    denied = {r["action"]: r["decision_reason"] for r in receipts() if r["result"] == "denied"}
    assert denied == {"mcp.pay.slow_refund": "decision", "mcp.pay.broken": "unknown_action"}


def test_the_list_follows_the_policy_file_as_it_changes(tmp_path, upstream, store_db):
    gateway = _gateway(tmp_path, upstream, "--hide-denied-tools")
    try:
        (before,) = session_calls(gateway.url)
        (tmp_path / "ctrlrun.yaml").write_text(POLICY.replace("  mcp.pay.lookup:\n    decision: allow\n",
                                                              "  mcp.pay.lookup:\n    decision: deny\n")
                                               + "  mcp.pay.broken:\n    decision: approve\n")
        after = before
        for _ in range(200):  # the gateway reads a changed file within a second: wait for it, no deadline asserted
            (after,) = session_calls(gateway.url)
            if after != before:
                break
        _, lookup = session_calls(gateway.url, ("lookup", {"payment_id": "p1"}))
    finally:
        gateway.stop()
    assert before == ["refund", "lookup"]
    assert after == ["refund", "broken"]
    assert lookup.error.code == -41001


def test_an_observing_policy_hides_nothing(tmp_path, upstream, store_db):
    gateway = _gateway(tmp_path, upstream, "--hide-denied-tools",
                       policy=POLICY.replace("schema: ctrlrun.policy/v2\n", "schema: ctrlrun.policy/v3\nmode: observe\n"))
    try:
        (listed,) = session_calls(gateway.url)
    finally:
        gateway.stop()
    assert listed == EVERY_TOOL


def test_a_list_the_gateway_cannot_read_is_relayed_unchanged(tmp_path, store_db):
    upstream = Misbehaving()  # answers tools/list with a tools/call result: no "tools" in it
    gateway = start_gateway(tmp_path, upstream.url, POLICY, "--hide-denied-tools")
    try:
        status, body = mcp_post(gateway.url, {"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {}})
    finally:
        gateway.stop()
        upstream.close()
    assert status == 200
    assert body == {"jsonrpc": "2.0", "id": 4, "result": {"content": [{"type": "text", "text": "ok"}],
                                                          "resultType": "complete"}}
    errors = gateway.proc.stderr.read()
    assert "relayed unchanged" in errors and "Traceback" not in errors, errors
