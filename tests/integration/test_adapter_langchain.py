"""The LangChain v1 / LangGraph adapter: each known bypass class replayed against the real packages.

The agent is ``langchain.agents.create_agent`` driven by LangChain's own fake chat model (a script of
AIMessages with tool calls: no network, no API key), paused and resumed with LangGraph's
``InMemorySaver``. Every test counts how often the tool's body really ran.
"""
from __future__ import annotations

import asyncio
import json
import uuid

import pytest

pytest.importorskip("langchain.agents")

from langchain.agents import create_agent  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

import ctrlrun  # noqa: E402
from ctrlrun import store  # noqa: E402
from ctrlrun.adapters.langchain import PAYLOAD_KIND, CtrlrunMiddleware, guard_tool, resume  # noqa: E402
from tests.support import policy_text, receipts  # noqa: E402

pytestmark = pytest.mark.usefixtures("store_db")

#: A policy written as a deny-list: "big refunds need a person, everything else is fine".
DENYLIST_POLICY = policy_text("denylist")

ACTIONS = {"refund": "stripe.refund", "send_email": "email.send"}


class ScriptedChatModel(GenericFakeChatModel):
    """GenericFakeChatModel answers from its script; binding tools changes nothing."""

    def bind_tools(self, tools, **kwargs):
        return self


def script(*calls: list[tuple[str, dict]]) -> ScriptedChatModel:
    """One AIMessage per turn of tool calls, then a final text answer."""
    turns = [AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": f"call_{uuid.uuid4().hex[:8]}",
                                                  "type": "tool_call"} for n, a in turn]) for turn in calls]
    return ScriptedChatModel(messages=iter([*turns, AIMessage(content="done")]))


@pytest.fixture
def ran():
    return []


@pytest.fixture
def tools(ran):
    @tool
    def refund(payment_id: str, amount: int) -> str:
        """Refund a payment."""
        ran.append(("refund", payment_id, amount))
        return f"refunded {amount} on {payment_id}"

    @tool
    async def send_email(msg_id: str, to: str) -> str:
        """Send an email."""
        await asyncio.sleep(0)
        ran.append(("send_email", msg_id))
        return f"sent {msg_id}"

    return [refund, send_email]


def agent(tools, *turns):
    control = ctrlrun.Control()
    return create_agent(script(*turns), tools=tools,
                        middleware=[CtrlrunMiddleware(control, actions=ACTIONS, principal="support-agent")],
                        checkpointer=InMemorySaver())


def thread() -> dict:
    return {"configurable": {"thread_id": uuid.uuid4().hex}}


def tool_messages(result) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]


def paused_on(result) -> dict:
    (pause,) = result["__interrupt__"]
    assert pause.value["kind"] == PAYLOAD_KIND
    return pause.value


def paused_refund(tools, payment_id: str, amount: int = 200_000):
    """An agent paused on one refund in the approve band: (graph, config, the ctrlrun request id)."""
    graph, config = agent(tools, [("refund", {"payment_id": payment_id, "amount": amount})]), thread()
    request_id = paused_on(graph.invoke({"messages": [("user", "refund")]}, config))["ctrlrun_request_id"]
    return graph, config, request_id


def test_an_allowed_call_runs_once_and_leaves_a_committed_receipt(tools, ran):
    """An allowed tool call runs once through ctrlrun: a committed receipt for stripe.refund."""
    result = agent(tools, [("refund", {"payment_id": "txn_1", "amount": 500})]).invoke(
        {"messages": [("user", "refund txn_1")]}, thread())
    assert ran == [("refund", "txn_1", 500)]
    assert tool_messages(result)[0].content == "refunded 500 on txn_1"
    (receipt,) = receipts()
    assert (receipt["action"], receipt["result"], receipt["effect_key"]) == ("stripe.refund", "committed", "refund:txn_1")
    assert receipt["principal"]["agent"] == "support-agent"


def test_a_policy_denial_never_reaches_the_tool_and_the_model_reads_why(tools, ran):
    """A denied call never runs; the model gets an error ToolMessage naming ActionDenied."""
    result = agent(tools, [("refund", {"payment_id": "txn_2", "amount": 5_000_000})]).invoke(
        {"messages": [("user", "refund txn_2")]}, thread())
    assert ran == []
    (message,) = tool_messages(result)
    assert message.status == "error" and "ActionDenied" in message.content and "did not run" in message.content
    assert result["messages"][-1].content == "done"  # the run went on: no crash
    assert [r["decision"] for r in receipts()] == ["deny"]


