"""MCP elicitation through the gateway (§E2, §A5): an upstream's ``input_required`` with a
``requestState`` suspends the call (its key held), and the client's answer carrying the gateway's
continuation resumes the same action. Against the misbehaving upstream (a raw HTTP server on
loopback) and an SDK-built one driven by the SDK's own client; the gateway is its own OS process.

The attacks: a replayed, unknown, forged or tampered continuation, a continuation spent on another
call, a fresh call on the held key, two processes resuming one continuation at once, a ninth
round, ``input_required`` without a ``requestState``, and continuation legs that would claim
``failed``.
"""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import subprocess
import sys
import textwrap

import pytest

from ctrlrun.gateway.elicitation import PREFIX, issue
from ctrlrun.models import Continuation, EffectRecord, Event
from tests.support import (
    Misbehaving,
    executions,
    mcp_post,
    receipts,
    run_command,
    start_gateway,
    start_upstream,
    tools_call,
)

pytestmark = pytest.mark.slow

TOOLS = ("elicit", "elicit_no_state", "elicit_then_drop", "elicit_then_refuse")
POLICY = "schema: ctrlrun.policy/v2\nactions:\n" + "".join(
    f'  mcp.bad.{tool}:\n    effect: "{tool}:{{key}}"\n    decision: allow\n' for tool in TOOLS) + (
    '  mcp.bad.elicit_gated:\n    effect: "elicit_gated:{key}"\n    decision: approve\n')


@pytest.fixture
def bad():
    server = Misbehaving()
    yield server
    server.close()


@pytest.fixture
def gateway(tmp_path, store_db, bad):
    proc = start_gateway(tmp_path, bad.url, POLICY, alias="bad")
    yield proc
    proc.stop()


def answering(tool: str, arguments: dict, token: str, answers: dict | None = None, request_id: int = 2) -> dict:
    """The client's continuation leg: the same call with the gateway's requestState and its answers."""
    body = tools_call(tool, arguments, request_id)
    body["params"]["requestState"] = token
    body["params"]["inputResponses"] = answers or {}
    return body


def stamp(body: dict) -> dict:
    return (body.get("result") or body.get("error", {}).get("data") or {}).get("_meta", {}).get("com.ctrlrun/receipt")


def receipts_of(tool: str) -> list[dict]:
    return [r for r in receipts() if r["action"] == f"mcp.bad.{tool}"]


