"""The ACS control hook (spec §E5): one protected call split across steps/toolCallRequest and
steps/toolCallResult, joined by Suspended/Control.resume (§A5), on a real store (SQLite, PostgreSQL).

The round trip across two hooks and across two OS processes (the continuation is in the store, not
in a hook), an approval asked then used, every refusal's reason codes, the exit_status table, and
the attacks: malformed, deep, huge and cyclic envelopes, results nobody asked for, replayed results.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import uuid

import pytest

import ctrlrun
from ctrlrun.acs import AcsControlHook
from ctrlrun.control import Control
from ctrlrun.models import Approval, EffectRecord, Event, Receipt
from tests.support import events, receipts, run_command, script_environment
from tests.support.acs import ACS_POLICY, acs_envelope, acs_error, acs_result, tool_call, tool_result

pytestmark = pytest.mark.usefixtures("store_db")


@pytest.fixture
def policy_path(tmp_path):
    path = tmp_path / "acs.yaml"
    path.write_text(ACS_POLICY)
    return path


@pytest.fixture
def hook(policy_path):
    return AcsControlHook(Control.from_file(policy_path))


def state(key):
    return EffectRecord.objects.get(pk=key).state


def both(hook, exit_status="success", tool="create_refund", **arguments):
    request_id = str(uuid.uuid4())
    request = acs_result(hook.handle(tool_call(tool, request_id=request_id, **arguments)))
    assert request["decision"] == "allow", request
    return acs_result(hook.handle(tool_result(request_id, exit_status, tool=tool)))


# --------------------------------------------------------------------------- the round trip


def test_an_allowed_call_is_held_then_committed_by_a_second_hook(policy_path):
    """Request: allow, the key held executing, no receipt. Result through another hook (another
    Control on the same store): committed at attempt 1, the action named acs.<provider>.<tool>, its
    arguments the flattened values, its principal the envelope's agent and user."""
    first = AcsControlHook(Control.from_file(policy_path))
    request_id = str(uuid.uuid4())
    call = tool_call(request_id=request_id, payment_id="txn_9", amount=300)
    answer = first.handle(call)
    result = acs_result(answer)
    assert answer["id"] == call["id"] and result["request_id"] == request_id
    assert result["decision"] == "allow" and result["reasoning"]
    assert result["policy_data"]["ctrlrun"]["effect_key"] == "refund:txn_9"
    assert state("refund:txn_9") == "executing" and Receipt.objects.count() == 0
    assert events()[-1] == "EXECUTION_SUSPENDED"

    second = AcsControlHook(Control.from_file(policy_path))
    closed = acs_result(second.handle(tool_result(request_id)))
    assert closed["decision"] == "allow" and closed["request_id"] != request_id
    assert closed["policy_data"]["ctrlrun"] == {"action": "acs.stripe.create_refund", "effect_key": "refund:txn_9",
                                                "result": "committed"}
    assert state("refund:txn_9") == "committed"
    [receipt] = receipts()
    assert receipt["result"] == "committed" and receipt["attempt"] == 1
    assert receipt["action"] == "acs.stripe.create_refund"
    assert receipt["arguments"] == {"payment_id": "txn_9", "amount": 300}
    assert receipt["principal"]["agent"] == "refund-agent" and receipt["principal"]["user"] == "alice"
    assert events()[-3:] == ["EXECUTION_SUSPENDED", "EXECUTION_RESUMED", "EXECUTION_COMMITTED"]
    from ctrlrun import store

    assert store.verify().ok


RESULT_LEG = """
import json, sys
import ctrlrun
ctrlrun.setup()
from ctrlrun.acs import AcsControlHook
from ctrlrun.control import default_control

envelope = json.loads(sys.argv[1])
print(json.dumps(AcsControlHook(default_control()).handle(envelope)))
"""


