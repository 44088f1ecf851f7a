"""The application side of the resumption tests: one refund agent per framework, and the resumers
that continue their paused runs in another process (``ctrlrun resume_runs --import tests.resumable_agents``).

Each agent asks for one refund (``REFUND_ARGUMENTS``, in the approve band of the tests' policy). The
refund appends a line to ``$RESUME_LEDGER`` when it runs, so a test counts executions across
processes; each resumer appends what the model was told to ``$RESUME_SEEN`` (JSON lines). No
network: each framework's own test model.
"""
from __future__ import annotations

import json
import os
import sqlite3
from typing import Any

import ctrlrun
from ctrlrun.resumption import resumer

REFUND_ARGUMENTS = {"payment_id": "txn_500k", "amount": 500_000}


def refund(payment_id: str, amount: int) -> str:
    """Refund part of a payment."""
    with open(os.environ["RESUME_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(f"{os.getpid()} {payment_id} {amount}\n")
    return f"refunded {amount} on {payment_id}"


def saw(framework: str, answer: Any, text: str) -> None:
    with open(os.environ["RESUME_SEEN"], "a", encoding="utf-8") as seen:
        seen.write(json.dumps({"framework": framework, "answer": answer.status, "pid": os.getpid(),
                               "text": text}) + "\n")


def control() -> ctrlrun.Control:
    return ctrlrun.Control()


# --------------------------------------------------------------------------- OpenAI Agents SDK


def openai_agent(*, arguments: dict | None = None, then: str = "done") -> tuple[Any, Any, Any]:
    from agents import Agent, set_tracing_disabled
    from agents.testing import ScriptedModel, assistant_message, function_call

    from ctrlrun.adapters.openai_agents import guarded_tool

    set_tracing_disabled(True)
    tool = guarded_tool(control(), "stripe.refund", refund, principal="refund-agent")
    steps = [[function_call("refund", arguments, call_id="c1")]] if arguments is not None else []
    model = ScriptedModel([*steps, [assistant_message(then)]])
    return Agent(name="refunds", model=model, tools=[tool]), tool, model


@resumer("openai-refunds")
async def resume_openai(paused: Any, answer: Any) -> None:
    from agents import RunConfig

    from ctrlrun.adapters.openai_agents import resume

    agent, tool, model = openai_agent()
    await resume(paused, answer, agent, tool, run_config=RunConfig(tracing_disabled=True))
    outputs = [item.get("output") for item in model.last_call.input
               if isinstance(item, dict) and item.get("type") == "function_call_output"]
    saw("openai-agents", answer, str(outputs[-1]))


# --------------------------------------------------------------------------- LangChain / LangGraph


def langgraph_agent() -> Any:
    from langchain.agents import create_agent
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.checkpoint.sqlite import SqliteSaver

    from ctrlrun.adapters.langchain import CtrlrunMiddleware

    class RefundModel(BaseChatModel):
        """A scripted chat model: asks for the refund, then repeats what the tool said."""

        @property
        def _llm_type(self) -> str:
            return "scripted-refunds"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            said = [m for m in messages if isinstance(m, ToolMessage)]
            if said:
                reply = AIMessage(content=f"the tool said: {said[-1].content}")
            else:
                reply = AIMessage(content="", tool_calls=[{"name": "refund", "args": dict(REFUND_ARGUMENTS),
                                                           "id": "call_1", "type": "tool_call"}])
            return ChatResult(generations=[ChatGeneration(message=reply)])

    connection = sqlite3.connect(os.environ["RESUME_CHECKPOINTS"], check_same_thread=False)
    return create_agent(RefundModel(), tools=[tool(refund)], checkpointer=SqliteSaver(connection),
                        middleware=[CtrlrunMiddleware(control(), actions={"refund": "stripe.refund"},
                                                      principal="refund-agent")])


@resumer("langgraph-refunds")
def resume_langgraph(paused: Any, answer: Any) -> None:
    from ctrlrun.adapters.langchain import resume_run

    result = resume_run(paused, answer, langgraph_agent())
    saw("langgraph", answer, result["messages"][-1].content)


# --------------------------------------------------------------------------- Pydantic AI


def pydantic_agent(arguments: dict | None = None, *, many: int = 0) -> Any:
    from pydantic_ai import Agent, FunctionToolset
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.tools import DeferredToolRequests

    from ctrlrun.adapters.pydantic_ai import CtrlrunToolset

    def respond(messages: Any, info: Any) -> ModelResponse:
        returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returned:
            return ModelResponse(parts=[TextPart(f"the tool said: {returned[-1].content}")])
        if many:
            return ModelResponse(parts=[ToolCallPart("refund", {"payment_id": f"txn_{n}", "amount": 300_000},
                                                     tool_call_id=f"call_{n}") for n in range(many)])
        return ModelResponse(parts=[ToolCallPart("refund", dict(arguments or REFUND_ARGUMENTS), tool_call_id="call_1")])

    tools = CtrlrunToolset(FunctionToolset([refund]), control(), actions={"refund": "stripe.refund"},
                           principal="refund-agent")
    agent = Agent(FunctionModel(respond), toolsets=[tools], output_type=[str, DeferredToolRequests])
    agent.ctrlrun_toolset = tools  # type: ignore[attr-defined]  (the tests look at its map)
    return agent


@resumer("pydantic-refunds")
def resume_pydantic(paused: Any, answer: Any) -> None:
    from ctrlrun.adapters.pydantic_ai import resume_options

    result = pydantic_agent().run_sync(**resume_options(paused, answer))
    saw("pydantic-ai", answer, str(result.output))


# --------------------------------------------------------------------------- a resumer that blocks (then is killed)


def _block() -> None:
    """Say so in ``$RESUME_BLOCKED`` (this process's id), then hang, as a stuck resumer does."""
    import time

    with open(os.environ["RESUME_BLOCKED"], "w", encoding="utf-8") as marker:
        marker.write(str(os.getpid()))
    time.sleep(600)


@resumer("blocking-refunds")
def resume_blocking(paused: Any, answer: Any) -> None:
    """The Pydantic AI resumer, hanging before (``RESUME_BLOCK=before``) or after (``after``) it ran."""
    block = os.environ.get("RESUME_BLOCK")
    if block == "before":
        _block()
    resume_pydantic(paused, answer)
    if block == "after":
        _block()