def test_the_approve_band_pauses_with_the_ctrlrun_request_and_its_hash(tools, ran):
    """The approve band interrupts with the request id, its action hash, the tool and arguments."""
    arguments = {"payment_id": "txn_3", "amount": 200_000}
    result = agent(tools, [("refund", arguments)]).invoke({"messages": [("user", "refund")]}, thread())
    payload = paused_on(result)
    request = store.get_approval(payload["ctrlrun_request_id"])
    assert request.status == "pending" and payload["action_hash"] == request.action_hash
    assert (payload["tool"], payload["action"], payload["arguments"]) == ("refund", "stripe.refund", arguments)
    assert json.loads(request.action_json)["arguments"] == arguments  # what the approver is shown
    assert ran == []  # never answered, never run
    # Inside a Django project (this suite's), the request is answered with manage.py, not the script command.
    assert f"'python manage.py approve {request.approval_id}'" in payload["message"], payload["message"]


def test_a_call_a_person_denied_never_reaches_the_tool(tools, ran):
    """A person denies in ctrlrun; resuming the run (even 'approved') does not run the tool."""
    graph, config, request_id = paused_refund(tools, "txn_4")
    store.answer_approval(request_id, False, by="alice")
    result = graph.invoke(resume(request_id), config)
    assert ran == []
    (message,) = tool_messages(result)
    assert message.status == "error" and "did not run" in message.content


def test_a_call_never_answered_never_reaches_the_tool(tools, ran):
    """Resumed while the request is still pending: refused, the tool did not run."""
    graph, config, request_id = paused_refund(tools, "txn_5")
    result = graph.invoke(resume(request_id), config)  # the framework says approved; no person did
    assert ran == []
    assert "ApprovalMismatch" in tool_messages(result)[0].content
    assert store.get_approval(request_id).status == "pending"


@pytest.mark.parametrize("decision", ["", True, "approved", ["apr_x"], {"approved": True}, {"request_id": 7},
                                      {"ctrlrun_request_id": "apr_x", "approved": "yes"}],
                         ids=["empty-string", "true", "word", "list", "no-id", "bad-id", "bad-flag"])
def test_a_missing_or_malformed_decision_fails_closed(tools, ran, decision):
    """A resume value naming no ctrlrun request ('', True, 'approved', ...) runs nothing, even granted."""
    graph, config, request_id = paused_refund(tools, "txn_6")
    store.answer_approval(request_id, True, by="alice")
    result = graph.invoke(Command(resume=decision), config)
    assert ran == []
    (message,) = tool_messages(result)
    assert message.status == "error" and "without a usable decision" in message.content


def test_a_framework_reject_runs_nothing_even_when_ctrlrun_granted(tools, ran):
    """resume(request_id, approved=False) runs nothing, whatever ctrlrun holds."""
    graph, config, request_id = paused_refund(tools, "txn_7")
    store.answer_approval(request_id, True, by="alice")
    result = graph.invoke(resume(request_id, approved=False), config)
    assert ran == [] and "rejected" in tool_messages(result)[0].content


def test_an_approval_for_other_arguments_is_refused_and_the_approver_saw_the_executed_ones(tools, ran):
    """A grant for 200000 presented for a 300000 call is ApprovalMismatch; the granted one runs as shown."""
    shown = {"payment_id": "txn_8", "amount": 200_000}
    first, config_a = agent(tools, [("refund", shown)]), thread()
    granted = paused_on(first.invoke({"messages": [("user", "refund")]}, config_a))["ctrlrun_request_id"]
    store.answer_approval(granted, True, by="alice")

    other, config_b = agent(tools, [("refund", {"payment_id": "txn_8", "amount": 300_000})]), thread()
    paused_on(other.invoke({"messages": [("user", "refund more")]}, config_b))
    result = other.invoke(resume(granted), config_b)  # "approved", with the other call's grant
    assert ran == []
    assert "ApprovalMismatch" in tool_messages(result)[0].content

    result = first.invoke(resume(granted), config_a)
    assert ran == [("refund", "txn_8", 200_000)]
    assert json.loads(store.get_approval(granted).action_json)["arguments"] == shown
    committed = [r for r in receipts() if r["result"] == "committed"]
    assert [(r["approval_id"], r["arguments"]) for r in committed] == [(granted, shown)]


def test_a_granted_approval_runs_once_and_cannot_be_replayed(tools, ran):
    """A granted request runs the call once; a second run resumed with it is refused."""
    arguments = {"payment_id": "txn_9", "amount": 200_000}
    graph, config = agent(tools, [("refund", arguments)]), thread()
    request_id = paused_on(graph.invoke({"messages": [("user", "refund")]}, config))["ctrlrun_request_id"]
    store.answer_approval(request_id, True, by="alice")
    assert tool_messages(graph.invoke(resume(request_id), config))[0].content == "refunded 200000 on txn_9"
    again, config_2 = agent(tools, [("refund", arguments)]), thread()
    paused_on(again.invoke({"messages": [("user", "refund")]}, config_2))
    result = again.invoke(resume(request_id), config_2)
    assert ran == [("refund", "txn_9", 200_000)]
    assert tool_messages(result)[0].status == "error"