def test_the_result_leg_in_another_os_process_finds_the_held_call_in_the_store(tmp_path):
    """The continuation lives in the store: a fresh process (its own hook, Control and connection)
    closes the call the test process held."""
    env = script_environment(tmp_path, ACS_POLICY)
    (tmp_path / "result_leg.py").write_text(RESULT_LEG)
    from ctrlrun.control import default_control
    from tests.support import run_together

    hook = AcsControlHook(default_control())
    request_id = str(uuid.uuid4())
    assert acs_result(hook.handle(tool_call(request_id=request_id)))["decision"] == "allow"
    [out] = run_together(tmp_path, "result_leg.py", [[json.dumps(tool_result(request_id))]], env)
    closed = acs_result(json.loads(out))
    assert closed["policy_data"]["ctrlrun"]["result"] == "committed"
    assert state("refund:txn_1") == "committed"
    assert [r["result"] for r in receipts()] == ["committed"]
    [again] = run_together(tmp_path, "result_leg.py", [[json.dumps(tool_result(request_id))]], env)
    assert acs_error(json.loads(again))["code"] == -32001  # a result closes its call once


RACER = """
import json, sys, time
import ctrlrun
ctrlrun.setup()
from ctrlrun.acs import AcsControlHook
from ctrlrun.control import default_control

start_at, envelope = float(sys.argv[1]), json.loads(sys.argv[2])
hook = AcsControlHook(default_control())
while time.time() < start_at:
    time.sleep(0.001)
print(json.dumps(hook.handle(envelope)))
"""


def test_two_processes_closing_one_call_at_once_exactly_one_records_it(tmp_path):
    """Two results for one request, sent at once from two OS processes (success and blocked): one is
    recorded, the other is -32001, and the record says the winner's outcome."""
    import time

    env = script_environment(tmp_path, ACS_POLICY)
    (tmp_path / "racer.py").write_text(RACER)
    from ctrlrun.control import default_control
    from tests.support import run_together

    request_id = str(uuid.uuid4())
    assert acs_result(AcsControlHook(default_control()).handle(tool_call(request_id=request_id)))["decision"] \
        == "allow"
    start_at = str(time.time() + 4.0)
    outputs = [json.loads(out) for out in run_together(
        tmp_path, "racer.py", [[start_at, json.dumps(tool_result(request_id, status))]
                               for status in ("success", "blocked")], env)]
    won = [o["result"]["policy_data"]["ctrlrun"]["result"] for o in outputs if "result" in o]
    refused = [o["error"]["code"] for o in outputs if "error" in o]
    assert len(won) == 1 and refused == [-32001], outputs
    assert state("refund:txn_1") == won[0]
    assert [r["result"] for r in receipts()] == won


def test_observe_mode_allows_every_request_and_holds_nothing(tmp_path):
    path = tmp_path / "observe.yaml"
    path.write_text(ACS_POLICY.replace("ctrlrun.policy/v2", "ctrlrun.policy/v3\nmode: observe"))
    hook = AcsControlHook(Control.from_file(path))
    request_id = str(uuid.uuid4())
    answer = acs_result(hook.handle(tool_call(payment_id="txn_o", amount=99999999, request_id=request_id)))
    assert answer["decision"] == "allow" and Receipt.objects.count() == 1
    assert not Event.objects.filter(type="EXECUTION_SUSPENDED").exists()
    assert acs_error(hook.handle(tool_result(request_id)))["code"] == -32001


def test_ahandle_is_the_same_round_trip_from_an_event_loop(hook):
    async def scenario():
        request_id = str(uuid.uuid4())
        allowed = acs_result(await hook.ahandle(tool_call(request_id=request_id, payment_id="txn_a", amount=5)))
        closed = acs_result(await hook.ahandle(tool_result(request_id)))
        busy = acs_result(await hook.ahandle(tool_call(payment_id="txn_a", amount=5)))
        return allowed, closed, busy

    allowed, closed, busy = asyncio.run(scenario())
    assert allowed["decision"] == "allow" and closed["policy_data"]["ctrlrun"]["result"] == "committed"
    assert busy["decision"] == "deny" and busy["reason_codes"] == ["ctrlrun.duplicate_effect", "committed"]
    assert state("refund:txn_a") == "committed"


