"""Cancelling an async call at every point it can be cancelled, and what a function may return
instead of a result: never ``failed`` for an attempt that may have run, never a key taken or an
approval spent after the caller went away, never a call without its evidence."""
from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import random
import threading
import time

import pytest

import ctrlrun
from ctrlrun import heartbeat
from ctrlrun.approvals import ScriptedApprovalProvider
from ctrlrun.control import Control
from ctrlrun.kernel.steps import _not_a_result
from ctrlrun.models import EffectRecord, Receipt
from ctrlrun.states import Result

pytestmark = pytest.mark.usefixtures("store_db")


@pytest.mark.parametrize("sync_executor", [False, True], ids=["async-executor", "sync-executor"])
def test_cancelled_anywhere_never_failed_once_started(sync_executor):
    """80 calls, each cancelled at a random moment: no record is failed whose function had started,
    and no lease is left renewing."""
    control = Control()
    started: set[str] = set()
    moments = random.Random(7)

    def executor(key):
        if sync_executor:
            def run():
                started.add(key)
                time.sleep(0.005)
                return "ok"
        else:
            async def run():
                started.add(key)
                await asyncio.sleep(0.005)
                return "ok"
        return run

    async def main():
        for i in range(80):
            key = f"m{i}"
            task = asyncio.create_task(control.acall("email.send", {"msg_id": key}, executor(key), principal="mailer"))
            await asyncio.sleep(moments.uniform(0, 0.02))
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    asyncio.run(main())
    states = {r.pk.removeprefix("email:"): r.state for r in EffectRecord.objects.all()}
    assert not {k: s for k, s in states.items() if s == "failed" and k in started}
    assert heartbeat._heartbeat._live == 0


def test_a_cancelled_unkeyed_call_is_recorded_ambiguous():
    """With no effect key there is no record for a sweeper to find: the interrupted run is recorded
    ambiguous at once, with its receipt (as a KeyboardInterrupt is on the sync path)."""
    control = Control()
    started = asyncio.Event()

    async def body():
        started.set()
        await asyncio.sleep(60)

    async def main():
        task = asyncio.create_task(control.acall("audit.note", {"text": "x"}, body, principal="mailer"))
        await started.wait()  # cancelled while the function runs (a fixed sleep could land before it starts)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        control.call("audit.note", {"text": "y"}, interrupted, principal="mailer")
    assert [r.result for r in Receipt.objects.order_by("seq")] == ["ambiguous", "ambiguous"]
    assert "cancelled while the function ran" in Receipt.objects.order_by("seq").first().document


class SlowCheck(ScriptedApprovalProvider):
    """Answers at request time, but when asked says so only once released (``checking`` is set while it
    waits): a cancellation lands inside, however loaded the machine."""

    def __init__(self, script):
        super().__init__(script)
        self.checking, self.release = threading.Event(), threading.Event()

    def check(self, request_id):
        self.checking.set()
        self.release.wait(60)
        return super().check(request_id)


def test_cancelled_while_waiting_takes_no_key_and_spends_no_approval():
    """A wait=True call cancelled inside its approval check does not reserve the key nor consume the
    person's approval: a retry under that approval runs, once."""
    provider = SlowCheck(["grant"])
    control = Control(approvals=provider)
    ran = []

    async def body():
        ran.append(1)
        return "ok"

    args = {"payment_id": "p1", "amount": 60000}

    async def main():
        task = asyncio.create_task(control.acall("stripe.refund", args, body, principal="support-agent", wait=True))
        while not provider.checking.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0)  # the task takes the cancellation inside the check
        provider.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ran == []
        with ctrlrun.with_approval(provider.answered[0][0]):
            return await control.acall("stripe.refund", args, body, principal="support-agent")

    assert asyncio.run(main()) == "ok"
    assert ran == [1]
    assert EffectRecord.objects.get(pk="refund:p1").attempt == 1


def test_the_functions_own_cancelled_error_is_ambiguous():
    """A CancelledError raised by the function itself (its task not cancelled) is an outcome like any
    other exception: ambiguous, recorded now; the caller gets it."""
    @ctrlrun.protect("email.send", effect="email:{msg_id}")
    async def send(msg_id: str) -> None:
        raise asyncio.CancelledError("the SDK gave up")

    async def main():
        with ctrlrun.context(agent="mailer"):
            with pytest.raises(asyncio.CancelledError):
                await send(msg_id="own")

    asyncio.run(main())
    assert EffectRecord.objects.get(pk="email:own").state == "ambiguous"


def test_returning_a_generator_is_refused_and_nothing_ran():
    """An executor that returns an unstarted generator did nothing yet: recorded failed, refused, closed."""
    steps = []

    def gen():
        steps.append("ran")
        yield 1

    with pytest.raises(ctrlrun.InvalidArgument, match="returned a generator"):
        Control().call("email.send", {"msg_id": "g1"}, lambda: gen(), principal="mailer")
    assert steps == []
    assert EffectRecord.objects.get(pk="email:g1").state == "failed"


def test_what_a_returned_promise_means():
    """Unstarted coroutines and generators never ran (failed); a started coroutine, a Task or a
    Future may be running (ambiguous); a plain value is a result."""
    async def job():
        await asyncio.sleep(0)

    fresh = job()
    assert _not_a_result(fresh)[0] is Result.FAILED and inspect.getcoroutinestate(fresh) == inspect.CORO_CLOSED
    running = job()
    running.send(None)  # started: suspended at its first await
    assert _not_a_result(running)[0] is Result.AMBIGUOUS
    running.close()

    async def with_a_future():
        future = asyncio.get_running_loop().create_future()
        return _not_a_result(future)[0]

    assert asyncio.run(with_a_future()) is Result.AMBIGUOUS
    assert _not_a_result({"id": 1}) is None and _not_a_result(None) is None


def test_bad_control_input_is_refused_when_built():
    """An unknown database alias, something that is not an approval provider, and a clock without a
    time zone are refused by Control() itself, naming what is wrong."""
    with pytest.raises(ctrlrun.InvalidArgument, match="has no such entry"):
        Control(database="nope")
    with pytest.raises(ctrlrun.InvalidArgument, match="not an approval provider"):
        Control(approvals=object())
    with pytest.raises(ctrlrun.InvalidArgument, match="aware datetime"):
        Control(clock=lambda: dt.datetime(2030, 1, 1))
