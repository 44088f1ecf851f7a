"""Preconditions (``protect(preconditions=...)``, §8.6): an approval is bound to the state of the world
the person saw; if it moved before use, the approval is refused and left granted. Both drivers, the
real store (SQLite, and PostgreSQL with DATABASE_URL)."""
from __future__ import annotations

import asyncio

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.approvals import ScriptedApprovalProvider
from ctrlrun.canonical import canonical_bytes, sha256_hash
from ctrlrun.control import Control
from ctrlrun.models import Approval, EffectRecord
from ctrlrun.policy import parse_policy
from tests.support import approval_url, event, receipts

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  payments.transfer:
    effect: "transfer:{transfer_id}"
    decision: approve
  payments.note:
    decision: approve
  payments.lookup:
    effect: "lookup:{transfer_id}"
    decision: allow
"""


@pytest.fixture
def control():
    return Control(policy=parse_policy(POLICY))


@pytest.fixture(params=["sync", "async"])
def drive(request):
    def call(control: Control, name: str, arguments: dict, executor=lambda: "done", **options):
        if request.param == "sync":
            return control.call(name, arguments, executor, principal="app-agent", **options)

        async def awaited():
            return executor()

        return asyncio.run(control.acall(name, arguments, awaited, principal="app-agent", **options))

    call.kind = request.param
    return call


class Ledger:
    """The world the person looks at: a balance that may move while they decide."""

    def __init__(self, balance: int = 900) -> None:
        self.balance = balance
        self.reads = 0

    def state(self, action) -> dict:
        self.reads += 1
        return {"balance": self.balance, "account": action.arguments["account"]}


def transfer(transfer_id: str = "t1", account: str = "acc_1", amount: int = 500) -> dict:
    return {"transfer_id": transfer_id, "account": account, "amount": amount}


def expected(state: dict) -> str:
    return sha256_hash(canonical_bytes({"schema": "ctrlrun.precondition/v1", "state": state}))


def ask(control, drive, ledger_or_fn, arguments=None, name="payments.transfer") -> str:
    options = {} if ledger_or_fn is None else {
        "preconditions": ledger_or_fn.state if isinstance(ledger_or_fn, Ledger) else ledger_or_fn}
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        drive(control, name, arguments or transfer(), **options)
    return asked.value.request_id


def present(control, drive, request_id, ledger_or_fn, arguments=None, name="payments.transfer", executor=None):
    options = {} if ledger_or_fn is None else {
        "preconditions": ledger_or_fn.state if isinstance(ledger_or_fn, Ledger) else ledger_or_fn}
    with ctrlrun.with_approval(request_id):
        return drive(control, name, arguments or transfer(), executor or (lambda: "done"), **options)


def test_the_request_keeps_the_fingerprint_and_the_same_state_runs(control, drive):
    ledger = Ledger()
    request_id = ask(control, drive, ledger)
    fingerprint = expected({"balance": 900, "account": "acc_1"})
    assert Approval.objects.get(pk=request_id).precondition_fingerprint == fingerprint
    assert store.get_approval(request_id).precondition_fingerprint == fingerprint
    store.answer_approval(request_id, True, by="carol")
    assert present(control, drive, request_id, ledger) == "done"
    [receipt] = receipts()
    assert receipt["result"] == "committed"
    assert receipt["precondition_at_request"] == receipt["precondition_at_recheck"] == fingerprint
    consumed = event("APPROVAL_CONSUMED").data
    assert consumed["precondition_at_request"] == consumed["precondition_at_recheck"] == fingerprint
    assert ledger.reads == 2  # once when asked, once just before the take


def test_a_moved_state_is_refused_and_the_approval_stays_granted(control, drive):
    ledger = Ledger()
    request_id = ask(control, drive, ledger)
    store.answer_approval(request_id, True, by="carol")
    ledger.balance = 100  # the world moved while the person decided
    ran = []
    with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
        present(control, drive, request_id, ledger, executor=lambda: ran.append(1))
    assert refused.value.reason == "precondition_changed" and ran == []
    assert "stays granted" in str(refused.value)
    assert Approval.objects.get(pk=request_id).status == "granted"
    assert not EffectRecord.objects.exists()
    [blocked] = receipts()
    at_request, at_recheck = expected({"balance": 900, "account": "acc_1"}), expected({"balance": 100,
                                                                                       "account": "acc_1"})
    assert (blocked["result"], blocked["precondition_at_request"], blocked["precondition_at_recheck"]) == (
        "blocked", at_request, at_recheck)
    invalidated = event("APPROVAL_INVALIDATED").data
    assert invalidated["reason"] == "precondition_changed"
    assert (invalidated["precondition_at_request"], invalidated["precondition_at_recheck"]) == (at_request, at_recheck)
    ledger.balance = 900  # the state the person saw is back: the same approval runs
    assert present(control, drive, request_id, ledger) == "done"
    assert Approval.objects.get(pk=request_id).status == "consumed"


def test_a_recheck_that_fails_is_unavailable_and_leaves_it_granted(control, drive):
    ledger = Ledger()
    request_id = ask(control, drive, ledger)
    store.answer_approval(request_id, True, by="carol")

    def broken(action):
        raise ConnectionError("ledger service down")

    with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
        present(control, drive, request_id, broken)
    assert refused.value.reason == "precondition_unavailable"
    assert "ConnectionError: ledger service down" in str(refused.value)
    assert Approval.objects.get(pk=request_id).status == "granted"
    [blocked] = receipts()
    assert blocked["result"] == "blocked" and blocked["precondition_at_recheck"] is None
    assert event("APPROVAL_INVALIDATED").data["reason"] == "precondition_unavailable"


def test_a_fingerprint_on_one_side_only_is_missing_never_a_skip(control, drive):
    ledger = Ledger()
    with_state = ask(control, drive, ledger)
    store.answer_approval(with_state, True, by="carol")
    with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
        present(control, drive, with_state, None)  # presented on a call that reads no state
    assert refused.value.reason == "precondition_missing"
    without_state = ask(control, drive, None, transfer("t2"))
    store.answer_approval(without_state, True, by="carol")
    with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
        present(control, drive, without_state, ledger, transfer("t2"))  # the person saw no state
    assert refused.value.reason == "precondition_missing"
    assert {a.status for a in Approval.objects.all()} == {"granted"}
    first, second = receipts()
    assert (first["precondition_at_request"], first["precondition_at_recheck"]) == (
        expected({"balance": 900, "account": "acc_1"}), None)
    assert (second["precondition_at_request"], second["precondition_at_recheck"]) == (
        None, expected({"balance": 900, "account": "acc_1"}))


def test_an_unkeyed_approve_call_is_rechecked_too(control, drive):
    ledger = Ledger()
    note = {"account": "acc_1", "text": "hello"}
    request_id = ask(control, drive, ledger, note, name="payments.note")
    store.answer_approval(request_id, True, by="carol")
    ledger.balance = 1
    with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
        present(control, drive, request_id, ledger, note, name="payments.note")
    assert refused.value.reason == "precondition_changed"
    ledger.balance = 900
    assert present(control, drive, request_id, ledger, note, name="payments.note") == "done"


def test_async_and_sync_preconditions_functions(control, drive):
    balance = {"value": 900}

    async def async_state(action):
        await asyncio.sleep(0)
        return {"balance": balance["value"]}

    def sync_state(action):
        return {"balance": balance["value"]}

    request_id = ask(control, drive, async_state)
    store.answer_approval(request_id, True, by="carol")
    assert present(control, drive, request_id, sync_state) == "done"  # the same state, read either way


def test_an_allowed_call_never_reads_the_state(control, drive):
    ledger = Ledger()
    assert drive(control, "payments.lookup", transfer(), preconditions=ledger.state) == "done"
    assert ledger.reads == 0
    assert receipts()[0]["precondition_at_request"] is None


HOSTILE = {
    "a float": ({"balance": 900.5}, "float"),
    "NaN": ({"balance": float("nan")}, "float"),
    "a non-string key": ({1: "x"}, "mapping keys must be strings"),
    "deep nesting": (None, "nested deeper than"),
    "a huge value": ({"blob": "x" * (2 * 1024 * 1024)}, "larger than"),
    "a bidi override": ({"payee": "txn_1\u202e0001"}, "U+202E RIGHT-TO-LEFT OVERRIDE"),
    "a control character in a key": ({"bal\x07ance": 1}, "a key of the mapping at state"),
    "not a mapping": ([("balance", 900)], "must return a mapping"),
    "None": (None, "must return a mapping"),
    "a raising function": (ZeroDivisionError, "raised ZeroDivisionError"),
}


def _deep() -> dict:
    value: dict = {}
    for _ in range(100):
        value = {"x": value}
    return value


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_state_at_request_is_a_clear_denial_and_no_request(control, drive, case):
    state, words = HOSTILE[case]
    if case == "deep nesting":
        state = _deep()

    def preconditions(action):
        if state is ZeroDivisionError:
            return 1 / 0
        return state

    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(control, "payments.transfer", transfer(), preconditions=preconditions)
    assert refused.value.reason == "precondition_unavailable"
    assert words in str(refused.value) and "Traceback" not in str(refused.value)
    assert not Approval.objects.exists()  # no request was made
    [denied] = receipts()
    assert (denied["result"], denied["decision_reason"]) == ("denied", "precondition_unavailable")
    assert event("ACTION_DENIED").data["reason"] == "precondition_unavailable"


@pytest.mark.parametrize("case", ["a float", "a bidi override", "a raising function"])
def test_hostile_state_at_recheck_is_unavailable(control, drive, case):
    state, words = HOSTILE[case]
    request_id = ask(control, drive, lambda action: {"balance": 900})
    store.answer_approval(request_id, True, by="carol")

    def preconditions(action):
        if state is ZeroDivisionError:
            return 1 / 0
        return state

    with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
        present(control, drive, request_id, preconditions)
    assert refused.value.reason == "precondition_unavailable" and words in str(refused.value)
    assert Approval.objects.get(pk=request_id).status == "granted"


def test_a_hostile_exception_text_is_still_a_clear_refusal(control, drive):
    class Hostile(Exception):
        def __str__(self):
            raise RuntimeError("no text for you")

    def preconditions(action):
        raise Hostile()

    with pytest.raises(ctrlrun.ActionDenied) as refused:
        drive(control, "payments.transfer", transfer(), preconditions=preconditions)
    assert refused.value.reason == "precondition_unavailable" and "raised Hostile" in str(refused.value)


def test_wait_true_rechecks_after_the_person_answers(drive):
    control = Control(policy=parse_policy(POLICY), approvals=ScriptedApprovalProvider(["grant"]))
    ledger = Ledger()
    assert drive(control, "payments.transfer", transfer(), wait=True, preconditions=ledger.state) == "done"
    assert ledger.reads == 2
    [receipt] = receipts()
    assert receipt["precondition_at_request"] == receipt["precondition_at_recheck"] is not None


def test_a_fingerprint_changed_behind_ctrlrun_is_tampered(control, drive):
    ledger = Ledger()
    request_id = ask(control, drive, ledger)
    store.answer_approval(request_id, True, by="carol")
    from ctrlrun import guards
    from django.db import connection

    guards.remove(connection)  # the database's owner (the application's role is refused: test below)
    try:
        Approval.objects.filter(pk=request_id).update(precondition_fingerprint=expected({"balance": 100,
                                                                                        "account": "acc_1"}))
    finally:
        guards.install(connection, guards.CURRENT)
    ledger.balance = 100
    with pytest.raises(ctrlrun.ApprovalMismatch) as refused:
        present(control, drive, request_id, ledger)
    assert refused.value.reason == "tampered"


def test_the_guard_keeps_the_fingerprint_fixed(control, drive):
    request_id = ask(control, drive, Ledger())
    from django.db import DatabaseError, transaction

    with pytest.raises(DatabaseError, match="ctrlrun approvals"), transaction.atomic():
        Approval.objects.filter(pk=request_id).update(precondition_fingerprint=None)
    assert Approval.objects.get(pk=request_id).precondition_fingerprint is not None


def test_preconditions_must_be_callable():
    with pytest.raises(ctrlrun.InvalidArgument, match="preconditions"):
        ctrlrun.protect("payments.transfer", preconditions={"balance": 900})


def test_the_decorator_passes_preconditions(control):
    ledger = Ledger()

    @ctrlrun.protect("payments.transfer", control=control, preconditions=ledger.state)
    def send(transfer_id: str, account: str, amount: int) -> str:
        return "sent"

    with ctrlrun.context(agent="app-agent"), pytest.raises(ctrlrun.ApprovalRequired) as asked:
        send("t1", "acc_1", 500)
    store.answer_approval(asked.value.request_id, True, by="carol")
    ledger.balance = 899
    with ctrlrun.context(agent="app-agent"), ctrlrun.with_approval(asked.value.request_id), \
            pytest.raises(ctrlrun.ApprovalMismatch, match="another state"):
        send("t1", "acc_1", 500)


def test_the_approval_page_shows_the_fingerprint(control, drive, as_role, client):
    bound = ask(control, drive, Ledger())
    unbound = ask(control, drive, None, transfer("t2"))
    as_role("approver")
    page = client.get(approval_url(bound)).content.decode()
    assert expected({"balance": 900, "account": "acc_1"}) in page and "preconditions" in page
    assert "the call reads no state of the world" in client.get(approval_url(unbound)).content.decode()


def test_observe_mode_runs_and_says_the_state_changed(control, drive):
    ledger = Ledger()
    request_id = ask(control, drive, ledger)
    store.answer_approval(request_id, True, by="carol")
    observing = Control(policy=parse_policy(POLICY.replace("schema: ctrlrun.policy/v2",
                                                           "schema: ctrlrun.policy/v3\nmode: observe")))
    ledger.balance = 5
    ran = []
    present(observing, drive, request_id, ledger, executor=lambda: ran.append(1))
    assert ran == [1]
    receipt = receipts()[-1]
    assert (receipt["result"], receipt["would_have"]["blocked_reason"]) == ("observed", "precondition_changed")
    assert receipt["precondition_at_request"] != receipt["precondition_at_recheck"]


def test_a_running_attempt_keeps_both_hashes_for_a_sweeper(control):
    """The call kept on a running attempt's record (what a sweeper writes the receipt from) has both hashes."""
    from ctrlrun.store.chain import stash, unstash

    ledger = Ledger()
    with pytest.raises(ctrlrun.ApprovalRequired) as asked:
        control.call("payments.transfer", transfer(), lambda: "done", principal="app-agent",
                     preconditions=ledger.state)
    store.answer_approval(asked.value.request_id, True, by="carol")
    seen = []

    def executor():  # (sync driver: the function runs where the ORM may be used)
        seen.append(unstash(EffectRecord.objects.get(effect_key="transfer:t1").pending)[0])
        return "done"

    with ctrlrun.with_approval(asked.value.request_id):
        control.call("payments.transfer", transfer(), executor, principal="app-agent", preconditions=ledger.state)
    [kept] = seen
    fingerprint = expected({"balance": 900, "account": "acc_1"})
    assert kept.precondition_at_request == kept.precondition_at_recheck == fingerprint
    again, _, _ = unstash(stash(kept, 1, []).text)
    assert (again.precondition_at_request, again.precondition_at_recheck) == (fingerprint, fingerprint)
