"""An MCP server a project hosts itself, protected in its own process (``ctrlrun.mcp_server``,
issue 23 item 7): an SDK-built ``MCPServer`` wrapped by ``protect_server``, served over Streamable
HTTP by uvicorn as its own OS process on the test store, called with the SDK's own client. The same
outcomes, codes and receipts as the gateway (§E1), with no proxy in between."""
from __future__ import annotations

import pytest

from tests.support import executions, receipts, run_command, sdk_client_calls, start_hosted

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  mcp.shop.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - when: { amount_lte: 100000 }
        decision: approve
      - decision: deny
  mcp.shop.delete_customer:
    decision: deny
  mcp.shop.slow_refund:
    effect: "slow:{payment_id}"
    decision: allow
  mcp.shop.refused_refund:
    effect: "refused:{payment_id}"
    decision: allow
  mcp.shop.late_refund:
    effect: "late:{payment_id}"
    rules:
      - when: { amount_lte: 1000 }
        decision: allow
      - decision: deny
"""


@pytest.fixture
def hosted(tmp_path, store_db):
    server = start_hosted(tmp_path, POLICY)
    yield server
    server.stop()


def stamp(result) -> dict:
    return result.meta["com.ctrlrun/receipt"]


def test_allowed_duplicate_and_denied_calls(hosted):
    listed, allowed, again, denied, over, unlisted = sdk_client_calls(
        hosted.url, ("refund", {"payment_id": "p1", "amount": 300}), ("refund", {"payment_id": "p1", "amount": 300}),
        ("delete_customer", {"customer_id": "c9"}), ("refund", {"payment_id": "p9", "amount": 10**7}),
        ("no_such_tool", {}))
    assert listed == ["refund", "delete_customer", "slow_refund", "refused_refund", "late_refund"]
    assert allowed.content[0].text == "refunded 300 on p1" and not allowed.is_error
    committed = next(r for r in receipts() if r["result"] == "committed")
    assert stamp(allowed) == {"action_id": committed["action_id"], "receipt_id": committed["receipt_id"],
                              "effect_key": "refund:p1", "result": "committed", "attempt": 1}
    assert (again.error.code, again.error.data["error"], again.error.data["state"]) == (
        -41004, "ctrlrun.duplicate_effect", "committed")
    assert (denied.error.code, denied.error.data["error"], denied.error.data["reason"]) == (
        -41001, "ctrlrun.denied", "decision")
    assert (over.error.code, over.error.data["reason"]) == (-41001, "rule[2]")
    assert (unlisted.error.code, unlisted.error.data["reason"]) == (-41001, "unknown_action")
    assert executions(hosted) == ["refund p1 300"]  # nothing denied ran, nor the duplicate
    results = {(r["action"], r["result"]) for r in receipts()}
    assert {("mcp.shop.refund", "committed"), ("mcp.shop.delete_customer", "denied"),
            ("mcp.shop.no_such_tool", "denied")} <= results


def test_an_approval_is_presented_by_re_sending_the_identical_call(hosted):
    _, gated, waiting = sdk_client_calls(hosted.url, ("refund", {"payment_id": "p2", "amount": 5000}),
                                         ("refund", {"payment_id": "p2", "amount": 5000}))
    assert (gated.error.code, gated.error.data["error"]) == (-41002, "ctrlrun.approval_required")
    assert gated.error.data["action_hash"].startswith("sha256:")
    request_id = gated.error.data["request_id"]
    # Re-sent while the request waits: the same request, not a second one.
    assert (waiting.error.code, waiting.error.data["request_id"]) == (-41002, request_id)
    assert executions(hosted) == []

    run_command("approve", request_id, "--by", "ana")
    _, granted, once_more, other = sdk_client_calls(
        hosted.url, ("refund", {"payment_id": "p2", "amount": 5000}), ("refund", {"payment_id": "p2", "amount": 5000}),
        ("refund", {"payment_id": "p3", "amount": 5000}))
    assert granted.content[0].text == "refunded 5000 on p2"
    assert stamp(granted)["result"] == "committed" and stamp(granted)["effect_key"] == "refund:p2"
    assert once_more.error.code == -41004
    assert other.error.code == -41002 and other.error.data["request_id"] != request_id  # bound to its call
    assert executions(hosted) == ["refund p2 5000"]


def test_a_tool_raising_timeout_is_ambiguous_and_its_retry_refused(hosted):
    _, lost, retried = sdk_client_calls(hosted.url, ("slow_refund", {"payment_id": "s1", "amount": 5}),
                                        ("slow_refund", {"payment_id": "s1", "amount": 5}))
    # An MCP error result carrying the receipt, in a session that goes on answering.
    assert lost.is_error and lost.content[0].text == "Error executing tool slow_refund"
    assert (stamp(lost)["result"], stamp(lost)["effect_key"]) == ("ambiguous", "slow:s1")
    assert (retried.error.code, retried.error.data["error"], retried.error.data["effect_key"]) == (
        -41005, "ctrlrun.ambiguous_effect", "slow:s1")
    assert executions(hosted) == ["slow_refund s1 5"]
    assert [r["result"] for r in receipts() if r["action"] == "mcp.shop.slow_refund"] == ["ambiguous", "blocked"]


def test_a_tool_raising_not_executed_is_failed_and_its_retry_runs(hosted):
    _, refused, retried = sdk_client_calls(hosted.url, ("refused_refund", {"payment_id": "r1", "amount": 5}),
                                           ("refused_refund", {"payment_id": "r1", "amount": 5}))
    assert refused.is_error and stamp(refused)["result"] == "failed"
    assert stamp(retried) | {"action_id": None, "receipt_id": None} == {
        "action_id": None, "receipt_id": None, "effect_key": "refused:r1", "result": "committed", "attempt": 2}
    assert executions(hosted) == ["refused_refund r1 5", "refused_refund r1 5"]


def test_arguments_the_tool_refuses_before_running_are_failed(hosted):
    _, bad, good = sdk_client_calls(hosted.url, ("slow_refund", {"payment_id": "v1", "amount": "many"}),
                                    ("slow_refund", {"payment_id": "v1", "amount": 7}))
    assert bad.is_error and stamp(bad)["result"] == "failed"  # the SDK's schema check: the body never ran
    assert executions(hosted) == ["slow_refund v1 7"]  # so the retry ran
    assert (stamp(good)["result"], stamp(good)["attempt"]) == ("ambiguous", 2)


def test_a_tool_added_after_wrapping_is_protected(hosted):
    _, allowed, again, denied = sdk_client_calls(
        hosted.url, ("late_refund", {"payment_id": "l1", "amount": 10}),
        ("late_refund", {"payment_id": "l1", "amount": 10}), ("late_refund", {"payment_id": "l2", "amount": 5000}))
    assert stamp(allowed)["result"] == "committed" and stamp(allowed)["effect_key"] == "late:l1"
    assert again.error.code == -41004
    assert (denied.error.code, denied.error.data["reason"]) == (-41001, "rule[1]")
    assert executions(hosted) == ["late_refund l1 10"]


def test_a_float_argument_is_refused_and_recorded(hosted):
    _, refused = sdk_client_calls(hosted.url, ("refund", {"payment_id": "f1", "amount": 12.5}))
    assert (refused.error.code, refused.error.data["error"], refused.error.data["pointer"]) == (
        -41008, "ctrlrun.unrepresentable_argument", "/amount")
    assert executions(hosted) == []
    denied, = receipts()
    assert (denied["action"], denied["result"], denied["decision_reason"]) == (
        "mcp.shop.refund", "denied", "unrepresentable_argument")
    assert denied["arguments"] == {"payment_id": "f1", "amount": "12.5"}
    assert denied["action_id"] == refused.error.data["action_id"]


def test_a_principal_callable_reads_the_request_headers(tmp_path, store_db):
    server = start_hosted(tmp_path, POLICY, mode="header")
    try:
        _, nobody = sdk_client_calls(server.url, ("refund", {"payment_id": "h1", "amount": 5}))
        _, named = sdk_client_calls(server.url, ("refund", {"payment_id": "h1", "amount": 5}),
                                    headers={"x-agent": "agent-7"})
    finally:
        server.stop()
    assert (nobody.error.code, nobody.error.data["error"]) == (-41007, "ctrlrun.no_principal")
    assert stamp(named)["result"] == "committed"
    assert executions(server) == ["refund h1 5"]
    committed, = (r for r in receipts() if r["result"] == "committed")
    assert committed["principal"]["agent"] == "agent-7"


def test_what_protect_server_cannot_protect_is_refused_when_it_is_wrapped():
    from mcp.server.lowlevel import Server
    from mcp.server.mcpserver import MCPServer

    from ctrlrun.errors import InvalidArgument
    from ctrlrun.mcp_server import protect_server

    with pytest.raises(InvalidArgument, match="takes an mcp.server.mcpserver.MCPServer"):
        protect_server(Server("low"), alias="shop", principal="agent-1")
    for alias in ("Shop", "", "mcp.shop", None):
        with pytest.raises(InvalidArgument, match="must match"):
            protect_server(MCPServer("s"), alias=alias, principal="agent-1")
    for principal in (42, "  ", b"agent"):
        with pytest.raises(InvalidArgument, match="principal"):
            protect_server(MCPServer("s"), alias="shop", principal=principal)
    server = protect_server(MCPServer("s"), alias="shop", principal="agent-1")
    with pytest.raises(InvalidArgument, match="already protected"):
        protect_server(server, alias="other", principal="agent-1")


def test_a_direct_call_outside_a_request_is_protected_too(store_db, use_policy):
    """``await server.call_tool(...)`` in the server's own process (no HTTP, no SDK Context of a
    request) meets the same pipeline; the principal callable is given ``None``."""
    import asyncio

    from mcp.server.mcpserver import MCPServer
    from mcp.shared.exceptions import MCPError

    from ctrlrun.control import Control
    from ctrlrun.mcp_server import protect_server

    use_policy(POLICY)
    ran: list[str] = []
    seen: list[object] = []

    def build(principal):
        server = MCPServer("direct")

        @server.tool()
        def refund(payment_id: str, amount: int) -> str:
            ran.append(payment_id)
            return "ok"

        return protect_server(server, alias="shop", principal=principal, control=Control())

    def raising(context):
        raise RuntimeError("the token store is down")

    async def calls():
        answers = []
        for principal, payment in (("agent-1", "d1"), ("agent-1", "d1"), (lambda c: seen.append(c) or "agent-2", "d2"),
                                   (raising, "d3"), (lambda c: 7, "d4"), (None, "d5")):
            try:
                answers.append(await build(principal).call_tool("refund", {"payment_id": payment, "amount": 5}))
            except MCPError as exc:
                answers.append(exc)
        return answers

    first, again, by_callable, broken, wrong_type, nobody = asyncio.run(calls())
    assert stamp(first)["result"] == "committed" and again.error.code == -41004
    assert stamp(by_callable)["result"] == "committed" and seen == [None]
    for refused in (broken, wrong_type, nobody):
        assert (refused.error.code, refused.error.data["error"]) == (-41007, "ctrlrun.no_principal")
    assert "token store" not in broken.error.message  # the detail is in the log, not told to the client
    assert ran == ["d1", "d2"]


PINNED = """\
schema: ctrlrun.policy/v8
actions:
  mcp.shop.refund:
    effect: "refund:{payment_id}"
    decision: allow
    upstream:
      tool_schema_sha256: "sha256:%s"
