"""The OpenAI Agents SDK adapter: every tool call of a real ``agents`` run goes through ``Control.acall``.

Runs use the SDK's own scripted test model (``agents.testing.ScriptedModel``): no network, no API
key. Each test replays one bypass class and counts the tool's executions.
"""
from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, RunState, set_tracing_disabled  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

import ctrlrun  # noqa: E402
from ctrlrun import store  # noqa: E402
from ctrlrun.policy import parse_policy  # noqa: E402
from ctrlrun.adapters.openai_agents import CtrlrunRequest, guarded_tool, request_for  # noqa: E402
from tests.support import policy_text, receipts, tamper  # noqa: E402

pytestmark = pytest.mark.usefixtures("store_db")

set_tracing_disabled(True)
CONFIG = RunConfig(tracing_disabled=True)
LARGE = {"payment_id": "txn_big", "amount": 200_000}  # the approve band


def refund_tool(control, ran, *, asynchronous=False, **options):
    if asynchronous:
        async def refund(payment_id: str, amount: int) -> str:
            """Refund part of a payment."""
            await asyncio.sleep(0)
            ran.append((payment_id, amount))
            return f"refunded {amount} on {payment_id}"
    else:
        def refund(payment_id: str, amount: int) -> str:
            """Refund part of a payment."""
            ran.append((payment_id, amount))
            return f"refunded {amount} on {payment_id}"
    return guarded_tool(control, "stripe.refund", refund, principal="refund-agent", **options)


def agent_calling(tool, *calls, then="done"):
    steps = [[function_call(tool.name, arguments, call_id=call_id)] for call_id, arguments in calls]
    model = ScriptedModel([*steps, [assistant_message(then)]])
    return Agent(name="refunds", model=model, tools=[tool]), model


def outputs(result):
    return [item.output for item in result.new_items if item.type == "tool_call_output_item"]


def run(agent, given):
    return asyncio.run(Runner.run(agent, given, run_config=CONFIG))


def interrupted(tool, arguments=LARGE, call_id="c1"):
    """A run stopped at the SDK's approval interruption, with the ctrlrun request behind it."""
    agent, model = agent_calling(tool, (call_id, arguments))
    result = run(agent, "refund it")
    assert len(result.interruptions) == 1, outputs(result)
    request = request_for(tool, result.interruptions[0])
    assert request is not None and request.request_id.startswith("apr_")
    return agent, result, request


def resumed(agent, state):
    """Approve every interruption at the SDK level (RunState.approve) and run on."""
    for item in state.get_interruptions():
        state.approve(item)
    return run(agent, state)


def test_a_call_a_person_denied_or_never_answered_never_reaches_the_tool():
    """SDK-approved but ctrlrun-denied, or never answered in ctrlrun: the tool never runs."""
    control, ran = ctrlrun.Control(), []
    tool = refund_tool(control, ran)

    agent, result, request = interrupted(tool)
    store.answer_approval(request.request_id, False, by="alice")
    after = resumed(agent, result.to_state())
    assert ran == []
    assert "ctrlrun refused" in outputs(after)[0] and "approval_denied" in outputs(after)[0]

    agent, result, request = interrupted(tool, {"payment_id": "txn_other", "amount": 300_000}, call_id="c2")
    after = resumed(agent, result.to_state())  # nobody answered the ctrlrun request
    assert ran == []
    assert "ctrlrun refused" in outputs(after)[0] and "pending" in outputs(after)[0]
    assert store.get_approval(request.request_id).status == "pending"


def test_a_framework_approval_for_other_arguments_is_an_approval_mismatch():
    """Granted in ctrlrun for the arguments shown, executed with others: ApprovalMismatch, nothing ran."""
    control, ran = ctrlrun.Control(), []
    tool = refund_tool(control, ran)
    agent, result, request = interrupted(tool)
    approval = store.get_approval(request.request_id)
    assert approval.canonical_action["arguments"] == LARGE == json.loads(result.interruptions[0].raw_item.arguments)
    store.answer_approval(request.request_id, True, by="alice")

    # The paused run's state is changed before it is resumed: the same tool call, other arguments.
    tampered = tamper(result.to_state().to_string(), "c1", {**LARGE, "amount": 900_000})
    state = asyncio.run(RunState.from_string(agent, tampered))
    after = resumed(agent, state)
    assert ran == []
    assert "ctrlrun refused" in outputs(after)[0] and "mismatch" in outputs(after)[0]
    with pytest.raises(ctrlrun.ApprovalMismatch), ctrlrun.with_approval(request.request_id):
        control.call("stripe.refund", {**LARGE, "amount": 900_000}, lambda: ran.append("direct"),
                     principal="refund-agent")
    assert ran == []
    assert store.get_approval(request.request_id).consumed_at is None  # still only good for what alice read


def test_a_missing_or_malformed_decision_fails_closed(monkeypatch):
    """A malformed verdict or unreadable arguments interrupt and still need a grant; a forged request runs nothing."""
    control, ran = ctrlrun.Control(), []
    tool = refund_tool(control, ran)
    monkeypatch.setattr(control, "evaluate", lambda name, arguments: object())  # no .decision at all
    agent, model = agent_calling(tool, ("c1", {"payment_id": "txn_5", "amount": 300_000}))
    result = run(agent, "refund it")
    assert len(result.interruptions) == 1  # fails closed: the SDK asks, and ctrlrun still decides
    monkeypatch.undo()

    state = result.to_state()
    after = resumed(agent, state)  # approved at the SDK level only: no ctrlrun request was ever answered
    assert "ctrlrun refused" in outputs(after)[0] and "approval required" in outputs(after)[0]
    assert ran == []

    agent, model = agent_calling(tool, ("c2", '{"payment_id": "txn_6", "amount": "lots"'))
    result = run(agent, "refund it")  # unreadable arguments: the SDK cannot ask the policy, so it asks a person
    assert len(result.interruptions) == 1
    after = resumed(agent, result.to_state())
    assert "ctrlrun refused" in outputs(after)[0] and "invalid arguments" in outputs(after)[0]

    agent, result, request = interrupted(tool, call_id="c3")
    tool.ctrlrun_requests["c3"] = CtrlrunRequest("apr_forged", request.action_hash, "c3", request.arguments)
    after = resumed(agent, result.to_state())
    assert "ctrlrun refused" in outputs(after)[0] and "unknown" in outputs(after)[0]
    assert ran == []


