"""Django-native resumption (ctrlrun.resumption): a framework's paused run stored beside its ctrlrun
approval, resumed by ``ctrlrun resume_runs`` in ANOTHER OS process once a person answered.

Real packages (the OpenAI Agents SDK with its ScriptedModel, LangChain/LangGraph with a SQLite
checkpointer, Pydantic AI with FunctionModel), the real store, real subprocesses. The agents and the
resumers are the application's: tests/resumable_agents.py. The refund appends a line to a ledger
file each time it runs, so "exactly once" is counted across processes.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from agents import RunConfig, Runner  # noqa: E402

import ctrlrun  # noqa: E402
from ctrlrun import resumption, store  # noqa: E402
from ctrlrun.models import PausedRun  # noqa: E402
from tests import resumable_agents as app  # noqa: E402
from tests.support import (FRAMEWORKS, REFUND_POLICY, REPO, ledger, pause, paused_row, receipts,  # noqa: E402
                           resume_runs, rewrite_paused, run_together, script_environment, seen, tamper,
                           write_paused_state)

pytestmark = pytest.mark.usefixtures("store_db")


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_granted_run_is_resumed_in_another_process_and_the_refund_runs_once(framework, files, tmp_path):
    approval_id = pause(framework)
    assert ledger(files) == []  # paused: nothing ran
    store.answer_approval(approval_id, True, by="alice")  # what the console does

    done = resume_runs(tmp_path, "--import", "tests.resumable_agents")
    assert done.returncode == 0, done.stderr
    assert f"{approval_id}  resumed (granted)" in done.stdout and "resume_runs: 1 resumed" in done.stdout
    (line,) = ledger(files)  # exactly once, in the other process
    assert line.split()[1:] == ["txn_500k", "500000"] and int(line.split()[0]) != os.getpid()
    row = paused_row(approval_id)
    assert (row.status, row.answer, row.error) == ("resumed", "granted", None)
    assert row.claimed_at is not None and row.resumed_at is not None
    assert store.get_approval(approval_id).status == "consumed"
    committed = [r for r in receipts() if r["result"] == "committed" and r["effect_key"] == "refund:txn_500k"]
    assert len(committed) == 1 and committed[0]["approver"] == "alice" and committed[0]["approval_id"] == approval_id
    (told,) = seen(files)
    assert told["answer"] == "granted" and "refunded 500000 on txn_500k" in told["text"]

    again = resume_runs(tmp_path, "--import", "tests.resumable_agents")  # nothing is resumed twice
    assert again.returncode == 0, again.stderr
    assert "nothing to resume" in again.stdout and len(ledger(files)) == 1


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_denied_run_is_resumed_and_the_model_is_told_no(framework, files, tmp_path):
    approval_id = pause(framework)
    store.answer_approval(approval_id, False, by="bob", note="too large for one refund")

    done = resume_runs(tmp_path, "--import", "tests.resumable_agents")
    assert done.returncode == 0, done.stderr
    assert f"{approval_id}  resumed (denied)" in done.stdout
    assert ledger(files) == []
    (told,) = seen(files)
    assert told["answer"] == "denied"
    assert "denied" in told["text"] and "bob" in told["text"] and "did not run" in told["text"], told
    assert paused_row(approval_id).status == "resumed"
    assert not [r for r in receipts() if r["result"] == "committed"]


def test_the_approve_command_in_a_subprocess_then_resume_runs(files, tmp_path):
    """The whole story across processes: this one pauses, `ctrlrun approve` answers, `resume_runs` resumes."""
    approval_id = pause("pydantic-ai")
    env = script_environment(tmp_path, REFUND_POLICY)
    approved = subprocess.run([sys.executable, "-m", "ctrlrun", "approve", approval_id, "--by", "alice"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
    assert approved.returncode == 0, approved.stderr
    done = resume_runs(tmp_path, "--import", "tests.resumable_agents")
    assert done.returncode == 0, done.stderr
    assert len(ledger(files)) == 1 and paused_row(approval_id).status == "resumed"


def test_two_processes_never_resume_the_same_run_twice(files, tmp_path):
    """Two resume_runs processes at once over five granted runs: each refund runs exactly once."""
    ids = [pause("pydantic-ai", {"payment_id": f"txn_{n}", "amount": 500_000}) for n in range(5)]
    for approval_id in ids:
        store.answer_approval(approval_id, True, by="alice")
    env = script_environment(tmp_path, REFUND_POLICY)
    env.update({k: v for k, v in os.environ.items() if k.startswith("RESUME_")})
    script = tmp_path / "resume.py"
    script.write_text("import sys\nfrom ctrlrun.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    outputs = run_together(tmp_path, str(script), [["resume_runs", "--once", "--import", "tests.resumable_agents"]] * 2,
                           env)
    lines = sorted(ledger(files))
    assert sorted(line.split()[1] for line in lines) == [f"txn_{n}" for n in range(5)]
    resumed = [line for out in outputs for line in out.splitlines() if "  resumed (granted)" in line]
    assert sorted(line.split()[0] for line in resumed) == sorted(ids)  # each by one process only
    assert {paused_row(i).status for i in ids} == {"resumed"}
    assert len({paused_row(i).claimed_by for i in ids} - {None}) >= 1


def test_editing_the_stored_state_to_change_the_arguments_is_refused(files):
    """PausedRun is mutable app data, never trusted for consent: other arguments are ApprovalMismatch."""
    approval_id = pause("openai-agents")
    store.answer_approval(approval_id, True, by="alice")
    row = paused_row(approval_id)
    data = json.loads(row.state)
    data["run_state"] = json.loads(tamper(json.dumps(data["run_state"]), "c1",
                                          {"payment_id": "txn_500k", "amount": 900_000}))
    write_paused_state(row.approval_id, json.dumps(data))

    (outcome,) = resumption.resume_ready()
    assert outcome.status == "resumed"  # the resumer ran; ctrlrun refused the call inside it
    assert ledger(files) == []
    (told,) = seen(files)
    assert "ctrlrun refused" in told["text"] and "mismatch" in told["text"], told
    approval = store.get_approval(approval_id)
    assert approval.status == "granted" and approval.consumed_at is None  # still only good for what alice read


def test_an_edited_state_without_the_key_is_never_resumed(files):
    """The application's database role cannot edit a paused run's state (the database refuses it); the
    store's owner can, without the key: its signature fails, the run is left pending and never
    resumed, and the check names it."""
    from django.db import DatabaseError, transaction

    from tests.support import evidence_unguarded

    approval_id = pause("openai-agents")
    store.answer_approval(approval_id, True, by="alice")
    row = paused_row(approval_id)
    edited = row.state.replace("500000", "900000")
    with pytest.raises(DatabaseError, match="paused run"), transaction.atomic():
        PausedRun.objects.filter(pk=row.pk).update(state=edited)
    with evidence_unguarded():
        PausedRun.objects.filter(pk=row.pk).update(state=edited)
    (outcome,) = resumption.resume_ready()
    assert outcome.status == "skipped" and "signature" in outcome.detail
    assert paused_row(approval_id).status == "pending" and ledger(files) == [] and seen(files) == []
    report = store.verify()
    assert [(b.name, b.kind, b.subject) for b in report.breaks] == [("signature_invalid", "paused", approval_id)]


def test_editing_pydantic_ai_messages_is_refused_too(files):
    approval_id = pause("pydantic-ai")
    store.answer_approval(approval_id, True, by="alice")
    row = paused_row(approval_id)
    write_paused_state(approval_id, row.state.replace("500000", "900000"))
    assert "900000" in paused_row(approval_id).state

    (outcome,) = resumption.resume_ready()
    assert outcome.status == "resumed" and ledger(files) == []
    (told,) = seen(files)
    assert "ctrlrun refused" in told["text"] and "ApprovalMismatch" in told["text"], told
    assert store.get_approval(approval_id).consumed_at is None


def test_an_expired_request_resumes_with_the_model_told_it_expired(files, clock):
    approval_id = pause("langgraph")
    clock.advance(hours=48)  # past the request's time to live: nobody answered
    assert not resumption.resume_request("apr_nothing_paused_here")
    (outcome,) = resumption.resume_ready()
    assert (outcome.status, outcome.answer) == ("resumed", "expired")
    assert store.get_approval(approval_id).status == "expired"
    assert ledger(files) == []
    (told,) = seen(files)
    assert told["answer"] == "expired" and "expired" in told["text"] and "did not run" in told["text"]


def test_the_signal_receiver_resumes_in_process_and_the_command_then_has_nothing(files, tmp_path):
    approval_id = pause("langgraph")
    resumption.connect_signal_receiver()
    try:
        store.answer_approval(approval_id, True, by="alice")  # the receiver resumes right after the commit
    finally:
        resumption.disconnect_signal_receiver()
    assert len(ledger(files)) == 1 and int(ledger(files)[0].split()[0]) == os.getpid()
    assert paused_row(approval_id).status == "resumed"
    done = resume_runs(tmp_path, "--import", "tests.resumable_agents")
    assert done.returncode == 0 and "nothing to resume" in done.stdout, done.stderr
    assert len(ledger(files)) == 1


def test_a_pending_request_is_not_resumed(files):
    approval_id = pause("pydantic-ai")
    assert resumption.resume_ready() == []
    assert resumption.resume_request(approval_id).status == "skipped"
    assert paused_row(approval_id).status == "pending"


# --------------------------------------------------------------------------- bad input: one line, nothing changed


def test_bad_input_to_pause_is_a_one_line_error_and_changes_nothing(files):
    approval_id = pause("pydantic-ai")
    before = paused_row(approval_id).state
    cases = [
        (("apr_unknown", "pydantic-ai", "{}"), {"resume_with": "pydantic-refunds"}, "no approval request 'apr_unknown'"),
        (("txn_1", "pydantic-ai", "{}"), {"resume_with": "pydantic-refunds"}, "apr_..."),
        ((approval_id, "crewai", "{}"), {"resume_with": "pydantic-refunds"}, "framework is one of"),
        ((approval_id, "pydantic-ai", "{}"), {"resume_with": "nobody"}, "no resumer 'nobody' is registered"),
        ((approval_id, "pydantic-ai", "{not json"), {"resume_with": "pydantic-refunds"}, "not JSON text"),
        ((approval_id, "pydantic-ai", "[1]"), {"resume_with": "pydantic-refunds"}, "JSON object"),
        ((approval_id, "pydantic-ai", "{}"), {"resume_with": "pydantic-refunds"}, "already stored"),
    ]
    for args, kwargs, expected in cases:
        with pytest.raises(ctrlrun.InvalidArgument) as refused:
            resumption.pause(*args, **kwargs)
        assert expected in str(refused.value) and "\n" not in str(refused.value)
    assert PausedRun.objects.count() == 1 and paused_row(approval_id).state == before


def test_a_state_that_does_not_parse_fails_that_run_with_its_reason(files, tmp_path):
    approval_id = pause("openai-agents")
    store.answer_approval(approval_id, True, by="alice")
    write_paused_state(approval_id, '{"run_state": 1}')
    done = resume_runs(tmp_path, "--import", "tests.resumable_agents")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().startswith("Error: 1 paused run(s) not resumed") and len(done.stderr.splitlines()) == 1
    assert f"{approval_id}  failed (granted)" in done.stdout and "does not parse" in done.stdout
    row = paused_row(approval_id)
    assert row.status == "failed" and "does not parse as an OpenAI Agents run" in row.error
    assert ledger(files) == []
    assert resume_runs(tmp_path, "--import", "tests.resumable_agents").stdout.strip() == "resume_runs: nothing to resume"


def test_resume_runs_leaves_a_run_whose_resumer_is_unknown_pending(files, tmp_path):
    approval_id = pause("pydantic-ai")
    store.answer_approval(approval_id, True, by="alice")
    done = resume_runs(tmp_path)  # no --import: the resumer is not registered there
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "skipped" in done.stdout and "no resumer 'pydantic-refunds' is registered" in done.stdout
    assert paused_row(approval_id).status == "pending" and ledger(files) == []

    missing = resume_runs(tmp_path, "--import", "tests.no_such_module")
    assert missing.returncode == 1 and missing.stderr.startswith("Error: could not import resumer module")
    assert len(missing.stderr.splitlines()) == 1

    assert resume_runs(tmp_path, "--import", "tests.resumable_agents").returncode == 0
    assert len(ledger(files)) == 1


def test_a_resumer_that_raises_marks_the_run_failed_once(files):
    @resumption.resumer("explodes")
    def explode(paused, answer):
        raise RuntimeError("the agent's model is down\n(line two)")

    try:
        approval_id = pause("pydantic-ai")
        rewrite_paused(approval_id, resume_with="explodes")
        store.answer_approval(approval_id, True, by="alice")
        (outcome,) = resumption.resume_ready()
        assert outcome.status == "failed" and outcome.detail == "RuntimeError: the agent's model is down (line two)"
        assert paused_row(approval_id).error == outcome.detail
        assert resumption.resume_ready() == []  # failed is final: never run again
    finally:
        resumption.unregister("explodes")


def test_resume_runs_help(tmp_path):
    env = script_environment(tmp_path, REFUND_POLICY)
    done = subprocess.run([sys.executable, "manage.py", "resume_runs", "--help"], cwd=REPO,
                          env={**env, "DJANGO_SETTINGS_MODULE": "tests.settings"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    for option in ("--once", "--limit", "--import", "--interval"):
        assert option in done.stdout


# --------------------------------------------------------------------------- the adapters' maps stay bounded


def test_the_openai_request_map_is_bounded(monkeypatch, files):
    from agents import Agent
    from agents.testing import ScriptedModel, assistant_message, function_call

    from ctrlrun.adapters import openai_agents
    from ctrlrun.adapters.openai_agents import guarded_tool

    monkeypatch.setattr(openai_agents, "MAX_REQUESTS", 3)
    tool = guarded_tool(ctrlrun.Control(), "stripe.refund", app.refund, principal="refund-agent")
    calls = [function_call("refund", {"payment_id": f"txn_{n}", "amount": 200_000}, call_id=f"c{n}") for n in range(8)]
    agent = Agent(name="refunds", model=ScriptedModel([calls, [assistant_message("done")]]), tools=[tool])
    result = asyncio.run(Runner.run(agent, "refund them", run_config=RunConfig(tracing_disabled=True)))
    assert len(result.interruptions) == 8
    kept = set(tool.ctrlrun_requests)
    assert len(kept) == 3 and kept < {f"c{n}" for n in range(8)}  # 3 of the 8, not all of them
    assert len(store.list_approvals("pending")) == 8  # the requests themselves are all in the store

    # An evicted call fails closed: granted in ctrlrun, resumed, still not run (a new request is asked).
    evicted = next(f"c{n}" for n in range(8) if f"c{n}" not in kept)
    (request,) = [a for a in store.list_approvals("pending") if a.arguments["payment_id"] == f"txn_{evicted[1:]}"]
    store.answer_approval(request.approval_id, True, by="alice")
    state = result.to_state()
    for item in state.get_interruptions():
        if item.raw_item.call_id == evicted:
            state.approve(item)
        else:
            state.reject(item)
    after = asyncio.run(Runner.run(agent, state, run_config=RunConfig(tracing_disabled=True)))
    outputs = [item.output for item in after.new_items if item.type == "tool_call_output_item"]
    assert any("ctrlrun refused" in output and "approval required" in output for output in outputs), outputs
    assert ledger(files) == [] and store.get_approval(request.approval_id).status == "granted"
    assert len(tool.ctrlrun_requests) <= 3


def test_the_pydantic_ai_pending_map_is_bounded_and_forgets_resolved_calls(monkeypatch, files):
    from pydantic_ai.tools import DeferredToolResults

    from ctrlrun.adapters import pydantic_ai

    monkeypatch.setattr(pydantic_ai, "MAX_PENDING", 3)
    agent = app.pydantic_agent(many=6)  # one turn, six refunds in the approve band
    toolset = agent.ctrlrun_toolset
    paused = agent.run_sync("refund them all")
    assert len(paused.output.approvals) == 6 and len(store.list_approvals("pending")) == 6
    assert len(toolset.pending) == 3  # 3 of the 6, not all of them

    # A call that ran, or was refused for good, leaves the map; one nobody answered stays.
    metadata = paused.output.metadata
    store.answer_approval(metadata["call_5"][pydantic_ai.REQUEST_ID], True, by="alice")
    store.answer_approval(metadata["call_4"][pydantic_ai.REQUEST_ID], False, by="bob")
    approvals = {call.tool_call_id: True for call in paused.output.approvals}
    again = agent.run_sync(message_history=paused.all_messages(),
                           deferred_tool_results=DeferredToolResults(approvals=approvals, metadata=metadata))
    assert len(toolset.pending) <= 3
    assert "call_5" not in toolset.pending and "call_4" not in toolset.pending
    assert [line.split()[1] for line in ledger(files)] == ["txn_5"]
    assert sorted(call.tool_call_id for call in again.output.approvals) == ["call_0", "call_1", "call_2", "call_3"]


def test_resume_ready_takes_at_most_limit_runs_oldest_first(files):
    ids = [pause("pydantic-ai", {"payment_id": f"txn_l{n}", "amount": 500_000}) for n in range(3)]
    for approval_id in ids:
        store.answer_approval(approval_id, True, by="alice")
    with pytest.raises(ctrlrun.InvalidArgument, match="at least 1"):
        resumption.resume_ready(limit=0)
    assert [o.approval_id for o in resumption.resume_ready(limit=2)] == ids[:2]
    assert [o.approval_id for o in resumption.resume_ready(limit=2)] == ids[2:]
    assert sorted(line.split()[1] for line in ledger(files)) == ["txn_l0", "txn_l1", "txn_l2"]
