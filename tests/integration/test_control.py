"""``Control``: the explicit composition, several per process, and the programmatic entry.

A Control is built from a policy file (or a Policy), a database alias, a clock, an approval provider
and observers; ``protect(..., control=)`` and ``Control.call/acall`` run calls under it. These tests
use real policy files and the real store.
"""
from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.approvals import ScriptedApprovalProvider
from ctrlrun.control import Control, default_control
from ctrlrun.models import EffectRecord, PolicyDocument
from ctrlrun.policy import load_policy
from ctrlrun.protect import hook_for
from tests.support import events, receipts

pytestmark = pytest.mark.usefixtures("store_db")

STRICT = """\
schema: ctrlrun.policy/v2

actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    rules:
      - when: { amount_lte: 10 }
        decision: allow
      - decision: deny
"""


@pytest.fixture
def strict(tmp_path):
    path = tmp_path / "strict.yaml"
    path.write_text(STRICT)
    return Control.from_file(path)


def test_from_file_reads_now_and_a_broken_file_fails_there(tmp_path):
    """from_file loads the policy at once: a broken file is a PolicyError at construction."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: ctrlrun.policy/v2\nactions: [1, 2]\n")
    with pytest.raises(ctrlrun.PolicyError):
        Control.from_file(bad)
    with pytest.raises(ctrlrun.InvalidArgument, match="Policy or a path"):
        Control(policy=42)


def test_two_controls_decide_by_their_own_policies(strict):
    """One process, two Controls: the same call is allowed by the default's policy and denied by the
    strict one; each receipt carries its own policy's hash, and both policies are stored."""
    ran = []

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def lenient(payment_id: str, amount: int) -> str:
        ran.append(("default", payment_id))
        return "ok"

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", control=strict)
    def careful(payment_id: str, amount: int) -> str:
        ran.append(("strict", payment_id))
        return "ok"

    with ctrlrun.context(agent="support-agent"):
        assert lenient(payment_id="p1", amount=500) == "ok"
        with pytest.raises(ctrlrun.ActionDenied, match="no_matching_rule|rule"):
            careful(payment_id="p2", amount=500)
        assert careful(payment_id="p3", amount=5) == "ok"
    assert ran == [("default", "p1"), ("strict", "p3")]
    hashes = [r["policy_hash"] for r in receipts()]
    assert hashes[0] == default_control().policy.hash
    assert hashes[1] == hashes[2] == strict.policy.hash != hashes[0]
    assert set(PolicyDocument.objects.values_list("hash", flat=True)) >= {hashes[0], hashes[1]}


def test_hooks_are_registered_per_control(strict, hook_registry):
    """A hook given with control= belongs to that Control, not to the process-wide registry."""
    def hook(key: str) -> str:
        return "committed"

    ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", reconcile=hook, control=strict)(
        lambda payment_id, amount: None)
    assert strict.hook_for("stripe.refund") is hook
    assert hook_for("stripe.refund") is None


def test_call_guards_a_tool_by_name_and_json_arguments():
    """The programmatic entry: the policy decides on the JSON arguments, the effect key dedupes, the
    executor runs once and its value comes back."""
    control = Control()
    ran = []

    def executor() -> dict:
        ran.append(1)
        return {"id": "re_1"}

    args = {"payment_id": "txn_7", "amount": 100}
    assert control.call("stripe.refund", args, executor, principal="support-agent") == {"id": "re_1"}
    with pytest.raises(ctrlrun.DuplicateEffect):
        control.call("stripe.refund", args, executor, principal="support-agent")
    with pytest.raises(ctrlrun.ActionDenied):
        control.call("stripe.refund", {"payment_id": "txn_8", "amount": 10**9}, executor, principal="support-agent")
    with pytest.raises(ctrlrun.ActionDenied, match="unknown_action"):
        control.call("db.drop", {"table": "users"}, executor, principal="support-agent")
    assert ran == [1]
    first = receipts()[0]
    assert (first["action"], first["arguments"], first["principal"]["agent"]) == (
        "stripe.refund", args, "support-agent")


def test_call_uses_the_context_principal_and_refuses_without_one():
    """Without principal=, the call acts for ctrlrun.context(); with neither it is refused, unrecorded."""
    control = Control()
    with pytest.raises(ctrlrun.ActionDenied, match="no principal"):
        control.call("audit.note", {"text": "x"}, lambda: None)
    with ctrlrun.context(agent="auditor", user="u1"):
        control.call("audit.note", {"text": "x"}, lambda: "noted")
    assert [(r["principal"]["agent"], r["principal"]["user"]) for r in receipts()] == [("auditor", "u1")]


@pytest.mark.parametrize("arguments, executor, principal, message", [
    (["not", "a", "mapping"], lambda: None, "a", "arguments must be a mapping"),
    ({1: "x"}, lambda: None, "a", "argument names must be non-empty strings"),
    ({"data_scope": "x"}, lambda: None, "a", "'data_scope' is reserved"),
    ({"text": "x"}, "not callable", "a", "executor must be callable"),
    ({"text": "x"}, lambda: None, "  ", "principal must name the agent"),
    ({"text": "x"}, lambda: None, 7, "principal must be a ctrlrun.Principal"),
])
def test_call_refuses_bad_input_before_anything_is_written(arguments, executor, principal, message):
    """Bad programmatic input is an InvalidArgument naming what is wrong; nothing is recorded."""
    with pytest.raises(ctrlrun.InvalidArgument, match=message):
        Control().call("audit.note", arguments, executor, principal=principal)
    assert receipts() == [] and events() == []


