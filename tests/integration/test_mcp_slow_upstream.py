"""A slow upstream holding many connections: forty calls through the gateway are held by an upstream
that reads them and answers nothing. The gateway keeps answering (a denied call, a duplicate of a
held key) while they hang; when the upstream drops them, every one is AMBIGUOUS, never failed, and
its retry refused."""
from __future__ import annotations

import threading

import pytest

from tests.support import HangingUpstream, mcp_post, receipts, start_gateway, tools_call

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  mcp.slow.refund:
    effect: "refund:{payment_id}"
    decision: allow
  mcp.slow.delete_customer:
    decision: deny
"""
HELD = 40


def test_a_slow_upstream_holding_many_connections(tmp_path, store_db):
    upstream = HangingUpstream()
    gateway = start_gateway(tmp_path, upstream.url, POLICY, "--upstream-timeout", "600", alias="slow")
    answers: dict[int, tuple] = {}

    def call(n: int) -> None:
        answers[n] = mcp_post(gateway.url, tools_call("refund", {"payment_id": f"h{n}", "amount": 5}, n), timeout=600)

    callers = [threading.Thread(target=call, args=(n,)) for n in range(HELD)]
    try:
        for caller in callers:
            caller.start()
        assert upstream.wait_held(HELD), f"only {len(upstream.held)} calls reached the upstream"
        status, denied = mcp_post(gateway.url, tools_call("delete_customer", {"customer_id": "c1"}, 900))
        assert status == 403 and denied["error"]["code"] == -41001, denied
        status, busy = mcp_post(gateway.url, tools_call("refund", {"payment_id": "h0", "amount": 5}, 901))
        assert status == 409 and busy["error"]["code"] == -41004, busy  # its key is held: in progress
        assert not answers and all(c.is_alive() for c in callers)  # all forty still waiting on the upstream
        upstream.drop()
        for caller in callers:
            caller.join(timeout=600)
        assert sorted(answers) == list(range(HELD))
        codes = {a[1]["error"]["code"] for a in answers.values()}
        assert codes == {-41010}, answers  # dropped after reading the call: maybe it happened
        status, retry = mcp_post(gateway.url, tools_call("refund", {"payment_id": "h7", "amount": 5}, 902))
        assert status == 409 and retry["error"]["code"] == -41005, retry
    finally:
        gateway.stop()
        upstream.close()
    results = [r["result"] for r in receipts() if r["action"] == "mcp.slow.refund"]
    assert results.count("ambiguous") == HELD and "failed" not in results, results