def test_ahandle_asks_then_allows_once_approved(hook):
    call = {"payment_id": "txn_aa", "amount": 200000}
    asked = acs_result(asyncio.run(hook.ahandle(tool_call(**call))))
    assert asked["decision"] == "ask"
    run_command("approve", asked["ask_details"]["context"]["ctrlrun_request_id"], "--by", "ana")
    request_id = str(uuid.uuid4())
    allowed = acs_result(asyncio.run(hook.ahandle(tool_call(request_id=request_id, **call))))
    assert allowed["decision"] == "allow", allowed
    closed = acs_result(asyncio.run(hook.ahandle(tool_result(request_id, "failure"))))
    assert closed["policy_data"]["ctrlrun"]["result"] == "ambiguous" and state("refund:txn_aa") == "ambiguous"


def test_an_operation_is_part_of_the_action_name(policy_path, tmp_path):
    path = tmp_path / "ops.yaml"
    path.write_text("schema: ctrlrun.policy/v2\nactions:\n  acs.stripe.charges.void:\n"
                    "    effect: \"void:{charge}\"\n    decision: allow\n")
    hook = AcsControlHook(Control.from_file(path))
    request_id = str(uuid.uuid4())
    assert acs_result(hook.handle(tool_call("charges", operation="void", request_id=request_id,
                                            charge="ch_1")))["decision"] == "allow"
    acs_result(hook.handle(tool_result(request_id, tool="charges")))
    assert receipts()[-1]["action"] == "acs.stripe.charges.void"
    plain = acs_result(hook.handle(tool_call("charges", charge="ch_2")))
    assert plain["decision"] == "deny" and plain["reason_codes"] == ["unknown_action"]


def test_an_unkeyed_call_is_allowed_outright_and_has_nothing_to_close(hook):
    """No effect key, nothing to hold: the request's receipt is its whole record, and a result for
    it names no held call (-32001)."""
    request_id = str(uuid.uuid4())
    result = acs_result(hook.handle(tool_call("read_balance", request_id=request_id)))
    assert result["decision"] == "allow" and "effect_key" not in result["policy_data"]["ctrlrun"]
    assert [r["action"] for r in receipts()] == ["acs.stripe.read_balance"]
    assert acs_error(hook.handle(tool_result(request_id, tool="read_balance")))["code"] == -32001


# --------------------------------------------------------------------------- ask, then allow


def test_an_approval_is_asked_once_then_the_identical_call_is_allowed(hook):
    """ask with ask_details {approver{type human, id}, question, timeout_seconds, context}; the same
    call re-sent while pending asks about the same request (no second one); once a person approves,
    the identical call is allowed and its result commits; a mutated call is a new question."""
    call = tool_call(payment_id="txn_big", amount=200000)
    asked = acs_result(hook.handle(call))
    assert asked["decision"] == "ask" and asked["reasoning"] and asked["reason_codes"] == ["approval_required"]
    details = asked["ask_details"]
    assert details["approver"] == {"type": "human", "id": "cli:local"} and details["timeout_seconds"] == 900
    approval = details["context"]["ctrlrun_request_id"]
    assert approval.startswith("apr_") and approval in details["question"]
    assert details["context"]["action"] == "acs.stripe.create_refund" and details["context"]["expires_at"]
    assert Approval.objects.get(pk=approval).status == "pending"

    again = acs_result(hook.handle(tool_call(payment_id="txn_big", amount=200000)))
    assert again["decision"] == "ask" and again["ask_details"]["context"]["ctrlrun_request_id"] == approval
    assert Approval.objects.count() == 1

    run_command("approve", approval, "--by", "ana")
    request_id = str(uuid.uuid4())
    allowed = acs_result(hook.handle(tool_call(payment_id="txn_big", amount=200000, request_id=request_id)))
    assert allowed["decision"] == "allow", allowed
    assert Approval.objects.get(pk=approval).consumed_at is not None
    assert acs_result(hook.handle(tool_result(request_id)))["policy_data"]["ctrlrun"]["result"] == "committed"
    once_more = acs_result(hook.handle(tool_call(payment_id="txn_big", amount=200000)))
    assert once_more["decision"] == "deny" and once_more["reason_codes"] == ["ctrlrun.duplicate_effect", "committed"]

    mutated = acs_result(hook.handle(tool_call(payment_id="txn_other", amount=200000)))
    assert mutated["decision"] == "ask" and mutated["ask_details"]["context"]["ctrlrun_request_id"] != approval


