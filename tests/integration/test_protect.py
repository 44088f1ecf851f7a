"""One protected call end to end on a real database: decisions, the retry table (§5.3) and
the outcome mapping (§5.4), with the events and receipts each leaves behind."""
from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.models import EffectRecord, Event, Receipt
from tests.support import events, hold_key, receipts

pytestmark = pytest.mark.usefixtures("store_db")


# --------------------------------------------------------------------------- decisions


def test_allowed_call_returns_value_and_commits(refund, remote, agent):
    """An allowed call runs once, returns the function's value and leaves a committed record."""
    assert refund(payment_id="txn_1", amount=100) == {"id": "re_txn_1", "amount": 100}
    assert remote.calls == [("txn_1", 100)]
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.attempt, record.lease_expires_at) == ("committed", 1, None)
    assert json.loads(record.result_json) == {"id": "re_txn_1", "amount": 100}
    assert events() == ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED", "EXECUTION_STARTED",
                        "EXECUTION_COMMITTED"]
    [doc] = receipts()
    assert (doc["result"], doc["decision"], doc["decision_reason"], doc["attempt"]) == ("committed", "allow", "rule[0]", 1)
    assert doc["arguments"] == {"amount": 100, "payment_id": "txn_1"}
    assert doc["seq"] == 1 and doc["prev_hash"] == "sha256:" + "0" * 64


def test_allowed_call_costs_two_write_transactions(refund, agent, monkeypatch):
    """Reserve and outcome are the only two transactions of an allowed call."""
    refund(payment_id="warm", amount=1)  # the policy row is stored once per process
    phases = []
    original = store.base.write_phase

    def counting(**options):
        phases.append(1)
        return original(**options)

    for module in (store.effects, store.chain, store.approvals, store.policies, store.evidence):  # every phase opener
        if hasattr(module, "write_phase"):
            monkeypatch.setattr(module, "write_phase", counting)
    refund(payment_id="txn_2", amount=1)
    assert len(phases) == 2


def test_policy_deny_records_denied_receipt(refund, remote, agent):
    """Above every band the call is denied: ActionDenied, no execution, a denied receipt."""
    with pytest.raises(ctrlrun.ActionDenied) as caught:
        refund(payment_id="txn_big", amount=10**9)
    assert caught.value.reason == "no_matching_rule" or caught.value.reason.startswith("rule[")
    assert remote.calls == []
    assert not EffectRecord.objects.exists()
    assert events()[-1] == "ACTION_DENIED"
    [doc] = receipts()
    assert (doc["result"], doc["decision"], doc["error"]) == ("denied", "deny", None)
    assert doc["action_id"] == caught.value.action_id


def test_unknown_action_is_denied(agent):
    """An action the policy does not list is denied with reason unknown_action."""
    @ctrlrun.protect("db.drop_table", effect="drop:{table}")
    def drop(table: str) -> None:
        raise AssertionError("must not run")

    with pytest.raises(ctrlrun.ActionDenied) as caught:
        drop(table="users")
    assert caught.value.reason == "unknown_action"
    assert "add one under 'actions:'" in str(caught.value)
    assert receipts()[0]["decision_reason"] == "unknown_action"


def test_no_principal_records_nothing(refund, remote):
    """Outside context() the call is refused before anything is written."""
    with pytest.raises(ctrlrun.ActionDenied) as caught:
        refund(payment_id="txn_1", amount=1)
    assert caught.value.reason == "no_principal"
    assert remote.calls == [] and not Event.objects.exists() and not Receipt.objects.exists()


def test_float_argument_refused_without_evidence(refund, agent):
    """A float argument is InvalidArgument naming the path, with no event and no receipt."""
    with pytest.raises(ctrlrun.InvalidArgument, match=r"arguments\.amount"):
        refund(payment_id="txn_1", amount=1.5)
    assert not Event.objects.exists() and not Receipt.objects.exists()


