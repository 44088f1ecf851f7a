"""The Pydantic AI adapter's conformance tests: each known bypass class replayed with the real framework.

A scripted ``FunctionModel`` makes the tool calls (no network, no API key); the tools count their
executions, so "never reached the tool" is counted, not assumed. Pydantic AI's own approval
(``DeferredToolResults``) is advisory: only a grant ctrlrun holds for the exact action hash runs a call.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from pydantic_ai import Agent, FunctionToolset  # the test extra installs it: missing is a failure, not a skip
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, ToolApproved, ToolDenied

import ctrlrun
from ctrlrun import store
from ctrlrun.adapters.pydantic_ai import ACTION_HASH, REQUEST_ID, CtrlrunToolset
from ctrlrun.models import EffectRecord
from tests.support import events, policy_text, receipts

pytestmark = pytest.mark.usefixtures("store_db")

#: A policy written as a deny-list: "big refunds need a person, everything else is fine".
DENYLIST_POLICY = policy_text("denylist")

BIG = {"payment_id": "txn_big", "amount": 200_000}  # the approve band
SMALL = {"payment_id": "txn_small", "amount": 100}  # the allow band


class Tools:
    """The tools the agent may call, counting what reached them."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, dict]] = []

    def refund(self, payment_id: str, amount: int) -> str:
        self.ran.append(("refund", {"payment_id": payment_id, "amount": amount}))
        return f"refunded {amount} on {payment_id}"

    async def send_email(self, msg_id: str, to: str) -> str:
        await asyncio.sleep(0)
        self.ran.append(("email", {"msg_id": msg_id, "to": to}))
        return f"queued {msg_id}"

    def grant_admin(self, user: str) -> str:
        self.ran.append(("admin", {"user": user}))
        return "granted"


def scripted(*calls: tuple[str, dict]) -> FunctionModel:
    """A model that makes ``calls`` (one per turn, in order) and then says what the last tool returned."""
    def respond(messages, info) -> ModelResponse:
        made = sum(isinstance(part, ToolCallPart) for m in messages if isinstance(m, ModelResponse) for part in m.parts)
        if made < len(calls):
            name, args = calls[made]
            return ModelResponse(parts=[ToolCallPart(name, dict(args), tool_call_id=f"call_{made}")])
        returns = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        return ModelResponse(parts=[TextPart(f"tool said: {returns[-1].content}" if returns else "nothing")])
    return FunctionModel(respond)


def make_agent(tools: Tools, *calls: tuple[str, dict], guarded: bool = True, control=None) -> tuple[Agent, CtrlrunToolset]:
    functions = FunctionToolset([tools.refund, tools.send_email, tools.grant_admin])
    toolset = CtrlrunToolset(
        functions, control or ctrlrun.Control(),
        actions={"refund": "stripe.refund", "send_email": "email.send", "grant_admin": "iam.grant_admin"},
        effects={"refund": "refund:{payment_id}"}, principal="support-agent")
    agent = Agent(scripted(*calls), toolsets=[toolset if guarded else functions],
                  output_type=[str, DeferredToolRequests])
    return agent, toolset


def deferred_big(tools: Tools, **kwargs):
    """A first run that calls the approve-band refund: it ends with DeferredToolRequests."""
    agent, toolset = make_agent(tools, ("refund", BIG), **kwargs)
    first = agent.run_sync("refund the big one")
    assert isinstance(first.output, DeferredToolRequests), first.output
    [call] = first.output.approvals
    return agent, toolset, first, call, first.output.metadata[call.tool_call_id]


def resume(agent: Agent, first, results: DeferredToolResults):
    return agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)


def test_allowed_sync_tool_runs_once_and_leaves_a_committed_receipt():
    """An allowed call of a sync tool runs once, its value is the tool result, and its receipt is committed."""
    tools = Tools()
    agent, _ = make_agent(tools, ("refund", SMALL))
    result = agent.run_sync("refund it")
    assert result.output == "tool said: refunded 100 on txn_small"
    assert tools.ran == [("refund", SMALL)]
    [receipt] = receipts()
    assert (receipt["action"], receipt["arguments"], receipt["result"]) == ("stripe.refund", SMALL, "committed")
    assert EffectRecord.objects.get(pk="refund:txn_small").state == "committed"


def test_async_tool_runs_from_an_async_agent_run():
    """An async tool works under await agent.run, keyed by the policy's effect template."""
    tools = Tools()
    agent, _ = make_agent(tools, ("send_email", {"msg_id": "m1", "to": "a@example.com"}))
    result = asyncio.run(agent.run("mail them"))
    assert result.output == "tool said: queued m1"
    assert tools.ran == [("email", {"msg_id": "m1", "to": "a@example.com"})]
    assert EffectRecord.objects.get(pk="email:m1").state == "committed"