def test_a_two_round_elicitation_commits_one_action_once(gateway, bad):
    arguments = {"key": "k1", "rounds": 2}
    first = mcp_post(gateway.url, tools_call("elicit", arguments))
    held = mcp_post(gateway.url, tools_call("elicit", arguments, 9))  # a fresh identical call meanwhile
    assert first[0] == 200, first
    result = first[1]["result"]
    assert result["resultType"] == "input_required"
    assert result["inputRequests"]["q1"]["method"] == "elicitation/create"  # the upstream's question, relayed
    token1 = result["requestState"]
    assert token1.startswith(PREFIX) and "up-1" not in token1  # the gateway's continuation, not the upstream's
    suspended = stamp(first[1])
    assert suspended["result"] == "suspended" and suspended["round"] == 1 and suspended["receipt_id"] is None
    assert suspended["effect_key"] == "elicit:k1"
    assert held[0] == 409 and held[1]["error"]["code"] == -41004
    assert held[1]["error"]["data"]["state"] == "in_progress"  # the key stays held while the client answers
    assert EffectRecord.objects.get(pk="elicit:k1").state == "executing"
    assert [r for r in receipts() if r["action_id"] == suspended["action_id"]] == []  # no outcome yet

    second = mcp_post(gateway.url, answering("elicit", arguments, token1, {"q1": {"action": "accept",
                                                                                   "content": {"ok": True}}}))
    assert second[0] == 200, second
    token2 = second[1]["result"]["requestState"]
    assert token2.startswith(PREFIX) and token2 != token1
    assert stamp(second[1])["round"] == 2 and stamp(second[1])["action_id"] == suspended["action_id"]
    assert bad.seen[-1]["requestState"] == "up-1"  # the upstream got its own state back ...
    assert bad.seen[-1]["inputResponses"] == {"q1": {"action": "accept", "content": {"ok": True}}}  # ... and the answer

    third = mcp_post(gateway.url, answering("elicit", arguments, token2, {"q2": {"action": "accept",
                                                                                  "content": {"ok": False}}}))
    assert third[0] == 200, third
    done = json.loads(third[1]["result"]["content"][0]["text"])
    assert done == {"state": "up-2", "answers": {"q2": {"action": "accept", "content": {"ok": False}}}}
    committed = stamp(third[1])
    assert committed["result"] == "committed" and committed["action_id"] == suspended["action_id"]
    assert committed["attempt"] == 1 and committed["receipt_id"]
    [receipt] = [r for r in receipts() if r["action_id"] == suspended["action_id"]]
    assert receipt["result"] == "committed" and receipt["effect_key"] == "elicit:k1"
    kinds = [e.type for e in Event.objects.filter(action_id=suspended["action_id"]).order_by("id")]
    assert kinds.count("EXECUTION_SUSPENDED") == 2 and kinds.count("EXECUTION_RESUMED") == 2
    assert kinds[-1] == "EXECUTION_COMMITTED"

    for token in (token1, token2):  # a continuation resumes once
        replay = mcp_post(gateway.url, answering("elicit", arguments, token))
        assert replay[0] == 400 and replay[1]["error"]["code"] == -41009, replay
        assert replay[1]["error"]["data"]["error"] == "ctrlrun.unknown_continuation"
    again = mcp_post(gateway.url, tools_call("elicit", arguments))
    assert again[0] == 409 and again[1]["error"]["data"]["state"] == "committed"
    assert bad.calls.count("elicit") == 3  # three legs reached the upstream; the refusals did not
    assert [r["result"] for r in receipts_of("elicit")].count("committed") == 1


def test_an_approved_call_that_asks_for_input_is_approved_once_and_commits(gateway, bad):
    arguments = {"key": "k9"}
    waiting = mcp_post(gateway.url, tools_call("elicit_gated", arguments))
    assert waiting[0] == 403 and waiting[1]["error"]["code"] == -41002, waiting
    run_command("approve", waiting[1]["error"]["data"]["request_id"], "--by", "ana")
    asked = mcp_post(gateway.url, tools_call("elicit_gated", arguments))  # re-sent: the approval is presented
    assert asked[0] == 200 and stamp(asked[1])["result"] == "suspended", asked
    done = mcp_post(gateway.url, answering("elicit_gated", arguments, asked[1]["result"]["requestState"]))
    assert done[0] == 200 and stamp(done[1])["result"] == "committed", done  # no second approval asked for
    again = mcp_post(gateway.url, tools_call("elicit_gated", arguments))
    assert again[0] == 409 and again[1]["error"]["data"]["state"] == "committed", again
    assert bad.calls.count("elicit_gated") == 2
    [receipt] = [r for r in receipts() if r["action_id"] == stamp(done[1])["action_id"]]
    assert receipt["result"] == "committed"