def test_effect_key_error_is_recorded(agent):
    """An effect template that cannot render is EffectKeyError, recorded as a denial before policy."""
    @ctrlrun.protect("email.send", effect="email:{msg_id}")
    def send(msg_id: str | None) -> None:
        raise AssertionError("must not run")

    with pytest.raises(ctrlrun.EffectKeyError) as caught:
        send(msg_id=None)
    assert not isinstance(caught.value, ctrlrun.ActionDenied)
    assert events() == ["ACTION_PROPOSED", "ACTION_DENIED"]
    denied = Event.objects.get(type="ACTION_DENIED").data
    assert denied["reason"] == "effect_key_error" and denied["effect"] == "email:{msg_id}"
    [doc] = receipts()
    assert (doc["result"], doc["decision_reason"], doc["effect_key"]) == ("denied", "effect_key_error", None)
    assert doc["error"] == str(caught.value)


def test_positional_arguments_bound_with_defaults(agent):
    """Positional arguments become named ones and defaults are included in the action."""
    seen = []

    @ctrlrun.protect("audit.note")
    def note(text: str, level: int = 5, tag: str = "zz") -> str:
        seen.append((text, level, tag))
        return "ok"

    assert note("hello") == "ok"
    assert seen == [("hello", 5, "zz")]
    assert receipts()[0]["arguments"] == {"level": 5, "tag": "zz", "text": "hello"}
    assert receipts()[0]["effect_key"] is None


def test_executor_receives_a_fresh_copy(agent):
    """The function may mutate its arguments; the receipt keeps what was proposed."""
    @ctrlrun.protect("audit.note")
    def note(items: list) -> None:
        items.append("mutated")

    original = ["a"]
    note(items=original)
    assert original == ["a"]
    assert receipts()[0]["arguments"] == {"items": ["a"]}


# --------------------------------------------------------------------------- §5.3 what a new attempt meets


def test_committed_key_refused_as_duplicate(refund, remote, agent):
    """A committed key refuses the retry: DuplicateEffect(committed) and a blocked receipt."""
    refund(payment_id="txn_1", amount=100)
    with pytest.raises(ctrlrun.DuplicateEffect) as caught:
        refund(payment_id="txn_1", amount=100)
    assert (caught.value.state, caught.value.effect_key) == ("committed", "refund:txn_1")
    assert remote.calls == [("txn_1", 100)]
    refused = Event.objects.filter(type="EFFECT_RESERVATION_REFUSED").get()
    assert refused.data == {"reason": "duplicate", "state": "committed"}
    blocked = receipts()[-1]
    assert (blocked["result"], blocked["decision"], blocked["attempt"]) == ("blocked", "allow", 1)
    assert blocked["error"] == str(caught.value)


def test_live_lease_refused_as_in_progress(refund, remote, agent, clock):
    """A key held under a live lease refuses the retry as DuplicateEffect(in_progress)."""
    hold_key("refund:txn_1")
    with pytest.raises(ctrlrun.DuplicateEffect) as caught:
        refund(payment_id="txn_1", amount=100)
    assert caught.value.state == "in_progress"
    assert remote.calls == []
    assert Event.objects.filter(type="EFFECT_RESERVATION_REFUSED").get().data == {"reason": "duplicate",
                                                                                  "state": "in_progress"}


def test_lapsed_lease_becomes_ambiguous_and_refuses(refund, remote, agent, clock):
    """A lapsed lease turns the record ambiguous (kept) and refuses with AmbiguousEffect."""
    hold_key("refund:txn_1")
    clock.advance(minutes=6)
    with pytest.raises(ctrlrun.AmbiguousEffect) as caught:
        refund(payment_id="txn_1", amount=100)
    assert "lease expired" in str(caught.value)
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert record.state == "ambiguous" and record.lease_expires_at is None
    assert remote.calls == []
    assert receipts()[-1]["result"] == "blocked"


