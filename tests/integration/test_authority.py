"""Authority (policy v3 ``authority:``, §C1/§C4): who may propose what, decided before the policy, on
the real store, through both drivers. Budgets' pre-approval refusals (unkeyed, unmeasurable) too;
the ledger's own tests are in test_budget_ledger.py."""
from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from ctrlrun.models import Approval, EffectRecord, Event
from ctrlrun.policy import parse_policy
from tests.support import events, receipts

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: support
      subject: {agent: "support-*"}
      actions: ["stripe.*"]
      resources: ["payment:*"]
      constraints: {amount_lte: 500000}
    - id: mailer
      subject: {agent: mailer}
      actions: [email.send]
      tasks: ["run-*"]
    - id: temp
      subject: {agent: contractor}
      actions: [stripe.refund]
      resources: ["payment:*"]
      expires_at: "2026-11-29T13:00:00Z"
    - id: metered
      subject: {agent: metered}
      actions: [stripe.refund, audit.note]
      budgets: [{metric: amount, limit: 100000, window: P1D}]
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    rules:
      - when: {amount_lte: 50000}
        decision: allow
      - decision: approve
  email.send:
    decision: allow
  audit.note:
    decision: allow
"""


@pytest.fixture
def control():
    return Control(policy=parse_policy(POLICY))


def test_a_grant_lets_the_call_through_and_is_on_its_evidence(control, drive):
    assert drive(control, "stripe.refund", {"payment_id": "p1", "amount": 40000}, "support-bot") == "done"
    [receipt] = receipts()
    assert (receipt["result"], receipt["authority_grant_id"]) == ("committed", "support")
    assert events(receipt["action_id"])[:3] == ["ACTION_PROPOSED", "AUTHORITY_RESOLVED", "POLICY_EVALUATED"]
    resolved = Event.objects.get(type="AUTHORITY_RESOLVED")
    assert resolved.data == {"reason": "authority_grant", "grant_id": "support"}
    assert store.verify().ok


@pytest.mark.parametrize(("agent", "arguments", "reason", "grant"), [
    ("support-bot", {"payment_id": "p2", "amount": 600000}, "authority_constraint", "support"),
    ("mallory", {"payment_id": "p3", "amount": 1}, "no_authority", None),
    ("contractor", {"payment_id": "p4", "amount": 1}, "authority_expired", "temp"),
])
def test_a_refusal_is_recorded_before_the_policy_is_asked(control, drive, clock, agent, arguments, reason, grant):
    clock.advance(hours=2)  # past 'temp''s expiry (the clock fixture starts at 12:00 on 2026-11-29)
    ran = []
    with pytest.raises(ctrlrun.AuthorityDenied) as refused:
        drive(control, "stripe.refund", arguments, agent, lambda: ran.append(1))
    assert (refused.value.reason, refused.value.grant_id) == (reason, grant)
    assert isinstance(refused.value, ctrlrun.ActionDenied) and ran == []
    [receipt] = receipts()
    assert (receipt["result"], receipt["decision"], receipt["decision_reason"], receipt["error"]) == (
        "denied", "deny", reason, None)
    assert events(receipt["action_id"]) == ["ACTION_PROPOSED", "AUTHORITY_DENIED", "ACTION_DENIED"]
    denied = Event.objects.get(type="AUTHORITY_DENIED")
    assert denied.data == ({"reason": reason, "grant_id": grant} if grant else {"reason": reason})
    assert not Approval.objects.exists() and not EffectRecord.objects.exists()


def test_expiry_uses_the_store_clock(control, drive, clock):
    assert drive(control, "stripe.refund", {"payment_id": "p1", "amount": 1}, "contractor") == "done"
    clock.advance(hours=1)  # exactly the expiry: still valid
    assert drive(control, "stripe.refund", {"payment_id": "p2", "amount": 1}, "contractor") == "done"
    clock.advance(seconds=1)
    with pytest.raises(ctrlrun.AuthorityDenied, match="authority_expired"):
        drive(control, "stripe.refund", {"payment_id": "p3", "amount": 1}, "contractor")


def test_an_approval_never_widens_authority(control, drive):
    """A person's approval is for the policy's approve band; authority is asked first and still refuses."""
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        drive(control, "stripe.refund", {"payment_id": "p1", "amount": 400000}, "support-bot")
    store.answer_approval(asked.value.request_id, True, by="alice")
    with ctrlrun.with_approval(asked.value.request_id):
        assert drive(control, "stripe.refund", {"payment_id": "p1", "amount": 400000}, "support-bot") == "done"
    with ctrlrun.with_approval(asked.value.request_id), pytest.raises(ctrlrun.AuthorityDenied):
        drive(control, "stripe.refund", {"payment_id": "p9", "amount": 400000}, "mallory")
    assert Approval.objects.get(pk=asked.value.request_id).status == "consumed"


def test_tasks_bind_a_grant_to_a_job(control, drive):
    assert drive(control, "email.send", {"to": "a", "run": "7"}, "mailer", task="run-{run}") == "done"
    with pytest.raises(ctrlrun.AuthorityDenied) as refused:
        drive(control, "email.send", {"to": "a"}, "mailer")
    assert (refused.value.reason, refused.value.grant_id) == ("authority_task", "mailer")
    with pytest.raises(ctrlrun.AuthorityDenied):
        drive(control, "email.send", {"to": "a", "run": "7"}, "mailer", task="job-{run}")
    first = receipts()[0]
    assert first["task"] == "run-7"
    started = Event.objects.get(type="EXECUTION_STARTED", action_id=first["action_id"])
    assert started.data["task"] == "run-7"
    # The task is not part of the action: the same call under another task has the same hash.
    hashes = {r["action_hash"] for r in receipts()[:1]} | {
        Event.objects.filter(type="ACTION_PROPOSED").order_by("id")[2].data["action_hash"]}
    assert len(hashes) == 1


def test_a_task_template_that_cannot_render_is_recorded(control, drive):
    with pytest.raises(ctrlrun.EffectKeyError):
        drive(control, "email.send", {"to": "a"}, "mailer", task="run-{run}")
    denied = Event.objects.get(type="ACTION_DENIED")
    assert denied.data["reason"] == "effect_key_error" and denied.data["task"] == "run-{run}"


def test_budget_refusals_before_the_approval_gate(control, drive):
    ran = []
    with pytest.raises(ctrlrun.BudgetRefused) as unmeasurable:
        drive(control, "stripe.refund", {"payment_id": "p1", "amount": "5"}, "metered", lambda: ran.append(1))
    assert unmeasurable.value.reason == "budget_unmeasurable" and isinstance(unmeasurable.value, ctrlrun.InvalidArgument)
    with pytest.raises(ctrlrun.BudgetRefused) as unkeyed:
        drive(control, "audit.note", {"text": "x"}, "metered", lambda: ran.append(1))
    assert unkeyed.value.reason == "budget_unkeyed"
    # The approve band: nobody is asked about a call whose budget cannot be measured.
    with pytest.raises(ctrlrun.BudgetRefused):
        drive(control, "stripe.refund", {"payment_id": "p2", "amount": None}, "metered")
    assert ran == [] and not Approval.objects.exists()
    reasons = [(r["result"], r["decision_reason"]) for r in receipts()]
    assert reasons == [("denied", "budget_unmeasurable"), ("denied", "budget_unkeyed"),
                       ("denied", "budget_unmeasurable")]
    assert Event.objects.filter(type="ACTION_DENIED").first().data["reason"] == "budget_unmeasurable"


def test_observe_mode_runs_what_authority_refuses_and_says_so(drive):
    observing = Control(policy=parse_policy(POLICY.replace("schema: ctrlrun.policy/v7",
                                                           "schema: ctrlrun.policy/v7\nmode: observe")))
    ran = []
    drive(observing, "stripe.refund", {"payment_id": "p1", "amount": 1}, "mallory", lambda: ran.append(1))
    drive(observing, "audit.note", {"text": "x"}, "metered", lambda: ran.append(2))
    assert ran == [1, 2]
    first, second = receipts()
    assert (first["result"], first["execution"], first["would_have"]) == (
        "observed", "committed", {"decision": "deny", "reason": "no_authority", "blocked_reason": "no_authority"})
    assert second["would_have"]["blocked_reason"] == "budget_unkeyed"
    assert events(first["action_id"])[:2] == ["ACTION_PROPOSED", "AUTHORITY_DENIED"]  # still recorded
    assert not Event.objects.filter(type="ACTION_DENIED").exists()


def test_no_authority_section_checks_nothing(drive):
    plain = Control(policy=parse_policy(POLICY.split("authority:")[0] + "actions:" + POLICY.split("actions:")[-1]))
    assert drive(plain, "stripe.refund", {"payment_id": "p1", "amount": 1}, "anyone") == "done"
    assert receipts()[0]["authority_grant_id"] is None
    assert not Event.objects.filter(type__startswith="AUTHORITY").exists()


def test_protect_with_a_task(use_policy):
    use_policy(POLICY)

    @ctrlrun.protect("email.send", task="run-{run_id}")
    def send(to: str, run_id: str) -> str:
        return f"sent to {to}"

    with ctrlrun.context(agent="mailer"):
        assert send(to="a", run_id="42") == "sent to a"
    assert receipts()[0]["task"] == "run-42"


def test_a_swept_attempt_keeps_its_grant_and_task(clock):
    """An async call cancelled while its function runs is left held; once its lease lapses the sweeper
    writes its receipt from what the record kept: the grant and the task are on it."""
    from ctrlrun import reconcile

    control = Control(policy=parse_policy(POLICY))

    started: list[int] = []

    async def slow() -> None:
        started.append(1)
        await asyncio.sleep(60)

    async def cancelled() -> None:
        running = asyncio.create_task(control.acall("stripe.refund", {"payment_id": "p1", "amount": 1}, slow,
                                                    principal="support-bot", task="job-1",
                                                    lease=dt.timedelta(seconds=30)))
        while not started:
            await asyncio.sleep(0.01)
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running

    asyncio.run(cancelled())
    clock.advance(minutes=5)
    report = reconcile.run_once(control=control)
    assert [e.effect_key for e in report.swept] == ["refund:p1"]
    [swept] = receipts()
    assert (swept["result"], swept["authority_grant_id"], swept["task"]) == ("ambiguous", "support", "job-1")


# --------------------------------------------------------------------------- budgets through the kernel


def test_a_budget_caps_spend_across_calls(control, drive, clock):
    def refund(payment_id: str, amount: int, **options):
        return drive(control, "stripe.refund", {"payment_id": payment_id, "amount": amount}, "metered", **options)

    assert refund("p1", 40000) == "done" and refund("p2", 40000) == "done"
    with pytest.raises(ctrlrun.ActionDenied) as exhausted:
        refund("p3", 40000)
    assert exhausted.value.reason == "budget_exhausted" and not isinstance(exhausted.value, ctrlrun.AuthorityDenied)
    assert "80,000 of 100,000" in str(exhausted.value)
    assert refund("p4", 20000) == "done"  # exactly to the limit
    charged = [r["budget_charges"] for r in receipts() if r["result"] == "committed"]
    assert charged[0] == [{"grant_id": "metered", "metric": "amount", "amount": 40000}]
    refused = [r for r in receipts() if r["result"] == "denied"]
    assert refused[0]["decision_reason"] == "budget_exhausted" and refused[0]["budget_charges"] == []
    assert not EffectRecord.objects.filter(pk="refund:p3").exists()  # nothing was taken
    clock.advance(days=1, seconds=1)  # the window slid past the first spends
    assert refund("p5", 50000) == "done" and refund("p6", 50000) == "done"


def test_a_failed_attempt_gives_its_charge_back_an_ambiguous_one_holds_it(control, drive):
    def failing():
        raise ctrlrun.NotExecuted("the remote refused the connection")

    def lost():
        raise TimeoutError("no reply")

    assert drive(control, "stripe.refund", {"payment_id": "p0", "amount": 40000}, "metered") == "done"
    with pytest.raises(ctrlrun.NotExecuted):
        drive(control, "stripe.refund", {"payment_id": "p1", "amount": 50000}, "metered", failing)
    with pytest.raises(TimeoutError):  # the failed one gave its 50,000 back: this one fits, and holds
        drive(control, "stripe.refund", {"payment_id": "p2", "amount": 50000}, "metered", lost)
    with pytest.raises(ctrlrun.ActionDenied) as refused:  # 40,000 spent + 50,000 held + 20,000 > 100,000
        drive(control, "stripe.refund", {"payment_id": "p3", "amount": 20000}, "metered")
    assert refused.value.reason == "budget_exhausted"
    store.resolve("refund:p2", "failed", by="alice", reason="the remote has no such refund")
    assert drive(control, "stripe.refund", {"payment_id": "p3", "amount": 20000}, "metered") == "done"


def test_an_exhausted_budget_still_asks_a_person_and_is_refused_when_the_approved_call_reserves(drive):
    text = POLICY.replace("actions: [stripe.refund, audit.note]\n      budgets: [{metric: amount, limit: 100000",
                          "actions: [stripe.refund, audit.note]\n      budgets: [{metric: amount, limit: 60000")
    control = Control(policy=parse_policy(text))
    assert drive(control, "stripe.refund", {"payment_id": "p1", "amount": 50000}, "metered") == "done"
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:  # 55,000 is the approve band; 10,000 are left
        drive(control, "stripe.refund", {"payment_id": "p2", "amount": 55000}, "metered")
    store.answer_approval(asked.value.request_id, True, by="alice")
    with ctrlrun.with_approval(asked.value.request_id), pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(control, "stripe.refund", {"payment_id": "p2", "amount": 55000}, "metered")
    assert refused.value.reason == "budget_exhausted"
    assert Approval.objects.get(pk=asked.value.request_id).status == "granted"  # not used up


RACER = """
import sys, time
import ctrlrun

