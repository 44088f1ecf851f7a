"""Paused framework runs (``ctrlrun.resumption``): pausing, resuming, reading the ledger."""
from __future__ import annotations

import json
import os
import subprocess
import sys



from .base import script_environment
from .policies import REFUND_POLICY



# --------------------------------------------------------------------------- paused framework runs (resumption)

FRAMEWORKS = ["openai-agents", "langgraph", "pydantic-ai"]


def ledger(files) -> list[str]:
    """The lines the resumable agents' refund appended, once per run (``files``: the ``files`` fixture)."""
    path = files["RESUME_LEDGER"]
    return path.read_text().splitlines() if path.exists() else []


def seen(files) -> list[dict]:
    """What the resumable agents' model was told, one document per turn."""
    path = files["RESUME_SEEN"]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def pause(framework: str, arguments: dict | None = None, thread: str = "t-1") -> str:
    """Run the framework's agent in THIS process until it pauses on the refund; store the paused run."""
    import asyncio

    from ctrlrun import store
    from tests import resumable_agents as app

    arguments = dict(arguments or app.REFUND_ARGUMENTS)
    if framework == "openai-agents":
        from agents import RunConfig, Runner

        from ctrlrun.adapters.openai_agents import pause as pause_run

        agent, tool, _ = app.openai_agent(arguments=arguments)
        result = asyncio.run(Runner.run(agent, "refund it", run_config=RunConfig(tracing_disabled=True)))
        paused = pause_run(result, tool, resume_with="openai-refunds")
    elif framework == "langgraph":
        from ctrlrun.adapters.langchain import pause as pause_run

        config = {"configurable": {"thread_id": thread}}
        result = app.langgraph_agent().invoke({"messages": [("user", "refund it")]}, config)
        paused = pause_run(result, config, resume_with="langgraph-refunds")
    else:
        from ctrlrun.adapters.pydantic_ai import pause as pause_run

        result = app.pydantic_agent(arguments).run_sync("refund it")
        paused = pause_run(result, resume_with="pydantic-refunds")
    assert paused.status == "pending" and paused.framework == framework
    approval = store.get_approval(paused.approval_id)
    assert approval.status == "pending" and approval.arguments == arguments
    return paused.approval_id


def resume_runs(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``ctrlrun resume_runs --once`` in another OS process, on the test store."""
    env = script_environment(tmp_path, REFUND_POLICY)
    env.update({k: v for k, v in os.environ.items() if k.startswith("RESUME_")})
    return subprocess.run([sys.executable, "-m", "ctrlrun", "resume_runs", "--once", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)


def paused_row(approval_id: str):
    """The ``PausedRun`` row of the run paused on ``approval_id``."""
    from ctrlrun.models import PausedRun

    return PausedRun.objects.get(approval_id=approval_id)


def each_dict(node):
    """Every dict inside a JSON document, depth first."""
    if isinstance(node, dict):
        yield node
        node = list(node.values())
    if isinstance(node, list):
        for value in node:
            yield from each_dict(value)


def tamper(state_json: str, call_id: str, arguments: dict) -> str:
    """An OpenAI Agents paused run's JSON with one tool call's arguments changed, consistently (the SDK's
    invocation fingerprint is an unkeyed hash: whoever can edit the state can recompute it)."""
    from agents._tool_invocation import tool_invocation_identity_and_scope

    state = json.loads(state_json)
    encoded = json.dumps(arguments, separators=(",", ":"))
    raw = {"type": "function_call", "call_id": call_id, "name": "refund", "arguments": encoded, "id": call_id}
    _, _, scope, fingerprint = tool_invocation_identity_and_scope(raw)
    for node in list(each_dict(state)):
        if node.get("call_id") == call_id and "arguments" in node:
            node["arguments"] = encoded
        record = node.get(call_id)
        if isinstance(record, dict) and "fingerprint" in record:
            assert record["approval_scope"] == scope
            record["fingerprint"] = fingerprint
    return json.dumps(state)