def test_unknown_forged_tampered_and_foreign_continuations_are_refused(gateway, bad):
    arguments = {"key": "k2", "rounds": 1}
    status, body = mcp_post(gateway.url, tools_call("elicit", arguments))
    assert status == 200, body
    token = body["result"]["requestState"]
    nonce, payload = token[len(PREFIX):].split(".")
    decoded = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    tampered = PREFIX + nonce + "." + base64.urlsafe_b64encode(json.dumps(
        {**decoded, "s": "up-7"}).encode()).decode().rstrip("=")
    refused = {
        "unknown": answering("elicit", arguments, "not-a-continuation"),
        "the upstream's own state": answering("elicit", arguments, "up-1"),
        "forged": answering("elicit", arguments, issue(decoded["h"], 1, "up-1")),  # the right shape, never issued
        "tampered": answering("elicit", arguments, tampered),  # the upstream's state edited inside the token
        "other arguments": answering("elicit", {"key": "k2", "rounds": 1, "extra": 1}, token),
        "another tool": answering("elicit_then_drop", arguments, token),
        "not a string": answering("elicit", arguments, 17),
    }
    for what, call in refused.items():
        got = mcp_post(gateway.url, call)
        assert got[0] == 400 and got[1]["error"]["code"] == -41009, (what, got)
        assert got[1]["error"]["data"]["error"] == "ctrlrun.unknown_continuation", what
    assert bad.calls.count("elicit") == 1 and "elicit_then_drop" not in bad.calls  # nothing was forwarded
    finished = mcp_post(gateway.url, answering("elicit", arguments, token))  # the refusals spent nothing
    assert finished[0] == 200 and stamp(finished[1])["result"] == "committed", finished
    assert bad.seen[-1]["requestState"] == "up-1"


RESUMER = textwrap.dedent("""
    import json, sys
    import httpx
    body = json.loads(sys.argv[2])
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call", "mcp-name": body["params"]["name"]}
    answer = httpx.post(sys.argv[1], content=json.dumps(body), headers=headers, timeout=120)
    print(json.dumps([answer.status_code, answer.json()]))
""")