def test_a_resumed_node_that_repeats_a_committed_call_is_a_duplicate(tools, ran):
    """langgraph#7780: a node re-run on resume calls the guarded tool again; the effect key refuses it."""
    guarded = guard_tool(ctrlrun.Control(), tools[0], action="stripe.refund", principal="support-agent")
    seen = []

    def node(state):
        seen.append(guarded.invoke({"payment_id": "txn_10", "amount": 500}))
        interrupt("confirm the refund?")  # pauses after the effect; resume re-runs the whole node
        return {"messages": [("ai", "ok")]}

    builder = StateGraph(MessagesState)
    builder.add_node("refund_node", node)
    builder.add_edge(START, "refund_node")
    graph, config = builder.compile(checkpointer=InMemorySaver()), thread()
    graph.invoke({"messages": [("user", "go")]}, config)
    graph.invoke(Command(resume="yes"), config)
    assert ran == [("refund", "txn_10", 500)]
    assert seen[0] == "refunded 500 on txn_10" and "DuplicateEffect" in seen[1]


def test_a_guarded_tool_in_a_tool_node_pauses_and_runs_only_with_the_grant(tools, ran):
    """guard_tool in a ToolNode: deny -> error result; approve band -> interrupt; grant -> runs once."""
    control = ctrlrun.Control()
    node = ToolNode([guard_tool(control, tools[0], action="stripe.refund", principal="support-agent")])
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    graph = builder.compile(checkpointer=InMemorySaver())

    def ask(arguments):
        call = {"name": "refund", "args": arguments, "id": "call_1", "type": "tool_call"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    denied = graph.invoke(ask({"payment_id": "txn_11", "amount": 5_000_000}), thread())
    assert "ActionDenied" in tool_messages(denied)[0].content and tool_messages(denied)[0].status == "error"

    config = thread()
    request_id = paused_on(graph.invoke(ask({"payment_id": "txn_12", "amount": 200_000}), config))["ctrlrun_request_id"]
    assert ran == []
    store.answer_approval(request_id, True, by="alice")
    result = graph.invoke(resume(request_id), config)
    assert tool_messages(result)[0].content == "refunded 200000 on txn_12"
    assert ran == [("refund", "txn_12", 200_000)]


def test_an_async_tool_and_a_sync_tool_both_work(tools, ran):
    """ainvoke: an async tool and a sync tool each run once through acall, with committed receipts."""
    graph = agent(tools, [("send_email", {"msg_id": "m-1", "to": "a@example.com"}),
                          ("refund", {"payment_id": "txn_13", "amount": 700})])
    result = asyncio.run(graph.ainvoke({"messages": [("user", "both")]}, thread()))
    assert sorted(ran) == [("refund", "txn_13", 700), ("send_email", "m-1")]
    assert sorted(m.content for m in tool_messages(result)) == ["refunded 700 on txn_13", "sent m-1"]
    assert sorted((r["action"], r["result"]) for r in receipts()) == [
        ("email.send", "committed"), ("stripe.refund", "committed")]


def test_async_approval_flow_and_denial(tools, ran):
    """ainvoke: a denial is a clear tool result; the approve band pauses and runs only once granted."""
    denied = asyncio.run(agent(tools, [("refund", {"payment_id": "txn_14", "amount": 5_000_000})]).ainvoke(
        {"messages": [("user", "refund")]}, thread()))
    assert "ActionDenied" in tool_messages(denied)[0].content

    graph, config = agent(tools, [("refund", {"payment_id": "txn_15", "amount": 200_000})]), thread()
    request_id = paused_on(asyncio.run(graph.ainvoke({"messages": [("user", "refund")]}, config)))["ctrlrun_request_id"]
    assert ran == []
    store.answer_approval(request_id, True, by="alice")
    result = asyncio.run(graph.ainvoke(resume(request_id), config))
    assert ran == [("refund", "txn_15", 200_000)]
    assert tool_messages(result)[0].content == "refunded 200000 on txn_15"


def test_importing_ctrlrun_does_not_import_langchain():
    """`import ctrlrun` never imports the framework (a fresh interpreter)."""
    import subprocess
    import sys

    code = "import sys, ctrlrun, ctrlrun.adapters; print(any(m.split('.')[0] in ('langchain', 'langgraph') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_without_langchain_the_import_names_the_extra():
    """Importing the adapter without LangChain raises ImportError naming pip install 'langchain>=1.5' (the extra)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['langchain'] = None\n"
            "try:\n    import ctrlrun.adapters.langchain\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'langchain>=1.5' (django-ctrlrun's langchain extra)" in out.stdout


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
