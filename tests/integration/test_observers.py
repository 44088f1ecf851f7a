"""Observers and Django signals: told what was written, after it committed, never able to break a call."""
from __future__ import annotations

import asyncio
import logging

import pytest
from django.db import connections

import ctrlrun
from ctrlrun import observers, signals, store
from ctrlrun.control import Control
from tests.support import make_ambiguous

pytestmark = pytest.mark.usefixtures("store_db")


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, bool]] = []
        self.receipts: list[str] = []

    def on_event(self, event) -> None:
        # Outside any transaction, and the row is already visible to the store's reads.
        in_transaction = connections[store.alias()].in_atomic_block
        self.events.append((event.type, in_transaction))

    def on_receipt(self, receipt) -> None:
        self.receipts.append(receipt["result"])


def test_a_controls_observers_hear_each_event_after_commit():
    """A Control's observers get the events of its calls in order, and the receipt, never inside a transaction."""
    recorder = Recorder()
    control = Control(observers=[recorder])
    control.call("email.send", {"msg_id": "m1"}, lambda: "sent", principal="mailer")
    assert [t for t, _ in recorder.events] == ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED",
                                               "EXECUTION_STARTED", "EXECUTION_COMMITTED"]
    assert not any(inside for _, inside in recorder.events)
    assert recorder.receipts == ["committed"]
    # Another Control's calls are not this observer's business.
    Control().call("email.send", {"msg_id": "m2"}, lambda: "sent", principal="mailer")
    assert recorder.receipts == ["committed"]


def test_an_observer_that_raises_is_logged_and_the_call_goes_on(caplog):
    """A failing observer cannot fail the call; the next observer still hears everything."""
    class Broken:
        def on_event(self, event):
            raise RuntimeError("pager down")

    recorder = Recorder()
    control = Control(observers=[Broken(), recorder])
    with caplog.at_level(logging.ERROR, logger="ctrlrun.observers"):
        assert control.call("email.send", {"msg_id": "m3"}, lambda: "sent", principal="mailer") == "sent"
    assert "pager down" in caplog.text
    assert recorder.receipts == ["committed"] and len(recorder.events) == 5


def test_process_observers_hear_a_person_approving():
    """register(): writes made outside any Control (a person answering in the console or a command) are heard."""
    recorder = Recorder()
    observers.register(recorder)
    try:
        with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as asked:
            Control().call("stripe.refund", {"payment_id": "big", "amount": 200_000}, lambda: None)
        store.answer_approval(asked.value.request_id, True, by="alice")
    finally:
        observers.unregister(recorder)
    assert [t for t, _ in recorder.events][-2:] == ["APPROVAL_REQUESTED", "APPROVAL_GRANTED"]


def test_django_signals(refund, remote):
    """approval_requested, approval_answered, effect_ambiguous and effect_resolved reach receivers."""
    heard: list[tuple[str, str]] = []

    def receiver(signal_name):
        def handle(sender, event, **kwargs):
            heard.append((signal_name, event.type))
        return handle

    handlers = {name: receiver(name) for name in ("approval_requested", "approval_answered", "effect_ambiguous",
                                                    "effect_resolved", "action_denied")}
    for name, handler in handlers.items():
        getattr(signals, name).connect(handler)
    try:
        with ctrlrun.context(agent="support-agent"):
            with pytest.raises(ctrlrun.ApprovalRequired) as asked:
                refund(payment_id="big", amount=200_000)
            with pytest.raises(ctrlrun.ActionDenied):
                refund(payment_id="huge", amount=10**9)
        store.answer_approval(asked.value.request_id, False, by="bob")
        key = make_ambiguous(refund, remote, "lost")
        store.resolve(key, "committed", by="carol", reason="the remote shows it")
    finally:
        for name, handler in handlers.items():
            getattr(signals, name).disconnect(handler)
    assert heard == [("approval_requested", "APPROVAL_REQUESTED"), ("action_denied", "ACTION_DENIED"),
                     ("approval_answered", "APPROVAL_DENIED"), ("effect_ambiguous", "EXECUTION_AMBIGUOUS"),
                     ("effect_resolved", "EFFECT_RESOLVED")]


def test_a_signal_receiver_that_raises_cannot_fail_the_call(refund, caplog):
    """A receiver's exception is logged; the call returns its value."""
    def broken(sender, **kwargs):
        raise ValueError("receiver bug")

    signals.event_recorded.connect(broken)
    try:
        with ctrlrun.context(agent="support-agent"), caplog.at_level(logging.ERROR, logger="ctrlrun.observers"):
            assert refund(payment_id="ok", amount=5)["id"] == "re_ok"
    finally:
        signals.event_recorded.disconnect(broken)
    assert "receiver bug" in caplog.text


def test_observers_of_async_calls():
    """An async call's observers hear the same events (from the store's thread, after commit)."""
    recorder = Recorder()
    control = Control(observers=[recorder])

    async def send():
        return "sent"

    asyncio.run(control.acall("email.send", {"msg_id": "m4"}, send, principal="mailer"))
    assert recorder.receipts == ["committed"] and not any(inside for _, inside in recorder.events)


def test_nobody_listening_costs_nothing(tmp_path):
    """With no observer and no receiver, the store registers no commit callback: asked of a fresh
    process that made a protected call (this test process may have served a gateway, whose receipt
    catcher stays registered for the process's life)."""
    import subprocess
    import sys

    from tests.support import script_env

    (tmp_path / "ctrlrun.yaml").write_text("schema: ctrlrun.policy/v2\nactions:\n  note.add:\n    decision: allow\n")
    code = ("import ctrlrun\nfrom ctrlrun import observers\n"
            "ctrlrun.protect('note.add')(lambda text: text)\n"
            "with ctrlrun.context(agent='a'):\n    ctrlrun.protect('note.add')(lambda text: text)(text='x')\n"
            "print(observers.wanted())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=script_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stderr
