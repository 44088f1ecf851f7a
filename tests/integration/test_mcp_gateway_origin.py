"""The console names calls that came through the gateway (issue 23): a real ``ctrlrun gateway``
process in front of an SDK-built upstream, called by the SDK's own ``ClientSession`` (the
initialize handshake: clientInfo, a session id) and by a raw request with only a User-Agent. Each
call's ACTION_PROPOSED event carries its origin (client, session, upstream), bounded, inside the
hash-chained events; the call's and the receipt's pages show it escaped."""
from __future__ import annotations

import json

import pytest
from django.test import Client

from tests.support import (
    evidence_unguarded,
    make_user,
    mcp_post,
    receipt_url,
    receipts,
    run_command,
    session_calls,
    start_gateway,
    start_upstream,
    text,
    tools_call,
    url,
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
      - decision: deny
"""
RLO = "\u202e"
HOSTILE_NAME = f"ide{RLO}evil\x00"
SHOWN_RLO = '<span class="ctrlrun-hidden" title="U+202E RIGHT-TO-LEFT OVERRIDE">\\u202e</span>'


def _origin_of(action_id: str) -> dict:
    from ctrlrun.models import Event

    (event,) = Event.objects.filter(action_id=action_id, type="ACTION_PROPOSED")
    return event.data["origin"]


@pytest.fixture
def calls(tmp_path, store_db):
    """A session call (allowed), a session call the policy denies, and a raw call without a session."""
    upstream = start_upstream(tmp_path)
    gateway = start_gateway(tmp_path, upstream.url, POLICY)
    try:
        _, allowed, denied = session_calls(gateway.url, ("refund", {"payment_id": "o1", "amount": 5}),
                                           ("refund", {"payment_id": "o2", "amount": 10**6}),
                                           client_name=HOSTILE_NAME, client_version="9" * 5000)
        raw = tools_call("refund", {"payment_id": "o3", "amount": 7})
        del raw["params"]["_meta"]["io.modelcontextprotocol/clientInfo"]
        status, answer = mcp_post(gateway.url, raw, headers={"user-agent": "probe/1.0 " + "x" * 3000})
        # The current revision names its client in each request's _meta (tools_call sends "raw-test").
        _, modern = mcp_post(gateway.url, tools_call("refund", {"payment_id": "o4", "amount": 8}))
    finally:
        gateway.stop()
        upstream.stop()
    assert allowed.meta["com.ctrlrun/receipt"]["result"] == "committed" and denied.error.code == -41001
    assert status == 200
    return {"allowed": allowed.meta["com.ctrlrun/receipt"], "denied": denied.error.data["action_id"],
            "raw": answer["result"]["_meta"]["com.ctrlrun/receipt"], "upstream": upstream.url,
            "modern": modern["result"]["_meta"]["com.ctrlrun/receipt"]["action_id"]}


def test_each_gateway_call_records_its_client_session_and_upstream_bounded_and_chained(calls):
    session = _origin_of(calls["allowed"]["action_id"])
    assert session["surface"] == "mcp-gateway"
    assert session["client"]["name"] == HOSTILE_NAME  # kept as sent (the console escapes it)
    assert session["client"]["version"] == "9" * 256 + "…"  # bounded
    assert isinstance(session["session_id"], str) and session["session_id"]
    assert session["upstream"] == {"alias": "pay", "url": calls["upstream"]}
    denied = _origin_of(calls["denied"])  # a refusal names where it came from too
    assert denied["session_id"] == session["session_id"] and denied["client"] == session["client"]
    raw = _origin_of(calls["raw"]["action_id"])
    assert raw["client"] is None and raw["session_id"] is None
    assert raw["user_agent"] == ("probe/1.0 " + "x" * 3000)[:256] + "…"
    assert _origin_of(calls["modern"])["client"] == {"name": "raw-test", "version": "1"}
    # The origin is in the event chain, which still verifies whole.
    assert any("intact" in line for line in run_command("receipts", "--verify-chain")), \
        run_command("receipts", "--verify-chain")
    assert all("origin" not in doc for doc in receipts())  # the receipt's schema is unchanged


def test_the_call_and_receipt_pages_name_the_gateway_client_escaped(calls):
    client = Client()
    client.force_login(make_user("auditor"))
    page = client.get(url("ctrlrun_call", calls["allowed"]["action_id"]))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'id="ctrlrun-call-origin"' in body and SHOWN_RLO in body and RLO not in body and "\x00" not in body
    assert "\\u0000" in body  # the NUL, shown as its escape
    shown = text(page)
    assert "Through the MCP gateway" in shown and "MCP clientInfo, as the client names itself" in shown
    assert _origin_of(calls["allowed"]["action_id"])["session_id"] in shown
    assert f"pay — {calls['upstream']}" in shown

    receipt = client.get(receipt_url(calls["allowed"]["receipt_id"]))
    assert receipt.status_code == 200
    assert "Through the MCP gateway" in text(receipt) and SHOWN_RLO in receipt.content.decode()

    raw = text(client.get(url("ctrlrun_call", calls["raw"]["action_id"])))
    assert "probe/1.0 " in raw and "User-Agent: the gateway did not see the session" in raw
    assert "none (a request without a session)" in raw
    assert "x" * 257 not in raw  # bounded


def test_a_call_not_through_the_gateway_shows_no_origin(store_db, refund, agent):
    refund(payment_id="plain", amount=10)
    (doc,) = receipts()
    client = Client()
    client.force_login(make_user("auditor"))
    assert 'id="ctrlrun-call-origin"' not in client.get(url("ctrlrun_call", doc["action_id"])).content.decode()
    assert "Through the MCP gateway" not in text(client.get(receipt_url(doc["receipt_id"])))


def test_an_origin_rewritten_afterwards_breaks_the_event_chain(calls):
    """The origin is evidence: an attacker who drops the guard and renames the client is named."""
    from django.db import connection

    from ctrlrun import store
    from ctrlrun.models import Event

    event = Event.objects.get(action_id=calls["allowed"]["action_id"], type="ACTION_PROPOSED")
    assert store.verify().ok
    forged = event.data | {"origin": event.data["origin"] | {"client": {"name": "trusted-ide", "version": "1"}}}
    with evidence_unguarded(), connection.cursor() as cursor:
        cursor.execute('UPDATE "ctrlrun_event" SET "data" = %s WHERE "id" = %s', [json.dumps(forged), event.id])
    report = store.verify()
    first = report.breaks[0]
    assert not report.ok and (first.name, first.kind, first.seq) == ("content_altered", "event", event.seq), first
