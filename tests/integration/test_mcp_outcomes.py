"""The MCP outcome table (§E2) against a deliberately misbehaving upstream (a raw HTTP server on
loopback) and a port where nothing listens; and 16 client processes racing the same keys through
the gateway to an SDK-built upstream (each key executed once)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support import (
    Misbehaving,
    executions,
    free_port,
    mcp_post,
    receipts,
    start_gateway,
    start_upstream,
    tools_call,
)

pytestmark = pytest.mark.slow

TOOLS = ("drop", "is_error", "is_error_not_run", "rpc_invalid_params", "rpc_internal", "http_500", "http_401", "sse",
         "huge", "no_result_type", "plain")


def policy(alias: str) -> str:
    lines = ["schema: ctrlrun.policy/v2", "actions:"]
    for tool in TOOLS:
        lines += [f"  mcp.{alias}.{tool}:", f'    effect: "{tool}:{{key}}"', "    decision: allow"]
        if tool == "is_error_not_run":
            lines += ["    mcp: { not_executed_on_error: true }"]
    return "\n".join(lines) + "\n"


@pytest.fixture
def bad():
    server = Misbehaving()
    yield server
    server.close()


def result_of(tool: str) -> str:
    return next(r["result"] for r in receipts() if r["action"].endswith("." + tool))


def test_each_upstream_answer_records_what_the_table_says(tmp_path, store_db, bad):
    gateway = start_gateway(tmp_path, bad.url, policy("bad"), "--max-response-bytes", str(1024 * 1024), alias="bad")
    try:
        answers = {tool: mcp_post(gateway.url, tools_call(tool, {"key": "k1"})) for tool in TOOLS}
        retry = mcp_post(gateway.url, tools_call("drop", {"key": "k1"}))
    finally:
        gateway.stop()
    expected = {
        # tool: (HTTP status, JSON-RPC error code or None for a result, recorded result)
        "drop": (502, -41010, "ambiguous"),
        "is_error": (200, None, "ambiguous"),
        "is_error_not_run": (200, None, "failed"),
        "rpc_invalid_params": (200, -32602, "failed"),
        "rpc_internal": (200, -32603, "ambiguous"),
        "http_500": (502, -41010, "ambiguous"),
        "http_401": (401, -32001, "failed"),
        "sse": (200, None, "committed"),
        "huge": (502, -41010, "ambiguous"),
        "no_result_type": (200, None, "ambiguous"),
        "plain": (200, None, "committed"),
    }
    for tool, (status, code, result) in expected.items():
        got_status, body = answers[tool]
        assert got_status == status, (tool, body)
        assert (body.get("error") or {}).get("code") == code, (tool, body)
        assert result_of(tool) == result, tool
        stamp = (body.get("result") or body["error"].get("data") or {}).get("_meta", {}).get("com.ctrlrun/receipt")
        assert stamp is not None and stamp["result"] == result, (tool, body)  # it reached the upstream
    assert answers["is_error"][1]["result"]["isError"] is True  # the upstream's answer, relayed
    assert retry[0] == 409 and retry[1]["error"]["code"] == -41005  # the dropped reply holds its key
    assert bad.calls.count("drop") == 1


def test_a_refused_connection_records_not_executed(tmp_path, store_db):
    gateway = start_gateway(tmp_path, f"http://127.0.0.1:{free_port()}/mcp", policy("bad"), alias="bad")
    try:
        status, body = mcp_post(gateway.url, tools_call("plain", {"key": "k2"}))
        again = mcp_post(gateway.url, tools_call("plain", {"key": "k2"}))
    finally:
        gateway.stop()
    assert (status, body["error"]["code"], body["error"]["data"]["error"]) == (
        502, -41011, "ctrlrun.upstream_not_executed")
    assert result_of("plain") == "failed"
    assert again[1]["error"]["code"] == -41011  # failed frees the key: the retry is tried, and refused again


RACER = textwrap.dedent("""
    import asyncio, json, sys
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    async def main(url, keys):
        seen = []
        async with Client(url) as client:
            for key in keys:
                try:
                    result = await client.call_tool("refund", {"payment_id": key, "amount": 7})
                    seen.append([key, result.meta["com.ctrlrun/receipt"]["result"]])
                except MCPError as exc:
                    seen.append([key, exc.error.code])
        print(json.dumps(seen))

    asyncio.run(main(sys.argv[1], sys.argv[2:]))
""")


#: Each racing client's calls, over as many keys.
CALLS = 200


def test_16_clients_racing_the_same_keys_execute_each_key_once(tmp_path, store_db):
    """16 clients x 200 calls through one gateway, on the same 200 keys: each key runs once."""
    upstream = start_upstream(tmp_path)
    gateway = start_gateway(tmp_path, upstream.url, 'schema: ctrlrun.policy/v2\nactions:\n  mcp.pay.refund:\n'
                            '    effect: "refund:{payment_id}"\n    decision: allow\n')
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    keys = [f"race-{n}" for n in range(CALLS)]
    try:  # four groups of four clients in lockstep on the same keys, each group from another start
        procs = [subprocess.Popen([sys.executable, str(script), gateway.url,
                                   *(keys[(n % 4) * 50:] + keys[:(n % 4) * 50])],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(16)]
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        gateway.stop()
        upstream.stop()
    import json

    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    seen = [answer for out, _ in outputs for answer in json.loads(out)]
    assert len(seen) == 16 * CALLS
    for key in keys:
        answers = [a for k, a in seen if k == key]
        assert answers.count("committed") == 1, (key, answers)
        assert set(answers) <= {"committed", -41004}, (key, answers)
    ran = executions(upstream)
    assert sorted(ran) == sorted(f"refund {key} 7" for key in keys)
