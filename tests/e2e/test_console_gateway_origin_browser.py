"""A call that came through the MCP gateway, on its console page in a real headless Chromium at
1280 px: the client as it names itself (a hostile clientInfo name shown escaped, a huge version cut),
the MCP session and the upstream, fitting the window. Photographed for the reviewer."""
from __future__ import annotations

import pytest

from tests.support import make_user, session_calls, start_gateway, start_upstream

pytestmark = pytest.mark.usefixtures("store_db", "console_groups")

POLICY = 'schema: ctrlrun.policy/v2\nactions:\n  mcp.pay.refund:\n    effect: "refund:{payment_id}"\n    decision: allow\n'


def test_a_gateway_calls_page_names_its_client_session_and_upstream(console, tmp_path):
    upstream = start_upstream(tmp_path)
    gateway = start_gateway(tmp_path, upstream.url, POLICY)
    try:
        _, result = session_calls(gateway.url, ("refund", {"payment_id": "web1", "amount": 12}),
                                  client_name="claude-ide\u202eexe.txt", client_version="1.4." + "9" * 400)
    finally:
        gateway.stop()
        upstream.stop()
    action_id = result.meta["com.ctrlrun/receipt"]["action_id"]
    make_user("auditor", "otto")
    console.login("otto")
    console.open(f"/admin/ctrlrun/event/call/{action_id}/")
    section = console.by_id("ctrlrun-call-origin")
    shown = section.text
    assert "claude-ide\\u202eexe.txt" in shown and "\u202e" not in shown
    assert "MCP session" in shown and f"pay — {upstream.url}" in shown
    assert "9" * 257 not in shown  # bounded
    width = console.driver.execute_script("return window.innerWidth")
    assert section.rect["x"] + section.rect["width"] <= width  # fits at 1280 px
    console.shot("call")