def test_a_denied_approval_denies_the_re_sent_call(hook):
    asked = acs_result(hook.handle(tool_call(payment_id="txn_no", amount=300000)))
    approval = asked["ask_details"]["context"]["ctrlrun_request_id"]
    run_command("deny", approval, "--by", "ana")
    denied = acs_result(hook.handle(tool_call(payment_id="txn_no", amount=300000)))
    assert denied["decision"] == "deny" and denied["reason_codes"] == ["approval_denied"]
    assert not EffectRecord.objects.filter(pk="refund:txn_no").exists()


def test_the_hook_options_shape_the_ask(policy_path):
    hook = AcsControlHook(Control.from_file(policy_path), approver_id="slack:#payments", ask_timeout_seconds=60)
    details = acs_result(hook.handle(tool_call(amount=200000)))["ask_details"]
    assert details["approver"] == {"type": "human", "id": "slack:#payments"} and details["timeout_seconds"] == 60


# --------------------------------------------------------------------------- refusals: deny with codes


def test_refusals_deny_with_their_codes(hook):
    unknown = acs_result(hook.handle(tool_call("delete_everything", target="all")))
    assert unknown["decision"] == "deny" and unknown["reason_codes"] == ["unknown_action"] and unknown["reasoning"]
    too_big = acs_result(hook.handle(tool_call(payment_id="txn_x", amount=99999999)))
    assert too_big["decision"] == "deny" and too_big["reason_codes"] == ["rule[2]"]
    assert not EffectRecord.objects.filter(pk="refund:txn_x").exists()

    assert acs_result(hook.handle(tool_call(payment_id="txn_h")))["decision"] == "allow"
    held = acs_result(hook.handle(tool_call(payment_id="txn_h")))
    assert held["decision"] == "deny" and held["reason_codes"] == ["ctrlrun.duplicate_effect", "in_progress"]
    assert held["policy_data"]["ctrlrun"]["effect_key"] == "refund:txn_h"

    both(hook, "timeout", payment_id="txn_t")
    assert state("refund:txn_t") == "ambiguous"
    unclear = acs_result(hook.handle(tool_call(payment_id="txn_t")))
    assert unclear["decision"] == "deny" and unclear["reason_codes"] == ["ctrlrun.ambiguous_effect"]

    floating = acs_result(hook.handle(tool_call(payment_id="txn_f", amount=1.5)))
    assert floating["decision"] == "deny" and floating["reason_codes"] == ["invalid_argument"]
    assert "float" in floating["reasoning"]


