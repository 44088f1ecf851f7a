"""Upstream pins at the gateway (§E3): a tool-schema pin matching the upstream's ``tools/list``
entry is admitted, a mismatch refused ``-41016`` (a denied receipt, nothing run), and a tool renamed
or re-schemed upstream between ``tools/list`` and ``tools/call`` is refused under its pin. Real
processes: the SDK-built upstream, ``ctrlrun gateway``, the SDK's client."""
from __future__ import annotations

import asyncio

import pytest

from ctrlrun.upstream import tool_schema_hash
from tests.support import executions, mcp_post, receipts, start_gateway, start_upstream, tools_call

pytestmark = pytest.mark.slow

POLICY = """\
schema: ctrlrun.policy/v8
actions:
  mcp.pay.refund:
    effect: "refund:{{payment_id}}"
    decision: allow
    upstream:
      tool_schema_sha256: "{pin}"
"""


def listed_entry(url: str, name: str) -> dict:
    """The upstream's own tools/list entry for ``name``, as raw JSON (what the pin hashes)."""
    message = tools_call("x", {})
    message.update(method="tools/list", params={"_meta": message["params"]["_meta"]})
    status, answer = mcp_post(url, message)
    assert status == 200, answer
    return next(tool for tool in answer["result"]["tools"] if tool["name"] == name)


def call(url: str, *calls: tuple[str, dict], between=None) -> list:
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    async def run():
        answers = []
        async with Client(url) as client:
            await client.list_tools()
            if between is not None:
                between()
            for name, arguments in calls:
                try:
                    answers.append(await client.call_tool(name, arguments))
                except MCPError as exc:
                    answers.append(exc)
        return answers

    return asyncio.run(run())


@pytest.fixture
def upstream(tmp_path):
    server = start_upstream(tmp_path)
    yield server
    server.stop()


def test_a_matching_schema_pin_is_admitted(tmp_path, upstream, store_db):
    pin = tool_schema_hash(listed_entry(upstream.url, "refund"))
    gateway = start_gateway(tmp_path, upstream.url, POLICY.format(pin=pin))
    try:
        (done,) = call(gateway.url, ("refund", {"payment_id": "p1", "amount": 5}))
    finally:
        gateway.stop()
    assert done.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert len(executions(upstream)) == 1


def test_a_mismatched_schema_pin_is_refused_before_anything_runs(tmp_path, upstream, store_db):
    entry = listed_entry(upstream.url, "refund")
    pin = tool_schema_hash({**entry, "description": "what the policy's author reviewed"})
    gateway = start_gateway(tmp_path, upstream.url, POLICY.format(pin=pin))
    try:
        (refused,) = call(gateway.url, ("refund", {"payment_id": "p1", "amount": 5}))
    finally:
        gateway.stop()
    assert refused.error.code == -41016
    assert refused.error.data["error"] == "ctrlrun.upstream_unpinned"
    assert refused.error.data["reason"] == "upstream_mismatch"
    assert [(r["result"], r["action"], r["decision_reason"]) for r in receipts()] == [
        ("denied", "mcp.pay.refund", "upstream_mismatch")]
    assert executions(upstream) == []


def test_a_tool_renamed_upstream_after_the_list_is_refused_under_its_pin(tmp_path, store_db):
    first = start_upstream(tmp_path)
    pin = tool_schema_hash(listed_entry(first.url, "refund"))
    gateway = start_gateway(tmp_path, first.url, POLICY.format(pin=pin))
    swapped = []

    def rename():  # the same port, a new server where refund is now refund_v2
        first.stop()
        swapped.append(start_upstream(tmp_path, "refund_v2", port=first.port))

    try:
        (refused,) = call(gateway.url, ("refund", {"payment_id": "r1", "amount": 10}), between=rename)
    finally:
        gateway.stop()
        for server in swapped:
            server.stop()
    assert (refused.error.code, refused.error.data["reason"]) == (-41016, "upstream_unverified")
    assert executions(first) == []


def test_a_tool_re_schemed_upstream_after_the_list_is_refused_under_its_pin(tmp_path, store_db):
    first = start_upstream(tmp_path)
    entry = listed_entry(first.url, "refund")
    pin = tool_schema_hash(entry)
    gateway = start_gateway(tmp_path, first.url, POLICY.format(pin=pin))
    swapped = []

    def reschema():  # the same name, a different tool behind it
        first.stop()
        swapped.append(start_upstream(tmp_path, "refund", port=first.port, variant="reschemed"))

    try:
        (refused,) = call(gateway.url, ("refund", {"payment_id": "r1", "amount": 10}), between=reschema)
    finally:
        gateway.stop()
        for server in swapped:
            server.stop()
    assert (refused.error.code, refused.error.data["reason"]) == (-41016, "upstream_mismatch")
    assert executions(first) == []


def test_a_pinned_action_called_in_process_is_refused_unverified(store_db):
    from ctrlrun import Control
    from ctrlrun.errors import ActionDenied
    from ctrlrun.policy import parse_policy

    control = Control(policy=parse_policy(POLICY.format(pin="sha256:" + "0" * 64)))
    ran = []
    with pytest.raises(ActionDenied) as refused:
        control.call("mcp.pay.refund", {"payment_id": "p1", "amount": 5}, lambda: ran.append(1), principal="agent-1")
    assert refused.value.reason == "upstream_unverified" and ran == []
    assert [(r["result"], r["decision_reason"]) for r in receipts()] == [("denied", "upstream_unverified")]


def test_a_certificate_pin_on_a_plain_http_upstream_is_never_verified(tmp_path, upstream, store_db):
    policy = POLICY.replace('tool_schema_sha256: "{pin}"', 'tls_cert_sha256: ["{pin}"]')
    gateway = start_gateway(tmp_path, upstream.url, policy.format(pin="sha256:" + "1" * 64))
    try:
        (refused,) = call(gateway.url, ("refund", {"payment_id": "p1", "amount": 5}))
    finally:
        gateway.stop()
    assert (refused.error.code, refused.error.data["reason"]) == (-41016, "upstream_unverified")
    assert executions(upstream) == []