def test_a_resumed_run_that_repeats_a_committed_call_is_a_duplicate():
    """A granted call runs once; resuming the same paused run again is refused by the effect key."""
    control, ran = ctrlrun.Control(), []
    tool = refund_tool(control, ran)
    agent, result, request = interrupted(tool)
    store.answer_approval(request.request_id, True, by="alice")
    paused = result.to_state().to_string()
    first = resumed(agent, asyncio.run(RunState.from_string(agent, paused)))
    assert outputs(first) == ["refunded 200000 on txn_big"]

    again_agent, _ = agent_calling(tool)  # a second process resumes the same saved state
    again = resumed(again_agent, asyncio.run(RunState.from_string(again_agent, paused)))
    assert ran == [("txn_big", 200_000)]
    assert "ctrlrun refused" in outputs(again)[0]
    assert "duplicate effect refund:txn_big (committed)" in outputs(again)[0]

    small = {"payment_id": "txn_s", "amount": 10}
    agent, _ = agent_calling(tool, ("c7", small), ("c8", small))  # the model repeats an allowed call
    repeated = run(agent, "refund twice")
    assert outputs(repeated)[0] == "refunded 10 on txn_s"
    assert "duplicate effect refund:txn_s (committed)" in outputs(repeated)[1]
    assert ran == [("txn_big", 200_000), ("txn_s", 10)]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_sync_and_async_tools_run_and_the_model_sees_a_denial(asynchronous):
    """An allowed call runs (sync or async tool); a denied one reaches the model as a clear tool result."""
    control, ran = ctrlrun.Control(), []
    tool = refund_tool(control, ran, asynchronous=asynchronous)
    agent, model = agent_calling(tool, ("c1", {"payment_id": "txn_a", "amount": 100}),
                                 ("c2", {"payment_id": "txn_b", "amount": 5_000_000}))
    result = run(agent, "refund")
    assert result.interruptions == []
    assert ran == [("txn_a", 100)]
    shown = [item for item in model.last_call.input
             if isinstance(item, dict) and item.get("type") == "function_call_output"]
    assert shown[0]["output"] == "refunded 100 on txn_a"
    assert shown[1]["output"].startswith("ctrlrun refused stripe.refund: denied (")
    assert "did not run" in shown[1]["output"]


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


def test_an_allowed_call_leaves_a_committed_receipt():
    """The allowed call went through Control.acall: its committed receipt names the action and effect key."""
    control, ran = ctrlrun.Control(), []
    tool = refund_tool(control, ran)
    agent, _ = agent_calling(tool, ("c1", {"payment_id": "txn_r", "amount": 42}))
    run(agent, "refund")
    committed = [r for r in receipts() if r["result"] == "committed"]
    assert len(committed) == 1 and ran == [("txn_r", 42)]
    assert committed[0]["action"] == "stripe.refund" and committed[0]["effect_key"] == "refund:txn_r"
    assert committed[0]["arguments"] == {"payment_id": "txn_r", "amount": 42}
    assert committed[0]["principal"]["agent"] == "refund-agent"


OBSERVING = policy_text("refund").replace("schema: ctrlrun.policy/v2", "schema: ctrlrun.policy/v3\nmode: observe")


def test_observe_mode_never_pauses_the_run_and_records_one_observed_call():
    """Observe mode through the SDK: nobody is asked (no interruption, no request), the tool runs once,
    and its one receipt says the call would have needed an approval (not a probe that failed)."""
    from ctrlrun.models import Approval, Event

    observing = ctrlrun.Control(policy=parse_policy(OBSERVING))
    ran = []
    tool = refund_tool(observing, ran)
    agent, _ = agent_calling(tool, ("c1", LARGE))
    result = run(agent, "refund it")
    assert result.interruptions == [] and ran == [("txn_big", 200_000)]
    assert not Approval.objects.exists() and not Event.objects.filter(type="APPROVAL_REQUESTED").exists()
    (only,) = receipts()
    assert (only["result"], only["execution"]) == ("observed", "committed")
    assert (only["would_have"]["decision"], only["would_have"]["blocked_reason"]) == ("approve", "approval_required")
    assert outputs(result) == ["refunded 200000 on txn_big"]


def test_preconditions_pass_through_and_a_moved_state_never_reaches_the_tool():
    """``guarded_tool(..., preconditions=...)``: the request keeps the state the person saw; resumed after
    it moved, the tool never runs and the model is told why (the approval stays granted)."""
    control, ran, balance = ctrlrun.Control(), [], {"value": 900}
    tool = refund_tool(control, ran, preconditions=lambda action: {"balance": balance["value"]})
    agent, result, request = interrupted(tool)
    assert store.get_approval(request.request_id).precondition_fingerprint is not None
    store.answer_approval(request.request_id, True, by="alice")
    balance["value"] = 100
    after = resumed(agent, result.to_state())
    assert ran == []
    assert "ctrlrun refused" in outputs(after)[0] and "precondition_changed" in outputs(after)[0]
    assert store.get_approval(request.request_id).status == "granted"
