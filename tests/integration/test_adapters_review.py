"""Attacks on the framework adapters from an independent review (each failed before its fix):
arguments decided on as the tool runs them, framework control flow that is not an outcome, a store
failure after the tool ran never reported as "did not run"."""
from __future__ import annotations

import asyncio
import uuid

import pytest

import ctrlrun
from ctrlrun import store

pytestmark = pytest.mark.usefixtures("store_db")

# A policy written as a deny-list: "big refunds need a person, everything else is fine".
DENYLIST_POLICY = """\
schema: ctrlrun.policy/v2

actions:
  refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_gt: 50000 }
        decision: approve
      - decision: allow
"""


# --------------------------------------------------------------------------- OpenAI Agents SDK

def test_openai_a_store_failure_after_the_tool_ran_is_not_called_a_refusal(monkeypatch):
    """StoreUnavailable after the tool ran is raised, never handed to the model as 'the tool did not run'."""
    from agents import Agent, RunConfig, Runner
    from agents.testing import ScriptedModel, assistant_message, function_call

    from ctrlrun.adapters.openai_agents import guarded_tool

    ran = []

    def refund(payment_id: str, amount: int) -> str:
        """Refund."""
        ran.append(payment_id)
        return "refunded"

    control = ctrlrun.Control()
    tool = guarded_tool(control, "stripe.refund", refund, principal="a")

    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(store, "record_outcome", broken)
    model = ScriptedModel([[function_call(tool.name, {"payment_id": "t1", "amount": 10}, call_id="c1")],
                           [assistant_message("done")]])
    with pytest.raises(Exception, match="ran, but its outcome could not be recorded"):
        asyncio.run(Runner.run(Agent(name="x", model=model, tools=[tool]), "go",
                               run_config=RunConfig(tracing_disabled=True)))
    assert ran == ["t1"]  # it ran: the run fails loudly rather than telling the model it did not


# --------------------------------------------------------------------------- LangChain

def _lc_agent(tool_fn, turns, policy_control):
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from ctrlrun.adapters.langchain import CtrlrunMiddleware

    class Scripted(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self

    msgs = [AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"call_{uuid.uuid4().hex[:6]}",
                                               "type": "tool_call"}]) for n, a in turns]
    model = Scripted(messages=iter([*msgs, AIMessage(content="done")]))
    return create_agent(model, tools=[tool_fn], checkpointer=InMemorySaver(),
                        middleware=[CtrlrunMiddleware(policy_control, principal="a")])


def test_langchain_decides_on_the_arguments_the_tool_runs(use_policy):
    """The policy sees the arguments as the tool coerces them: a model's amount "900000" is 900000,
    so it needs a person, and nothing runs without one."""
    from langchain_core.tools import tool

    use_policy(DENYLIST_POLICY)
    ran = []

    @tool
    def refund(payment_id: str, amount: int) -> str:
        """Refund."""
        ran.append(amount)
        return "refunded"

    graph = _lc_agent(refund, [("refund", {"payment_id": "t1", "amount": "900000"})], ctrlrun.Control())
    graph.invoke({"messages": [("user", "refund")]}, {"configurable": {"thread_id": "t"}})
    assert ran == [], "a 900000 refund ran in the approve band without any person"


def test_langchain_invalid_arguments_are_refused_before_anything_is_recorded(use_policy):
    """Arguments the tool's schema refuses are refused before ctrlrun records anything, so the model's
    corrected call runs (once)."""
    from langchain_core.tools import tool

    use_policy(DENYLIST_POLICY)
    ran = []

    @tool
    def refund(payment_id: str, amount: int, reason: str) -> str:
        """Refund."""
        ran.append(amount)
        return "refunded"

    graph = _lc_agent(refund, [("refund", {"payment_id": "t2", "amount": 10}),  # 'reason' missing
                               ("refund", {"payment_id": "t2", "amount": 10, "reason": "dup"})], ctrlrun.Control())
    out = graph.invoke({"messages": [("user", "refund")]}, {"configurable": {"thread_id": "t2"}})
    assert ran == [10], [m.content for m in out["messages"] if m.type == "tool"]


# --------------------------------------------------------------------------- Pydantic AI

def test_pydantic_model_retry_leaves_the_key_free(use_policy):
    """A tool raising ModelRetry (Pydantic AI's 'try again') is recorded not executed: the model's
    corrected call runs, instead of meeting an ambiguous record."""
    from pydantic_ai import Agent, FunctionToolset, ModelRetry
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from ctrlrun.adapters.pydantic_ai import CtrlrunToolset

    use_policy(DENYLIST_POLICY)
    ran = []

    def refund(payment_id: str, amount: int) -> str:
        if amount <= 0:
            raise ModelRetry("amount must be positive")
        ran.append(amount)
        return "refunded"

    calls = [{"payment_id": "t3", "amount": 0}, {"payment_id": "t3", "amount": 5}]

    def respond(messages, info):
        made = sum(isinstance(p, ToolCallPart) for m in messages if isinstance(m, ModelResponse) for p in m.parts)
        if made < len(calls):
            return ModelResponse(parts=[ToolCallPart("refund", calls[made], tool_call_id=f"c{made}")])
        return ModelResponse(parts=[TextPart("done")])

    toolset = CtrlrunToolset(FunctionToolset([refund]), ctrlrun.Control(), principal="a")
    result = Agent(FunctionModel(respond), toolsets=[toolset]).run_sync("go")
    assert ran == [5], [str(p) for m in result.all_messages() for p in m.parts]


def test_langchain_a_tool_that_interrupts_itself_runs_again_on_resume(use_policy):
    """A tool calling LangGraph's interrupt() itself pauses the run (recorded not executed); on resume
    it runs again from its start, and its effect is committed once."""
    from langchain_core.tools import tool
    from langgraph.types import Command, interrupt

    use_policy(DENYLIST_POLICY)
    ran = []

    @tool
    def refund(payment_id: str, amount: int) -> str:
        """Refund."""
        answer = interrupt("confirm the bank account?")
        ran.append((amount, answer))
        return "refunded"

    graph = _lc_agent(refund, [("refund", {"payment_id": "t4", "amount": 10})], ctrlrun.Control())
    config = {"configurable": {"thread_id": "t4"}}
    first = graph.invoke({"messages": [("user", "refund")]}, config)
    assert "__interrupt__" in first
    out = graph.invoke(Command(resume="yes"), config)
    assert ran == [(10, "yes")], [m.content for m in out["messages"] if m.type == "tool"]