def test_ambiguous_key_refuses_retry(refund, remote, agent):
    """After a lost reply the key is AMBIGUOUS and every retry is refused, never run."""
    remote.fail_with = TimeoutError("read timed out")
    with pytest.raises(TimeoutError):
        refund(payment_id="txn_1", amount=100)
    remote.fail_with = None
    with pytest.raises(ctrlrun.AmbiguousEffect) as caught:
        refund(payment_id="txn_1", amount=100)
    assert "'python manage.py resolve refund:txn_1" in str(caught.value)  # in a project: manage.py (issue 25)
    assert remote.calls == [("txn_1", 100)]
    blocked = receipts()[-1]
    assert blocked["result"] == "blocked"
    assert Event.objects.filter(type="EFFECT_RESERVATION_REFUSED").get().data == {"reason": "ambiguous"}


def test_failed_key_renews_with_next_attempt(refund, remote, agent):
    """NotExecuted leaves the key failed; the retry renews it at attempt 2 and runs."""
    remote.fail_with = ctrlrun.NotExecuted("connection refused before any byte was sent")
    with pytest.raises(ctrlrun.NotExecuted):
        refund(payment_id="txn_1", amount=100)
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "failed"
    remote.fail_with = None
    refund(payment_id="txn_1", amount=100)
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.attempt, record.error) == ("committed", 2, None)
    assert [d["attempt"] for d in receipts()] == [1, 2]
    assert remote.calls == [("txn_1", 100), ("txn_1", 100)]


# --------------------------------------------------------------------------- §5.4 executor outcomes


def test_not_executed_is_failed(refund, remote, agent):
    """NotExecuted: row failed, EXECUTION_FAILED with the message, failed receipt, re-raised."""
    remote.fail_with = ctrlrun.NotExecuted("smtp refused before DATA")
    with pytest.raises(ctrlrun.NotExecuted):
        refund(payment_id="txn_1", amount=100)
    assert Event.objects.get(type="EXECUTION_FAILED").data == {"error": "smtp refused before DATA"}
    doc = receipts()[-1]
    assert (doc["result"], doc["error"]) == ("failed", "smtp refused before DATA")


def test_other_exception_is_ambiguous(refund, remote, agent):
    """Any other exception: row ambiguous with '<Type>: <msg>', ambiguous receipt, re-raised as is."""
    remote.fail_with = ConnectionResetError("peer reset")
    with pytest.raises(ConnectionResetError):
        refund(payment_id="txn_1", amount=100)
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.error) == ("ambiguous", "ConnectionResetError: peer reset")
    assert receipts()[-1]["result"] == "ambiguous"
    assert receipts()[-1]["error"] == "ConnectionResetError: peer reset"


def test_keyboard_interrupt_is_ambiguous_and_reraised(refund, remote, agent):
    """A BaseException (KeyboardInterrupt) also leaves the key ambiguous and propagates."""
    remote.fail_with = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        refund(payment_id="txn_1", amount=100)
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.error) == ("ambiguous", "KeyboardInterrupt: ")


def test_unkeyed_call_maps_outcomes_without_a_record(agent):
    """Without an effect key the outcome mapping holds but no record is written."""
    @ctrlrun.protect("audit.note")
    def note(text: str) -> None:
        raise TimeoutError("lost")

    with pytest.raises(TimeoutError):
        note(text="x")
    assert not EffectRecord.objects.exists()
    assert receipts()[-1]["result"] == "ambiguous"
    assert events()[-1] == "EXECUTION_AMBIGUOUS"


def test_outcome_write_refused_after_lease_lapsed(remote, agent, clock):
    """If a contender declared the row ambiguous meanwhile, a return is reported ambiguous, never success."""
    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", lease=dt.timedelta(seconds=10))
    def slow_refund(payment_id: str, amount: int) -> dict:
        clock.advance(seconds=30)  # the lease lapses while the remote is slow
        with ctrlrun.context(agent="contender"):
            with pytest.raises(ctrlrun.AmbiguousEffect):
                fast_refund(payment_id=payment_id, amount=amount)
        return remote.refund(payment_id, amount)

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    def fast_refund(payment_id: str, amount: int) -> dict:
        raise AssertionError("the contender must not run")

    with pytest.raises(ctrlrun.AmbiguousEffect) as caught:
        slow_refund(payment_id="txn_1", amount=100)
    assert "could not be recorded" in str(caught.value)
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"
    doc = receipts()[-1]
    assert doc["result"] == "ambiguous"
    assert doc["error"].startswith("the function returned, so the remote may well have acted")