@ctrlrun.protect("stripe.refund")
def refund(payment_id: str, amount: int) -> None:
    with open(sys.argv[2], "a") as log:
        log.write(payment_id + "\\n")

start = float(sys.argv[1])
while time.time() < start:
    time.sleep(0.001)
outcomes = []
with ctrlrun.context(agent="metered"):
    for n in range(3):
        try:
            refund(payment_id=f"{sys.argv[3]}-{n}", amount=20000)
            outcomes.append("ran")
        except ctrlrun.ActionDenied as exc:
            outcomes.append(exc.reason)
print(" ".join(outcomes))
"""


def test_eight_processes_racing_for_the_last_of_a_budget_spend_it_exactly_once(tmp_path, use_policy):
    """Room for five refunds of 20,000 (limit 100,000); eight processes try three each at once."""
    import time

    from tests.support import run_together, script_environment

    use_policy(POLICY)
    env = script_environment(tmp_path, POLICY)
    (tmp_path / "racer.py").write_text(RACER)
    log = tmp_path / "ran.log"
    start = time.time() + 4
    outputs = run_together(tmp_path, "racer.py", [[str(start), str(log), f"w{n}"] for n in range(8)], env)
    words = " ".join(outputs).split()
    assert words.count("ran") == 5 and words.count("budget_exhausted") == 19, outputs
    assert len(log.read_text().split()) == 5
    spent = sum(c["amount"] for r in receipts() for c in r["budget_charges"] if r["result"] == "committed")
    assert spent == 100000
    assert store.verify().ok