def test_a_policy_denial_comes_back_to_the_model_as_the_tool_result():
    """A denied call never reaches the tool; the model reads a clear 'ctrlrun refused' result, no crash."""
    tools = Tools()
    agent, _ = make_agent(tools, ("grant_admin", {"user": "mallory"}), ("refund", {"payment_id": "t", "amount": 10**9}))
    result = agent.run_sync("escalate")
    assert tools.ran == []
    returns = [p.content for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert len(returns) == 2 and all(r.startswith("ctrlrun refused") and "ActionDenied" in r for r in returns)
    assert "iam.grant_admin" in returns[0] and "stripe.refund" in returns[1]
    assert result.output.startswith("tool said: ctrlrun refused stripe.refund (ActionDenied")
    assert [r["result"] for r in receipts()] == ["denied", "denied"]


def test_the_approve_band_defers_with_the_ctrlrun_request_and_hash():
    """The approve band ends the run with DeferredToolRequests carrying ctrlrun's request id and action hash."""
    tools = Tools()
    _, toolset, _, call, metadata = deferred_big(tools)
    request = store.get_approval(metadata[REQUEST_ID])
    assert request.status == "pending" and metadata[ACTION_HASH] == request.action_hash
    assert request.arguments == BIG and call.args_as_dict() == BIG
    assert toolset.pending[call.tool_call_id].request_id == request.approval_id
    assert tools.ran == []


def test_framework_approved_but_the_person_denied_never_runs():
    """approvals={id: True} after a person denied in ctrlrun: refused as the tool result, the tool never ran."""
    tools = Tools()
    agent, _, first, call, metadata = deferred_big(tools)
    store.answer_approval(metadata[REQUEST_ID], False, by="alice")
    result = resume(agent, first, DeferredToolResults(approvals={call.tool_call_id: True}))
    assert tools.ran == []
    assert result.output.startswith("tool said: ctrlrun refused stripe.refund (ActionDenied: approval_denied")


def test_framework_approved_but_nobody_answered_defers_again():
    """approvals={id: True} while the ctrlrun request is unanswered: nothing runs, the call is deferred again."""
    tools = Tools()
    agent, _, first, call, metadata = deferred_big(tools)
    again = resume(agent, first, DeferredToolResults(approvals={call.tool_call_id: True}))
    assert tools.ran == []
    assert isinstance(again.output, DeferredToolRequests)
    assert again.output.metadata[call.tool_call_id][REQUEST_ID] == metadata[REQUEST_ID]
    assert store.get_approval(metadata[REQUEST_ID]).status == "pending"


def test_a_person_granted_the_exact_call_it_runs_once():
    """Granted in ctrlrun and approved in Pydantic AI: the call runs once under with_approval, committed."""
    tools = Tools()
    agent, toolset, first, call, metadata = deferred_big(tools)
    store.answer_approval(metadata[REQUEST_ID], True, by="alice")
    result = resume(agent, first, DeferredToolResults(approvals={call.tool_call_id: ToolApproved()}))
    assert result.output == "tool said: refunded 200000 on txn_big"
    assert tools.ran == [("refund", BIG)]
    assert store.get_approval(metadata[REQUEST_ID]).status == "consumed"
    assert receipts()[-1]["result"] == "committed" and toolset.pending == {}


@pytest.mark.parametrize("override", [
    {"payment_id": "txn_big", "amount": 900_000},  # still the approve band: ctrlrun's hash check
    {"payment_id": "txn_other", "amount": 100},  # the allow band: the adapter's own check
])
def test_approved_with_other_arguments_is_an_approval_mismatch(override):
    """ToolApproved(override_args=...) for arguments the person did not see is refused (ApprovalMismatch);
    the request's stored arguments are the ones the model made, and nothing ran."""
    tools = Tools()
    agent, _, first, call, metadata = deferred_big(tools)
    store.answer_approval(metadata[REQUEST_ID], True, by="alice")
    result = resume(agent, first, DeferredToolResults(approvals={call.tool_call_id: ToolApproved(override_args=override)}))
    assert tools.ran == []
    assert result.output.startswith("tool said: ctrlrun refused stripe.refund (ApprovalMismatch: mismatch")
    request = store.get_approval(metadata[REQUEST_ID])
    assert request.arguments == BIG and request.status == "granted"  # not spent on other arguments


def test_another_process_resuming_with_other_arguments_is_refused_by_ctrlrun():
    """A fresh toolset (another process) resuming from the metadata: ctrlrun's own hash check refuses other
    arguments as ApprovalMismatch, recorded as APPROVAL_INVALIDATED."""
    tools = Tools()
    _, _, first, call, metadata = deferred_big(tools)
    store.answer_approval(metadata[REQUEST_ID], True, by="alice")
    agent, toolset = make_agent(tools, ("refund", BIG))
    tampered = first.all_messages()
    for message in tampered:  # the history is the caller's: its copy of the call says 900000
        for part in getattr(message, "parts", []):
            if isinstance(part, ToolCallPart) and part.tool_call_id == call.tool_call_id:
                part.args = {"payment_id": "txn_big", "amount": 900_000}
    result = agent.run_sync(message_history=tampered, deferred_tool_results=DeferredToolResults(
        approvals={call.tool_call_id: True}, metadata={call.tool_call_id: dict(metadata)}))
    assert tools.ran == []
    assert result.output.startswith("tool said: ctrlrun refused stripe.refund (ApprovalMismatch: mismatch")
    assert "APPROVAL_INVALIDATED" in events()


def test_a_missing_decision_fails_closed():
    """Resuming without a decision for the deferred call runs nothing (pydantic/pydantic-ai#8060)."""
    tools = Tools()
    agent, _, first, call, metadata = deferred_big(tools)
    store.answer_approval(metadata[REQUEST_ID], True, by="alice")
    with pytest.raises(UserError, match="need to be provided for all deferred tool calls"):
        resume(agent, first, DeferredToolResults(approvals={}))
    assert tools.ran == []
    assert store.get_approval(metadata[REQUEST_ID]).status == "granted"


@pytest.mark.parametrize("decision", ["yes", 1, None])
def test_a_malformed_decision_fails_closed(decision):
    """A decision that is not a bool/ToolApproved/ToolDenied runs nothing."""
    tools = Tools()
    agent, _, first, call, metadata = deferred_big(tools)
    store.answer_approval(metadata[REQUEST_ID], True, by="alice")
    with pytest.raises(UserError, match="Invalid approval result"):
        resume(agent, first, DeferredToolResults(approvals={call.tool_call_id: decision}))
    assert tools.ran == []
    assert store.get_approval(metadata[REQUEST_ID]).status == "granted"


@pytest.mark.parametrize("metadata", [None, {}, {REQUEST_ID: 42}, {REQUEST_ID: "not-a-request"}, {REQUEST_ID: "apr_forged"}])
def test_an_approval_with_no_or_a_malformed_ctrlrun_request_fails_closed(metadata):
    """Approved in Pydantic AI, resumed where no request is known (another process) and the metadata is
    missing, malformed or forged: refused as the tool result, nothing ran."""
    tools = Tools()
    _, _, first, call, real = deferred_big(tools)
    store.answer_approval(real[REQUEST_ID], True, by="alice")
    agent, _ = make_agent(tools, ("refund", BIG))  # a fresh toolset: no in-memory record of the call
    results = DeferredToolResults(approvals={call.tool_call_id: True},
                                  metadata={call.tool_call_id: metadata} if metadata is not None else {})
    result = agent.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    assert tools.ran == []
    assert result.output.startswith("tool said: ctrlrun refused stripe.refund (ApprovalMismatch")


def test_the_framework_denial_never_reaches_ctrlrun_or_the_tool():
    """ToolDenied returns its message to the model; nothing ran."""
    tools = Tools()
    agent, _, first, call, _ = deferred_big(tools)
    result = resume(agent, first, DeferredToolResults(approvals={call.tool_call_id: ToolDenied("no")}))
    assert tools.ran == [] and result.output == "tool said: no"


def test_a_resumed_run_repeating_a_committed_call_is_a_duplicate():
    """A resumed run whose model repeats a committed refund is refused by its effect key; the tool ran once."""
    tools = Tools()
    agent, _ = make_agent(tools, ("refund", SMALL))
    first = agent.run_sync("refund it")
    again, _ = make_agent(tools, ("refund", SMALL), ("refund", SMALL))
    result = again.run_sync("are you sure?", message_history=first.all_messages())
    assert tools.ran == [("refund", SMALL)]
    assert result.output.startswith("tool said: ctrlrun refused stripe.refund (DuplicateEffect: committed")


def test_replaying_a_granted_resume_runs_the_tool_once():
    """The same DeferredToolResults replayed after the granted call committed (another process) is refused."""
    tools = Tools()
    agent, _, first, call, metadata = deferred_big(tools)
    store.answer_approval(metadata[REQUEST_ID], True, by="alice")
    results = DeferredToolResults(approvals={call.tool_call_id: True}, metadata={call.tool_call_id: dict(metadata)})
    resume(agent, first, results)
    replay, _ = make_agent(tools, ("refund", BIG))
    result = replay.run_sync(message_history=first.all_messages(), deferred_tool_results=results)
    assert tools.ran == [("refund", BIG)]
    assert result.output.startswith("tool said: ctrlrun refused stripe.refund")
    assert [r["result"] for r in receipts()].count("committed") == 1


def test_without_the_adapter_the_bypasses_happen():
    """The control experiment: the same scripted calls with the bare toolset reach the tool."""
    tools = Tools()
    agent, _ = make_agent(tools, ("grant_admin", {"user": "mallory"}), ("refund", SMALL), ("refund", SMALL),
                          guarded=False)
    agent.run_sync("go")
    assert [name for name, _ in tools.ran] == ["admin", "refund", "refund"]
    assert json.dumps(receipts()) == "[]"


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