def test_idempotency_token_inside_executor_only(agent):
    """idempotency_token() is stable for the key across attempts; per_attempt=True changes with each."""
    tokens = []

    @ctrlrun.protect("email.send", effect="email:{msg_id}")
    def send(msg_id: str, fail: bool = False) -> None:
        tokens.append((ctrlrun.idempotency_token(), ctrlrun.idempotency_token(per_attempt=True)))
        if fail:
            raise ctrlrun.NotExecuted("connection refused before sending")

    with pytest.raises(ctrlrun.NotExecuted):
        send(msg_id="m1", fail=True)
    send(msg_id="m1")
    from ctrlrun.canonical import idempotency_token_for

    stable = idempotency_token_for("email:m1")
    assert tokens == [(stable, idempotency_token_for("email:m1", 1)), (stable, idempotency_token_for("email:m1", 2))]
    assert idempotency_token_for("email:m1", 1) != idempotency_token_for("email:m1", 2) != stable
    with pytest.raises(ctrlrun.InvalidArgument, match="only inside an executor"):
        ctrlrun.idempotency_token()


def test_sync_wrapper_around_async_function_is_not_recorded_committed(agent):
    """A wrapper that returns an unawaited coroutine is refused and recorded failed, never committed."""
    ran = []

    async def pay(payment_id: str, amount: int) -> str:
        ran.append(payment_id)
        return "paid"

    @functools.wraps(pay)
    def looks_sync(payment_id: str, amount: int):
        return pay(payment_id=payment_id, amount=amount)

    refund = ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")(looks_sync)
    with pytest.raises(ctrlrun.InvalidArgument, match="returned an awaitable"):
        refund(payment_id="txn_1", amount=100)
    assert ran == []  # the coroutine was closed unrun
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert record.state == "failed"
    assert receipts()[-1]["result"] == "failed"
    asyncio.run(asyncio.sleep(0))  # no "coroutine was never awaited" left behind to fail later


@pytest.mark.parametrize("raised", [ctrlrun.NotExecuted("refused \udcff"), TimeoutError("lost \udcff")])
def test_unencodable_exception_text_is_still_recorded(refund, remote, agent, raised):
    """A lone surrogate in an exception message is stored escaped; the outcome and receipt are written."""
    remote.fail_with = raised
    with pytest.raises(type(raised)):
        refund(payment_id="txn_1", amount=100)
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert record.state == ("failed" if isinstance(raised, ctrlrun.NotExecuted) else "ambiguous")
    assert "\\udcff" in record.error
    assert "\\udcff" in receipts()[-1]["error"]


# --------------------------------------------------------------------------- decoration-time validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reconcile": 3}, "reconcile must be callable"),
        ({"reconcile_eagerly": True}, "no reconcile= hook"),
        ({"lease": 30}, "lease must be a timedelta"),
        ({"lease": dt.timedelta(0)}, "lease must be positive"),
        ({"effect": "e:{x"}, "not a valid template"),
        ({"effect": "policy:{x}"}, "reserved"),
    ],
)
def test_decoration_errors(kwargs, message):
    """Wiring mistakes fail when the function is decorated, with a message saying what is wrong."""
    with pytest.raises(ctrlrun.InvalidArgument, match=message):
        ctrlrun.protect("a", **kwargs)


def test_async_and_varargs_refused():
    """Generators (sync and async) and *args are refused at decoration (an async def is protected)."""
    async def agen(x: int):
        yield x

    def gen(x: int):
        yield x

    def star(*args): ...

    for fn, message in ((agen, "generator"), (gen, "generator"), (star, r"\*args")):
        with pytest.raises(ctrlrun.InvalidArgument, match=message):
            ctrlrun.protect("a")(fn)


def test_call_inside_open_transaction_refused(refund, agent):
    """A protected call inside the caller's transaction is refused: its evidence would roll back."""
    from django.db import transaction

    with transaction.atomic():
        with pytest.raises(ctrlrun.InvalidArgument, match="open transaction"):
            refund(payment_id="txn_1", amount=1)