""" % ("0" * 64)


@pytest.mark.parametrize("policy, code, error", [
    (PINNED, -41016, "ctrlrun.upstream_unpinned"),   # no upstream to check in-process: never verified
    ("schema: ctrlrun.policy/v2\nactions: [\n", -32603, None),  # a policy that does not load: said, not run
])
def test_a_call_that_cannot_be_decided_here_never_runs(store_db, use_policy, policy, code, error):
    import asyncio

    from mcp.server.mcpserver import MCPServer
    from mcp.shared.exceptions import MCPError

    from ctrlrun.control import Control
    from ctrlrun.mcp_server import protect_server

    use_policy(policy)
    ran: list[str] = []
    server = MCPServer("direct")

    @server.tool()
    def refund(payment_id: str, amount: int) -> str:
        ran.append(payment_id)
        return "ok"

    protect_server(server, alias="shop", principal="agent-1", control=Control())
    with pytest.raises(MCPError) as refused:
        asyncio.run(server.call_tool("refund", {"payment_id": "x1", "amount": 5}))
    assert refused.value.error.code == code and ran == []
    if error:
        assert refused.value.error.data["error"] == error
        assert refused.value.error.data["reason"] == "upstream_unverified"
    else:
        assert "PolicyError" in refused.value.error.message and "do not retry blindly" in refused.value.error.message
