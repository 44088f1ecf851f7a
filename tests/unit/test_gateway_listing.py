"""``--hide-denied-tools``' pieces: which actions the policy denies outright, and the rewriting of a
``tools/list`` answer (JSON or Server-Sent Events) that keeps everything else the upstream said."""
from __future__ import annotations

import json

import pytest

from ctrlrun.gateway.listing import Malformed, without_hidden
from ctrlrun.policy import parse_policy

POLICY = """\
schema: ctrlrun.policy/v3
actions:
  mcp.a.conditional:
    rules:
      - when: { amount_lte: 10 }
        decision: allow
      - decision: deny
  mcp.a.gated:
    rules:
      - decision: approve
  mcp.a.allowed:
    decision: allow
  mcp.a.denied:
    decision: deny
  mcp.a.all_deny:
    rules:
      - when: { who_eq: "x" }
        decision: deny
      - when: { amount_gt: 5 }
        decision: deny
"""


def test_denied_outright_is_unlisted_a_bare_deny_or_rules_that_all_deny():
    policy = parse_policy(POLICY)
    outright = {name for name in ("conditional", "gated", "allowed", "denied", "all_deny", "unlisted")
                if policy.denies_outright(f"mcp.a.{name}")}
    assert outright == {"denied", "all_deny", "unlisted"}
    observing = parse_policy(POLICY.replace("actions:", "mode: observe\nactions:", 1))
    assert not any(observing.denies_outright(f"mcp.a.{name}") for name in ("denied", "all_deny", "unlisted"))


def _hide(name: str) -> bool:
    return name.startswith("x")


def test_a_json_page_loses_the_hidden_tools_and_keeps_its_cursor():
    answer = {"jsonrpc": "2.0", "id": 3, "result": {"tools": [{"name": "a", "inputSchema": {}}, {"name": "x1"}],
                                                      "nextCursor": "page-2", "_meta": {"k": 1}}}
    body, hidden = without_hidden(json.dumps(answer).encode(), "application/json", 3, _hide)
    assert hidden == ["x1"]
    assert json.loads(body) == {"jsonrpc": "2.0", "id": 3, "result": {"tools": [{"name": "a", "inputSchema": {}}],
                                                                        "nextCursor": "page-2", "_meta": {"k": 1}}}
    raw = json.dumps({"jsonrpc": "2.0", "id": 3, "result": {"tools": [{"name": "a"}]}}).encode()
    assert without_hidden(raw, "application/json", 3, _hide) == (raw, [])  # nothing hidden: the bytes as they came


def test_an_sse_answer_is_rewritten_in_place_with_its_other_events_and_ids():
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "hi"}}
    answer = {"jsonrpc": "2.0", "id": "r", "result": {"tools": [{"name": "x"}, {"name": "b"}], "nextCursor": "c"}}
    text = f": comment\nid: 1\ndata: {json.dumps(note)}\n\nid: 2\nevent: message\ndata: {json.dumps(answer)}\n\n"
    body, hidden = without_hidden(text.encode(), "text/event-stream", "r", _hide)
    assert hidden == ["x"]
    events = body.decode().split("\n\n")
    assert events[0] == f": comment\nid: 1\ndata: {json.dumps(note)}"
    assert events[1].splitlines()[:2] == ["id: 2", "event: message"]
    assert json.loads(events[1].splitlines()[2][len("data: "):])["result"] == {"tools": [{"name": "b"}],
                                                                                "nextCursor": "c"}


def test_an_error_answer_is_kept_as_it_is():
    raw = json.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "no"}}).encode()
    assert without_hidden(raw, "application/json", 1, _hide) == (raw, [])


@pytest.mark.parametrize("raw, kind", [
    (b"not json", "application/json"),
    (b"\xff\xfe", "application/json"),
    (b'{"jsonrpc": "2.0", "id": 1, "result": {"content": []}}', "application/json"),
    (b'{"jsonrpc": "2.0", "id": 1, "result": {"tools": [{"title": "no name"}]}}', "application/json"),
    (b'{"jsonrpc": "2.0", "id": 1, "result": {"tools": ["a"]}}', "application/json"),
    (b'{"jsonrpc": "2.0", "id": 2, "result": {"tools": []}}', "application/json"),  # another request's answer
    (b"[" * 100_000, "application/json"),
    (b"data: {broken\n\n", "text/event-stream"),
    (b'data: {"jsonrpc": "2.0", "id": 1, "result": {"tools": {}}}\n\n', "text/event-stream"),
])
def test_an_answer_that_is_not_a_readable_list_is_malformed(raw, kind):
    with pytest.raises(Malformed):
        without_hidden(raw, kind, 1, _hide)


def test_the_mount_keyword_sets_the_mode_and_refuses_what_is_not_a_bool():
    from ctrlrun.errors import InvalidArgument
    from ctrlrun.gateway import GatewayApp, fixed_principal, mount

    gateway = GatewayApp(upstream="http://127.0.0.1:9/mcp", alias="a", principal=fixed_principal("agent"))
    assert gateway.hide_denied_tools is False
    mount(lambda scope, receive, send: None, gateway, hide_denied_tools=True)
    assert gateway.hide_denied_tools is True
    with pytest.raises(InvalidArgument, match="True or False"):
        mount(lambda scope, receive, send: None, gateway, hide_denied_tools="yes")
    with pytest.raises(InvalidArgument, match="True or False"):
        GatewayApp(upstream="http://127.0.0.1:9/mcp", alias="a", hide_denied_tools=1)