def test_call_with_an_async_executor_needs_acall():
    """call() with an async def executor says to use acall(); acall() awaits it."""
    control = Control()

    async def executor() -> str:
        await asyncio.sleep(0)
        return "sent"

    with pytest.raises(ctrlrun.InvalidArgument, match="acall"):
        control.call("email.send", {"msg_id": "m9"}, executor, principal="mailer")
    assert asyncio.run(control.acall("email.send", {"msg_id": "m9"}, executor, principal="mailer")) == "sent"
    assert EffectRecord.objects.get(pk="email:m9").state == "committed"


def test_evaluate_decides_and_writes_nothing(strict):
    """evaluate() gives the policy's verdict for a name and arguments, and records nothing."""
    assert strict.evaluate("stripe.refund", {"payment_id": "p", "amount": 5}).decision is ctrlrun.Decision.ALLOW
    assert strict.evaluate("stripe.refund", {"payment_id": "p", "amount": 50}).reason == "rule[1]"
    assert strict.evaluate("nope", {}).reason == "unknown_action"
    assert receipts() == [] and events() == [] and not PolicyDocument.objects.filter(hash=strict.policy_hash).exists()


def test_a_controls_clock_dates_its_evidence(clock):
    """Control(clock=...) is the store's clock for that Control's calls only."""
    moment = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    own = Control(clock=lambda: moment)
    own.call("audit.note", {"text": "later"}, lambda: None, principal="a")
    Control().call("audit.note", {"text": "now"}, lambda: None, principal="a")
    started = [r["started_at"] for r in receipts()]
    assert started[0].startswith("2030-01-02T03:04:05")
    assert started[1].startswith(clock.now.strftime("%Y-%m-%dT%H:%M"))


def test_scripted_approvals_drive_wait_true():
    """A scripted provider answers at request time: grant runs the call (once), deny refuses it."""
    control = Control(approvals=ScriptedApprovalProvider(["grant", "deny", "ignore"]))
    ran = []
    args = {"payment_id": "big", "amount": 200_000}
    assert control.call("stripe.refund", args, lambda: ran.append(1) or "ok", principal="a", wait=True) == "ok"
    with pytest.raises(ctrlrun.ActionDenied, match="denied"):
        control.call("stripe.refund", {**args, "payment_id": "big2"}, lambda: ran.append(2), principal="a", wait=True)
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        control.call("stripe.refund", {**args, "payment_id": "big3"}, lambda: ran.append(3), principal="a")
    assert ran == [1]
    assert store.get_approval(asked.value.request_id).status == "pending"  # "ignore" left it for a person


def test_wait_true_times_out_when_nobody_answers(settings):
    """wait=True with an unanswered request ends in ApprovalTimeout once it expires; nothing runs."""
    control = Control(approval_ttl=0.3, approvals=ScriptedApprovalProvider(["ignore"]))
    with pytest.raises(ctrlrun.ApprovalTimeout):
        control.call("stripe.refund", {"payment_id": "slow", "amount": 200_000}, lambda: 1 / 0, principal="a",
                     wait=True)
    assert "APPROVAL_EXPIRED" in events()


def test_policy_object_and_options_are_checked():
    """A Control takes a loaded Policy; bad lease/ttl/observers are refused with the option named."""
    policy = load_policy(default_control().policy.source)
    assert Control(policy).policy.hash == policy.hash
    for options, message in (({"lease": -1}, "lease"), ({"approval_ttl": "soon"}, "approval_ttl"),
                             ({"observers": [object()]}, "on_event"), ({"database": ""}, "DATABASES"),
                             ({"clock": 3}, "clock")):
        with pytest.raises(ctrlrun.InvalidArgument, match=message):
            Control(**options)
    with pytest.raises(ctrlrun.InvalidArgument, match="ctrlrun.Control"):
        ctrlrun.protect("audit.note", control="default")


def test_a_controls_hooks_answer_its_deferred_reconcile(strict, hook_registry):
    """reconcile.run_once(control=...) asks the hook registered on that Control; the default pass
    (which knows only the default's hooks) leaves the record to a person."""
    from ctrlrun import reconcile

    asked = []

    def hook(key: str) -> str:
        asked.append(key)
        return "committed"

    def lose() -> None:
        raise TimeoutError("lost")

    with pytest.raises(TimeoutError):
        strict.call("stripe.refund", {"payment_id": "p9", "amount": 5}, lose, principal="a", reconcile=hook)
    assert [line.outcome for line in reconcile.run_once().lines] == ["needs_human"]
    assert [line.outcome for line in reconcile.run_once(control=strict).lines] == ["committed"]
    assert asked == ["refund:p9"]
    assert EffectRecord.objects.get(pk="refund:p9").state == "committed"


def test_call_refuses_an_unknown_option():
    """A misspelt option of call() is named, with the options there are; nothing is recorded."""
    with pytest.raises(ctrlrun.InvalidArgument, match=r"unknown option\(s\) efect; the options are effect"):
        Control().call("audit.note", {"text": "x"}, lambda: None, principal="a", efect="n:{text}")
    assert receipts() == []