def test_two_processes_answering_one_continuation_resume_it_once(gateway, bad, tmp_path):
    arguments = {"key": "k3", "rounds": 1}
    status, body = mcp_post(gateway.url, tools_call("elicit", arguments))
    assert status == 200, body
    script = tmp_path / "resumer.py"
    script.write_text(RESUMER)
    call = json.dumps(answering("elicit", arguments, body["result"]["requestState"]))
    procs = [subprocess.Popen([sys.executable, str(script), gateway.url, call], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    answers = sorted(json.loads(out)[0] for out, _ in outputs)
    assert answers == [200, 400]
    refused = next(json.loads(out)[1] for out, _ in outputs if json.loads(out)[0] == 400)
    assert refused["error"]["code"] == -41009
    assert bad.calls.count("elicit") == 2  # the first leg and one continuation leg
    assert [r["result"] for r in receipts_of("elicit")] == ["committed"]


def test_a_ninth_input_required_is_recorded_ambiguous(gateway, bad):
    arguments = {"key": "k4", "rounds": 100}
    status, body = mcp_post(gateway.url, tools_call("elicit", arguments))
    for round_ in range(1, 9):
        assert status == 200 and stamp(body)["round"] == round_, (round_, body)
        status, body = mcp_post(gateway.url, answering("elicit", arguments, body["result"]["requestState"]))
    assert status == 502, body
    error = body["error"]
    assert error["code"] == -41010 and error["data"]["error"] == "ctrlrun.upstream_ambiguous"
    assert error["data"]["reason"] == "max_elicitation_rounds" and "9th" in error["message"]
    assert error["data"]["_meta"]["com.ctrlrun/receipt"]["result"] == "ambiguous"
    assert bad.calls.count("elicit") == 9
    [receipt] = receipts_of("elicit")
    assert receipt["result"] == "ambiguous" and "max_elicitation_rounds is 8" in receipt["error"]
    assert EffectRecord.objects.get(pk="elicit:k4").state == "ambiguous"
    retry = mcp_post(gateway.url, tools_call("elicit", arguments))
    assert retry[0] == 409 and retry[1]["error"]["code"] == -41005  # a person or a reconcile hook says what ran


def test_the_elicitation_bounds_are_flags(tmp_path, store_db, bad):
    proc = start_gateway(tmp_path, bad.url, POLICY, "--max-elicitation-rounds", "1", "--elicitation-timeout", "3600",
                         alias="bad")
    try:
        banner = [proc.proc.stdout.readline()]
        while banner[-1] and not banner[-1].startswith("actions:"):  # up to its actions line (or its end)
            banner.append(proc.proc.stdout.readline())
        arguments = {"key": "k5", "rounds": 2}
        first = mcp_post(proc.url, tools_call("elicit", arguments))
        held = Continuation.objects.get(pk="elicit:k5")
        second = mcp_post(proc.url, answering("elicit", arguments, first[1]["result"]["requestState"]))
    finally:
        proc.stop()
    assert any("keeps its key 3600 s for the answer, at most 1 rounds" in line for line in banner), banner
    assert first[0] == 200 and stamp(first[1])["result"] == "suspended"
    assert held.held_until - held.updated_at == dt.timedelta(seconds=3600)  # the suspension lasts the timeout
    assert second[0] == 502 and second[1]["error"]["data"]["reason"] == "max_elicitation_rounds"
    assert "2nd time" in second[1]["error"]["message"]


def test_input_required_without_a_request_state_is_upstream_ambiguous(gateway, bad):
    status, body = mcp_post(gateway.url, tools_call("elicit_no_state", {"key": "k6"}))
    assert status == 502 and body["error"]["code"] == -41010, body
    assert stamp(body)["result"] == "ambiguous"
    assert [r["result"] for r in receipts_of("elicit_no_state")] == ["ambiguous"]
    retry = mcp_post(gateway.url, tools_call("elicit_no_state", {"key": "k6"}))
    assert retry[1]["error"]["code"] == -41005


def test_no_continuation_leg_claims_failed(gateway, bad):
    """A dropped socket is ambiguous anyway; a pre-dispatch -32602, ``failed`` on a first leg, is
    ``ambiguous`` on a continuation leg: the first leg reached the upstream."""
    answers = {}
    for tool in ("elicit_then_drop", "elicit_then_refuse"):
        first = mcp_post(gateway.url, tools_call(tool, {"key": "k7"}))
        assert first[0] == 200 and stamp(first[1])["result"] == "suspended", first
        answers[tool] = mcp_post(gateway.url, answering(tool, {"key": "k7"}, first[1]["result"]["requestState"]))
    dropped, refused = answers["elicit_then_drop"], answers["elicit_then_refuse"]
    assert dropped[0] == 502 and dropped[1]["error"]["code"] == -41010, dropped
    assert refused[0] == 200 and refused[1]["error"]["code"] == -32602, refused  # the upstream's error, relayed
    for tool, (_, body) in answers.items():
        assert stamp(body)["result"] == "ambiguous", (tool, body)
        assert [r["result"] for r in receipts_of(tool)] == ["ambiguous"], tool
    assert "continuation leg" in receipts_of("elicit_then_refuse")[0]["error"]


SDK_POLICY = ('schema: ctrlrun.policy/v2\nactions:\n  mcp.pay.confirmed_refund:\n    effect: "refund:{payment_id}"\n'
              '    decision: allow\n')


def test_the_sdk_client_answers_an_sdk_servers_questions_through_the_gateway(tmp_path, store_db):
    from mcp import Client
    from mcp_types import ElicitResult

    upstream = start_upstream(tmp_path, variant="elicit")
    gateway = start_gateway(tmp_path, upstream.url, SDK_POLICY)
    asked = []

    async def answer(context, params):
        asked.append(params.message)
        if params.message == "Why?":
            return ElicitResult(action="accept", content={"reason": "double charge"})
        return ElicitResult(action="accept", content={"ok": True})

    async def run():
        async with Client(gateway.url, elicitation_callback=answer) as client:
            return await client.call_tool("confirmed_refund", {"payment_id": "pay_9", "amount": 300})

    try:
        result = asyncio.run(run())
    finally:
        gateway.stop()
        upstream.stop()
    assert asked == ["Refund 300 on pay_9?", "Why?"]
    assert result.content[0].text == "refunded 300 on pay_9 (double charge)"
    assert result.meta["com.ctrlrun/receipt"]["result"] == "committed"
    assert executions(upstream) == ["confirmed_refund pay_9 300 True double charge"]
    [receipt] = [r for r in receipts() if r["action"] == "mcp.pay.confirmed_refund"]
    assert receipt["result"] == "committed" and receipt["effect_key"] == "refund:pay_9"
