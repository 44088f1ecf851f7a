"""The MCP gateway (§E1): an SDK-built upstream in its own process, ``ctrlrun gateway`` in its own
process on the test store, and the SDK's own client (or raw HTTP for what the SDK never sends)."""
from __future__ import annotations

import asyncio

import pytest

from tests.support import (
    executions,
    sdk_client_calls,
    mcp_post,
    receipts,
    run_command,
    start_gateway,
    start_upstream,
    tools_call,
)

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  mcp.pay.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - when: { amount_lte: 100000 }
        decision: approve
      - decision: deny
  mcp.pay.slow_refund:
    effect: "slow:{payment_id}"
    decision: allow
"""


@pytest.fixture
def upstream(tmp_path):
    server = start_upstream(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def gateway(tmp_path, upstream, store_db):
    proc = start_gateway(tmp_path, upstream.url, POLICY)
    yield proc
    proc.stop()


sdk = sdk_client_calls


def test_allowed_denied_and_approved_calls_through_the_sdk_client(gateway, upstream):
    listed, allowed, again, denied, unlisted, gated = sdk(
        gateway.url, ("refund", {"payment_id": "p1", "amount": 300}), ("refund", {"payment_id": "p1", "amount": 300}),
        ("refund", {"payment_id": "p9", "amount": 10**7}), ("broken", {"payment_id": "b1"}),
        ("refund", {"payment_id": "p2", "amount": 5000}))
    assert listed == ["refund", "slow_refund", "broken"]  # tools/list relayed as the upstream said it
    assert allowed.content[0].text == "refunded 300 on p1"
    stamp = allowed.meta["com.ctrlrun/receipt"]
    assert stamp["result"] == "committed" and stamp["effect_key"] == "refund:p1" and stamp["attempt"] == 1
    assert stamp["receipt_id"] == next(r["receipt_id"] for r in receipts() if r["result"] == "committed")
    assert (again.error.code, again.error.data["error"], again.error.data["state"]) == (
        -41004, "ctrlrun.duplicate_effect", "committed")
    assert (denied.error.code, denied.error.data["reason"]) == (-41001, "rule[2]")
    assert (unlisted.error.code, unlisted.error.data["reason"]) == (-41001, "unknown_action")
    assert gated.error.code == -41002 and gated.error.data["action_hash"].startswith("sha256:")
    request_id = gated.error.data["request_id"]
    assert executions(upstream) == ["refund p1 300"]

    run_command("approve", request_id, "--by", "ana")
    _, granted, once_more = sdk(gateway.url, ("refund", {"payment_id": "p2", "amount": 5000}),
                                ("refund", {"payment_id": "p2", "amount": 5000}))
    assert granted.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert once_more.error.code == -41004
    assert executions(upstream) == ["refund p1 300", "refund p2 5000"]
    actions = {(r["action"], r["result"]) for r in receipts()}
    assert ("mcp.pay.refund", "committed") in actions and ("mcp.pay.broken", "denied") in actions


def test_a_float_argument_is_refused_with_its_pointer(gateway, upstream):
    status, body = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p1", "amount": 1.5}))
    assert status == 400
    assert (body["error"]["code"], body["error"]["data"]["pointer"]) == (-41008, "/amount")
    assert body["error"]["data"]["error"] == "ctrlrun.unrepresentable_argument"
    assert executions(upstream) == []
    denied, = receipts()  # and the refusal is in the evidence, the float kept as its JSON text
    assert (denied["action"], denied["result"], denied["decision_reason"]) == (
        "mcp.pay.refund", "denied", "unrepresentable_argument")
    assert denied["arguments"] == {"payment_id": "p1", "amount": "1.5"}
    assert denied["action_id"] == body["error"]["data"]["action_id"]


def test_hostile_requests_are_refused_before_anything_runs(gateway, upstream):
    huge = {**tools_call("refund", {"payment_id": "p1", "amount": 1}), "pad": "x" * (2 * 1024 * 1024)}
    assert mcp_post(gateway.url, huge)[0] == 413
    nested = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"refund","arguments":{"a":' + \
        b"[" * 5000 + b"]" * 5000 + b"}}}"
    status, body = mcp_post(gateway.url, nested)
    assert (status, body["error"]["code"]) == (400, -32600)
    status, body = mcp_post(gateway.url, [tools_call("refund", {"payment_id": "p1", "amount": 1})])
    assert (status, body["error"]["code"]) == (400, -32600) and "batch" in body["error"]["message"]
    status, body = mcp_post(gateway.url, b"{not json")
    assert (status, body["error"]["code"]) == (400, -32700)
    status, body = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p1", "amount": 1}),
                            headers={"mcp-protocol-version": "1999-01-01"})
    assert (status, body["error"]["code"]) == (400, -32022)
    status, body = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p1", "amount": 1}),
                            headers={"mcp-method": None})
    assert (status, body["error"]["code"]) == (400, -32020)  # the current revision needs Mcp-Method
    status, body = mcp_post(gateway.url, tools_call("refund", {"payment_id": "p1", "amount": 1}),
                            headers={"mcp-name": "slow_refund"})
    assert (status, body["error"]["code"]) == (400, -32020)  # Mcp-Name contradicts the body
    assert executions(upstream) == [] and receipts() == []


def test_the_upstream_killed_mid_call_is_ambiguous_and_the_retry_refused(gateway, upstream):
    import threading
    import time

    answer = {}
    thread = threading.Thread(target=lambda: answer.update(
        zip(("status", "body"), mcp_post(gateway.url, tools_call("slow_refund", {"payment_id": "s1", "amount": 5}))))
    )
    thread.start()
    while executions(upstream) != ["slow_refund s1 5"]:
        assert thread.is_alive(), answer
        time.sleep(0.05)
    upstream.stop()  # SIGKILL while the tool runs: its effect may or may not have happened
    thread.join(timeout=60)
    assert answer["status"] == 502 and answer["body"]["error"]["code"] == -41010
    assert answer["body"]["error"]["data"]["effect_key"] == "slow:s1"
    assert [r["result"] for r in receipts()] == ["ambiguous"]
    status, body = mcp_post(gateway.url, tools_call("slow_refund", {"payment_id": "s1", "amount": 5}))
    assert (status, body["error"]["code"], body["error"]["data"]["effect_key"]) == (409, -41005, "slow:s1")


def test_a_tool_renamed_upstream_between_list_and_call(tmp_path, store_db):
    first = start_upstream(tmp_path)
    gateway = start_gateway(tmp_path, first.url, POLICY)
    try:
        from mcp import Client
        from mcp.shared.exceptions import MCPError

        async def run():
            async with Client(gateway.url) as client:
                names = [tool.name for tool in (await client.list_tools()).tools]
                first.stop()  # the same port, a new server where refund is now refund_v2
                renamed = start_upstream(tmp_path, "refund_v2", port=first.port)
                try:
                    try:
                        old = await client.call_tool("refund", {"payment_id": "r1", "amount": 10})
                    except MCPError as exc:
                        old = exc
                    try:
                        new = await client.call_tool("refund_v2", {"payment_id": "r1", "amount": 10})
                    except MCPError as exc:
                        new = exc
                finally:
                    renamed.stop()
                return names, old, new

        names, old, new = asyncio.run(run())
    finally:
        gateway.stop()
    assert "refund" in names
    # The old name is still the policy's mcp.pay.refund; the upstream no longer has it: nothing ran.
    results = [(r["action"], r["result"]) for r in receipts()]
    assert ("mcp.pay.refund", "committed") not in results
    assert getattr(old, "is_error", True)
    # The new name is a different action the policy never listed: denied, never forwarded.
    assert (new.error.code, new.error.data["reason"]) == (-41001, "unknown_action")
    assert executions(first) == []


@pytest.mark.parametrize("arguments, says", [
    (["--alias", "pay"], "--upstream"),
    (["--upstream", "http://127.0.0.1:1/mcp", "--alias", "Pay!", "--principal", "a"], "must match"),
    (["--upstream", "http://127.0.0.1:1/mcp", "--alias", "pay"], "--principal NAME"),
    (["--upstream", "http://127.0.0.1:1/mcp", "--alias", "pay", "--principal", "a", "--listen", "0.0.0.0:8900"],
     "--allow-remote"),
    (["--upstream", "http://127.0.0.1:1/mcp", "--alias", "pay", "--principal", "a", "--path", "/ctrlrun/mcp"],
     "/ctrlrun/"),
    (["--upstream", "ftp://x", "--alias", "pay", "--principal", "a"], "http:// or https://"),
    (["--upstream", "http://127.0.0.1:1/mcp", "--alias", "pay", "--principal-from-client-info"], "removed"),
])
def test_the_command_line_refuses_with_a_reason(tmp_path, store_db, arguments, says):
    import subprocess
    import sys

    from tests.support import script_environment

    done = subprocess.run([sys.executable, "-m", "ctrlrun", "gateway", *arguments], cwd=tmp_path,
                          env=script_environment(tmp_path, POLICY), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_legacy_session_client_goes_through_the_gateway_too(gateway, upstream):
    """The initialize handshake (revision 2025-11-25, a session id, answers as Server-Sent Events)."""
    from mcp import Client

    async def run():
        async with Client(gateway.url, mode="legacy") as client:
            names = [tool.name for tool in (await client.list_tools()).tools]
            return names, await client.call_tool("refund", {"payment_id": "L1", "amount": 3})

    names, result = asyncio.run(run())
    assert "refund" in names and result.content[0].text == "refunded 3 on L1"
    assert result.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert executions(upstream) == ["refund L1 3"]