AUTHORITY_POLICY = """\
schema: ctrlrun.policy/v3
authority:
  grants:
    - id: refunds
      subject: {agent: refund-agent}
      actions: ["acs.stripe.*"]
actions:
  acs.stripe.create_refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


def test_with_an_authority_the_hook_needs_an_identity_provider(tmp_path):
    path = tmp_path / "authority.yaml"
    path.write_text(AUTHORITY_POLICY)
    with pytest.raises(ctrlrun.InvalidArgument, match="agent_id"):
        AcsControlHook(Control.from_file(path))
    hook = AcsControlHook(Control.from_file(path), identity=ctrlrun.HeaderIdentityProvider("x-agent"))
    nobody = acs_result(hook.handle(tool_call(payment_id="txn_n")))  # metadata.agent_id alone is not trusted
    assert nobody["decision"] == "deny" and nobody["reason_codes"] == ["no_principal"]
    stranger = acs_result(hook.handle(tool_call(payment_id="txn_s"), headers={"X-Agent": "stranger"}))
    assert stranger["decision"] == "deny" and stranger["reason_codes"] == ["no_authority"]
    request_id = str(uuid.uuid4())
    ok = acs_result(hook.handle(tool_call(payment_id="txn_ok", request_id=request_id, agent="spoofed"),
                                headers={"x-agent": "refund-agent"}))
    assert ok["decision"] == "allow", ok
    acs_result(hook.handle(tool_result(request_id), headers={"x-agent": "refund-agent"}))
    assert receipts()[-1]["principal"]["agent"] == "refund-agent"


def test_with_an_identity_provider_only_the_held_calls_principal_closes_it(tmp_path):
    """A result without a credential, or with another agent's, closes nothing: the call stays held
    (a forged 'blocked' would record it failed and let the key run twice)."""
    path = tmp_path / "authority.yaml"
    path.write_text(AUTHORITY_POLICY)
    hook = AcsControlHook(Control.from_file(path), identity=ctrlrun.HeaderIdentityProvider("x-agent"))
    request_id = str(uuid.uuid4())
    ok = acs_result(hook.handle(tool_call(payment_id="txn_h", request_id=request_id),
                                headers={"x-agent": "refund-agent"}))
    assert ok["decision"] == "allow", ok
    for headers in ({}, {"x-agent": "stranger"}):
        refused = hook.handle(tool_result(request_id, "blocked"), headers=headers)
        assert acs_error(refused)["code"] == -32001, refused
        assert state("refund:txn_h") == "executing"
    done = acs_result(hook.handle(tool_result(request_id), headers={"x-agent": "refund-agent"}))
    assert done["decision"] == "allow" and state("refund:txn_h") == "committed", done


def test_an_expired_principal_is_denied_principal_expired(policy_path):
    past = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    hook = AcsControlHook(Control.from_file(policy_path),
                          identity=ctrlrun.StaticIdentityProvider("refund-agent", expires_at=past))
    expired = acs_result(hook.handle(tool_call(payment_id="txn_e")))
    assert expired["decision"] == "deny" and expired["reason_codes"] == ["principal_expired"]
    asked_before = acs_result(hook.handle(tool_call(payment_id="txn_e", amount=200000)))
    assert asked_before["reason_codes"] == ["principal_expired"] and Approval.objects.count() == 0


def test_the_constructor_refuses_what_it_cannot_honour(policy_path, tmp_path):
    control = Control.from_file(policy_path)
    for bad, match in (({"prefix": "A.B"}, "prefix"), ({"approver_id": " "}, "approver_id"),
                       ({"ask_timeout_seconds": 0}, "ask_timeout_seconds"),
                       ({"ask_timeout_seconds": True}, "ask_timeout_seconds"), ({"identity": object()}, "identity")):
        with pytest.raises(ctrlrun.InvalidArgument, match=match):
            AcsControlHook(control, **bad)
    with pytest.raises(ctrlrun.InvalidArgument, match="Control"):
        AcsControlHook(object())
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text("schema: ctrlrun.policy/v8\nactions:\n  acs.stripe.create_refund:\n    decision: allow\n"
                      "    upstream:\n      tool_schema_sha256: \"sha256:" + "a" * 64 + "\"\n")
    with pytest.raises(ctrlrun.InvalidArgument, match="upstream"):
        AcsControlHook(Control.from_file(pinned))
    with pytest.raises(ctrlrun.InvalidArgument, match="headers"):
        AcsControlHook(control).handle(tool_call(), headers={"x": 1})


# --------------------------------------------------------------------------- the result's exit_status


@pytest.mark.parametrize(("exit_status", "tool", "key", "expected"), [
    ("success", "create_refund", "refund:txn_1", "committed"),
    ("blocked", "create_refund", "refund:txn_1", "failed"),
    ("failure", "create_refund", "refund:txn_1", "ambiguous"),
    ("timeout", "create_refund", "refund:txn_1", "ambiguous"),
    ("failure", "reports_before_acting", "report:txn_1", "failed"),
    ("timeout", "reports_before_acting", "report:txn_1", "ambiguous"),
    ("success", "reports_before_acting", "report:txn_1", "committed"),
])
def test_exit_status_maps_to_the_recorded_outcome(hook, exit_status, tool, key, expected):
    closed = both(hook, exit_status, tool=tool, payment_id="txn_1")
    assert closed["decision"] == "allow" and closed["policy_data"]["ctrlrun"]["result"] == expected
    assert state(key) == expected
    assert [r["result"] for r in receipts()] == [expected]


def test_a_failed_call_can_run_again_and_an_ambiguous_one_cannot(hook):
    both(hook, "blocked", payment_id="txn_r")
    assert acs_result(hook.handle(tool_call(payment_id="txn_r")))["decision"] == "allow"


def test_a_result_naming_another_tool_is_recorded_ambiguous(hook):
    request_id = str(uuid.uuid4())
    acs_result(hook.handle(tool_call(request_id=request_id, payment_id="txn_m")))
    closed = acs_result(hook.handle(tool_result(request_id, "success", tool="read_balance")))
    assert closed["policy_data"]["ctrlrun"]["result"] == "ambiguous" and state("refund:txn_m") == "ambiguous"


# --------------------------------------------------------------------------- results nobody asked for


def test_results_that_close_no_call_are_minus_32001_and_write_nothing(hook):
    written = Event.objects.count()
    for envelope in (tool_result(str(uuid.uuid4())), tool_result(None)):
        error = acs_error(hook.handle(envelope))
        assert error["code"] == -32001 and error["message"]
    unknown = acs_error(hook.handle(acs_envelope("steps/sessionStart", {})))
    assert unknown["code"] == -32001 and "steps/toolCallRequest" in unknown["message"]
    assert Event.objects.count() == written


def test_a_replayed_result_is_refused(hook):
    request_id = str(uuid.uuid4())
    acs_result(hook.handle(tool_call(request_id=request_id)))
    acs_result(hook.handle(tool_result(request_id)))
    written = Event.objects.count()
    for status in ("success", "blocked"):
        replay = acs_error(hook.handle(tool_result(request_id, status)))
        assert replay["code"] == -32001 and "no held suspension" in replay["message"]
    assert Event.objects.count() == written and state("refund:txn_1") == "committed"


def test_a_result_cannot_resume_another_integrations_continuation(hook, policy_path):
    """Its request_id_ref resumes only ``acs:``-prefixed continuations: a call suspended elsewhere under
    the same text stays held."""
    control = Control.from_file(policy_path)

    def executor():
        raise ctrlrun.Suspended("job-42")

    with pytest.raises(ctrlrun.Suspended):
        control.call("acs.stripe.create_refund", {"payment_id": "txn_j", "amount": 5}, executor, principal="x")
    assert acs_error(hook.handle(tool_result("job-42")))["code"] == -32001
    assert state("refund:txn_j") == "executing"


# --------------------------------------------------------------------------- malformed envelopes


def _deep(levels):
    value: object = "x"
    for _ in range(levels):
        value = [value]
    return value


def _cyclic():
    envelope = tool_call()
    envelope["params"]["payload"]["arguments"]["loop"] = {"value": envelope}
    return envelope


def _with(path, value, base=None):
    envelope = base or tool_call()
    target = envelope
    for step in path[:-1]:
        target = target[step]
    if value is _DROP:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return envelope


_DROP = object()

MALFORMED = {
    "not an object": [1, 2],
    "a string": "steps/toolCallRequest",
    "None": None,
    "empty": {},
    "wrong jsonrpc": _with(("jsonrpc",), "1.0"),
    "no id": _with(("id",), _DROP),
    "boolean id": _with(("id",), True),
    "object id": _with(("id",), {"a": 1}),
    "method not a string": _with(("method",), 7),
    "params a list": _with(("params",), []),
    "no acs_version": _with(("params", "acs_version"), _DROP),
    "acs_version 9.0.0": _with(("params", "acs_version"), "9.0.0"),
    "request_id a number": _with(("params", "request_id"), 12),
    "request_id empty": _with(("params", "request_id"), ""),
    "request_id with a newline": _with(("params", "request_id"), "a\nb"),
    "request_id huge": _with(("params", "request_id"), "r" * 5000),
    "no timestamp": _with(("params", "timestamp"), _DROP),
    "metadata a string": _with(("params", "metadata"), "agent"),
    "no agent_id": _with(("params", "metadata", "agent_id"), _DROP),
    "agent_id a number": _with(("params", "metadata", "agent_id"), 5),
    "user_id a list": _with(("params", "metadata", "user_context", "user_id"), ["alice"]),
    "payload a list": _with(("params", "payload"), []),
    "tool a string": _with(("params", "payload", "tool"), "create_refund"),
    "tool name a number": _with(("params", "payload", "tool", "name"), 3),
    "tool name with a dot": _with(("params", "payload", "tool", "name"), "create.refund"),
    "no provider": _with(("params", "payload", "tool", "provider"), _DROP),
    "operation a number": _with(("params", "payload", "operation"), 1),
    "arguments a list": _with(("params", "payload", "arguments"), []),
    "a bare argument": _with(("params", "payload", "arguments", "amount"), 200),
    "an argument without value": _with(("params", "payload", "arguments", "amount"), {"provenance": {}}),
    "deep value": _with(("params", "payload", "arguments", "amount"), {"value": _deep(500)}),
    "huge value": _with(("params", "payload", "arguments", "amount"), {"value": "x" * (2 * 1024 * 1024)}),
    "many keys": _with(("params", "payload", "arguments", "amount"),
                       {"value": {str(i): i for i in range(400_000)}}),
    "a cycle": _cyclic(),
    "not JSON (a set)": _with(("params", "payload", "arguments", "amount"), {"value": {1, 2}}),
    "not JSON (int keys)": _with(("params", "payload", "arguments", "amount"), {"value": {1: 2}}),
    "exit_status unknown": tool_result("r-1", "exploded"),
    "outputs missing": _with(("params", "payload", "outputs"), _DROP, tool_result("r-1")),
    "outputs an object": _with(("params", "payload", "outputs"), {}, tool_result("r-1")),
    "request_id_ref a number": _with(("params", "payload", "request_id_ref"), 4, tool_result("r-1")),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_envelope_is_minus_32002_never_a_traceback(hook, case):
    written = Event.objects.count()
    answer = hook.handle(MALFORMED[case])
    error = answer["error"]
    assert error["code"] == -32002 and error["message"], answer
    assert answer["jsonrpc"] == "2.0" and "result" not in answer
    json.dumps(answer)
    assert Event.objects.count() == written


def test_a_malformed_envelope_echoes_its_id_when_it_has_a_usable_one(hook):
    assert hook.handle(_with(("params", "payload"), [], tool_call()))["id"] == 1
    assert hook.handle({"jsonrpc": "2.0", "id": {"x": 1}})["id"] is None


def test_ahandle_refuses_malformed_envelopes_the_same_way(hook):
    answer = asyncio.run(hook.ahandle(MALFORMED["deep value"]))
    assert answer["error"]["code"] == -32002


# --------------------------------------------------------------------------- the Django endpoint


@pytest.fixture
def endpoint(use_policy, client, settings):
    settings.ROOT_URLCONF = "tests.support.acs_urls"
    use_policy(ACS_POLICY)

    def post(path, body, **extra):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return client.post(path, data=data, content_type="application/json", **extra)

    return post


def test_the_endpoint_answers_posted_envelopes(endpoint, client):
    request_id = str(uuid.uuid4())
    allowed = endpoint("/acs", tool_call(request_id=request_id, payment_id="txn_w"))
    assert allowed.status_code == 200 and acs_result(allowed.json())["decision"] == "allow"
    closed = endpoint("/acs", tool_result(request_id))
    assert acs_result(closed.json())["policy_data"]["ctrlrun"]["result"] == "committed"
    assert state("refund:txn_w") == "committed"
    asked = endpoint("/acs-small", tool_call(payment_id="txn_v", amount=200000))
    assert acs_result(asked.json())["ask_details"]["approver"]["id"] == "console"
    assert client.get("/acs").status_code == 405


@pytest.mark.parametrize("body", [b"{not json", b"", b"[" * 100_000 + b"]" * 100_000, b'{"a": NaN}',
                                  "\ufeff{}".encode(), b"\xff\xfe", json.dumps(_deep(200)).encode()])
def test_the_endpoint_answers_bad_bodies_minus_32002(endpoint, body):
    written = Event.objects.count()
    answer = endpoint("/acs", body)
    assert answer.status_code == 200
    assert acs_error(answer.json())["code"] == -32002
    assert Event.objects.count() == written


def test_the_endpoint_bounds_the_body(endpoint):
    big = tool_call(payment_id="txn_b", note="x" * 4096)
    refused = endpoint("/acs-small", big)
    assert refused.status_code == 413 and refused.json()["error"]["code"] == -32002
    assert not EffectRecord.objects.filter(pk="refund:txn_b").exists()
    with pytest.raises(ctrlrun.InvalidArgument, match="max_body_bytes"):
        from ctrlrun.views import acs_endpoint

        acs_endpoint(max_body_bytes=10)


def test_a_forged_held_call_is_not_closed(hook):
    """A continuation row rewritten around ctrlrun (to a token an attacker knows) fails its signature:
    the result is -32001 and the held call stays held."""
    from ctrlrun import store
    from ctrlrun.models import Continuation

    acs_result(hook.handle(tool_call(payment_id="txn_g")))
    forged = "11111111-2222-4333-8444-555555555555"
    Continuation.objects.filter(pk="refund:txn_g").update(continuation=store.continuations.digest("acs:" + forged))
    error = acs_error(hook.handle(tool_result(forged)))
    assert error["code"] == -32001 and "signature" in error["message"]
    assert state("refund:txn_g") == "executing" and Receipt.objects.count() == 0


def test_a_result_after_the_hold_lapsed_is_refused_and_the_call_is_ambiguous(policy_path):
    from django.utils import timezone

    from ctrlrun import store

    moment = [timezone.now()]
    control = Control(policy_path, clock=lambda: moment[0], suspend_timeout=dt.timedelta(minutes=5),
                      lease=dt.timedelta(seconds=30))
    hook = AcsControlHook(control)
    request_id = str(uuid.uuid4())
    acs_result(hook.handle(tool_call(request_id=request_id, payment_id="txn_l")))
    moment[0] += dt.timedelta(minutes=6)
    error = acs_error(hook.handle(tool_result(request_id)))
    assert error["code"] == -32001 and "lapsed" in error["message"]
    with control.scope():
        store.sweep_lapsed()
    assert state("refund:txn_l") == "ambiguous"
    unclear = acs_result(hook.handle(tool_call(payment_id="txn_l")))
    assert unclear["reason_codes"] == ["ctrlrun.ambiguous_effect"]
