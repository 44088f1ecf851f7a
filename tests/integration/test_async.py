"""``async def`` protected functions: the same steps as the sync path, driven from an event loop.

Each test runs its coroutine with ``asyncio.run`` on the real store; what the sync path guarantees
(the retry table, approvals, reconciliation, context) is checked again here, plus what only an
event loop has: cancellation, many concurrent tasks, and a loop that never waits on the database.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import pytest
from django.db import connections

import ctrlrun
from ctrlrun import store
from ctrlrun.approvals import ScriptedApprovalProvider
from ctrlrun.control import Control
from ctrlrun.models import EffectRecord
from tests.support import Hook, events, receipts

pytestmark = pytest.mark.usefixtures("store_db")


class AsyncRemote:
    """The stand-in remote, awaited: records each call that reached it; loses the reply when told to."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_with: BaseException | None = None
        self.delay = 0.0

    async def refund(self, payment_id: str, amount: int) -> dict:
        if self.delay:
            await asyncio.sleep(self.delay)
        self.calls.append(payment_id)
        if self.fail_with is not None:
            raise self.fail_with
        return {"id": f"re_{payment_id}", "amount": amount}


def async_refund(remote: AsyncRemote, **options):
    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", **options)
    async def refund(payment_id: str, amount: int) -> dict:
        return await remote.refund(payment_id, amount)

    return refund


async def lose_reply(refund, remote: AsyncRemote, payment_id: str, error: BaseException | None = None) -> None:
    """One awaited call whose reply is lost (the remote raises ``error``, a timeout by default)."""
    remote.fail_with = error or TimeoutError("read timed out")
    with pytest.raises(type(remote.fail_with)):
        await refund(payment_id=payment_id, amount=5)
    remote.fail_with = None


class AsyncHook:
    """An ``async def``-style reconcile hook: records what it was asked and answers ``answer``."""

    def __init__(self, answer: str) -> None:
        self.answer, self.asked = answer, []

    async def __call__(self, effect_key: str) -> str:
        self.asked.append(effect_key)
        await asyncio.sleep(0)
        return self.answer


def state(key: str) -> str:
    return EffectRecord.objects.get(pk=key).state


async def db(fn, *args, **kwargs):
    """Django refuses the ORM on an event loop's thread: tests read and answer through ctrlrun's
    store threads, as the async driver does."""
    from ctrlrun.kernel import drive

    return await asyncio.wrap_future(drive._threads.submit(lambda: fn(*args, **kwargs)))


def test_protected_async_def_is_a_coroutine_function():
    """Decorating an async def gives a coroutine function; calling it runs nothing until awaited."""
    import inspect

    remote = AsyncRemote()
    refund = async_refund(remote)
    assert inspect.iscoroutinefunction(refund)
    with ctrlrun.context(agent="support-agent"):
        pending = refund(payment_id="txn_0", amount=1)
    pending.close()
    assert remote.calls == [] and not EffectRecord.objects.exists()


def test_seed_story_lost_reply_then_reconciled(hook_registry):
    """The seed's lost reply, async: ambiguous, a retry refused until the hook (async) says committed."""
    remote = AsyncRemote()
    hook = AsyncHook("committed")
    refund = async_refund(remote, reconcile=hook)

    async def story():
        with ctrlrun.context(agent="support-agent"):
            await lose_reply(refund, remote, "txn_9")
            assert await db(state, "refund:txn_9") == "ambiguous"
            # The retry meets the ambiguous record: the blocking trigger asks the hook, which says
            # the first attempt happened; the retry is refused as a duplicate, never run.
            with pytest.raises(ctrlrun.DuplicateEffect):
                await refund(payment_id="txn_9", amount=50)

    asyncio.run(story())
    assert remote.calls == ["txn_9"]
    assert hook.asked == ["refund:txn_9"]
    assert state("refund:txn_9") == "committed"
    assert "RECONCILIATION_RESOLVED" in events()


def test_retry_table():
    """NotExecuted -> failed and retried; another exception -> ambiguous, refused; commit -> duplicate."""
    remote = AsyncRemote()
    refund = async_refund(remote)

    async def table():
        with ctrlrun.context(agent="support-agent"):
            await lose_reply(refund, remote, "txn_1", ctrlrun.NotExecuted("connection refused"))
            assert await db(state, "refund:txn_1") == "failed"
            assert (await refund(payment_id="txn_1", amount=10))["id"] == "re_txn_1"
            with pytest.raises(ctrlrun.DuplicateEffect):
                await refund(payment_id="txn_1", amount=10)
            await lose_reply(refund, remote, "txn_2", ConnectionResetError("reset"))
            with pytest.raises(ctrlrun.AmbiguousEffect):
                await refund(payment_id="txn_2", amount=10)

    asyncio.run(table())
    assert remote.calls == ["txn_1", "txn_1", "txn_2"]
    assert [r["result"] for r in receipts()] == ["failed", "committed", "blocked", "ambiguous", "blocked"]
    assert EffectRecord.objects.get(pk="refund:txn_1").attempt == 2


def test_denied_and_unlisted_never_run():
    """A denied amount and an unlisted action are refused before the function, with their receipts."""
    ran = []

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}")
    async def refund(payment_id: str, amount: int) -> None:
        ran.append(payment_id)

    @ctrlrun.protect("db.drop")
    async def drop(table: str) -> None:
        ran.append(table)

    async def calls():
        with ctrlrun.context(agent="support-agent"):
            with pytest.raises(ctrlrun.ActionDenied, match="rule"):
                await refund(payment_id="txn_3", amount=10_000_000)
            with pytest.raises(ctrlrun.ActionDenied, match="unknown_action"):
                await drop(table="users")
        with pytest.raises(ctrlrun.ActionDenied, match="no principal"):
            await drop(table="users")

    asyncio.run(calls())
    assert ran == []
    assert [r["decision_reason"] for r in receipts()] == ["rule[2]", "unknown_action"]


def test_approval_wait_true_answered_while_the_loop_runs():
    """wait=True pauses with asyncio.sleep: a person approves from another thread while other tasks
    keep running; then the same action runs once under that approval."""
    remote = AsyncRemote()
    refund = async_refund(remote, wait=True)
    ticks = []

    async def ticker(stop: asyncio.Event):
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    def approver():
        # Approves only once the loop has ticked ten times *after* the request was made: if waiting
        # blocked the loop, no tick would come, and the request would be denied instead.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pending = store.list_approvals("pending")
            if pending:
                seen = len(ticks)
                while len(ticks) < seen + 10 and time.monotonic() < deadline:
                    time.sleep(0.01)
                store.answer_approval(pending[0].approval_id, len(ticks) >= seen + 10, by="alice")
                return
            time.sleep(0.01)

    async def run():
        stop = asyncio.Event()
        beat = asyncio.create_task(ticker(stop))
        thread = threading.Thread(target=approver)
        thread.start()
        with ctrlrun.context(agent="support-agent"):
            result = await refund(payment_id="txn_big", amount=200_000)
        stop.set()
        await beat
        thread.join()
        return result

    result = asyncio.run(run())
    assert result["id"] == "re_txn_big" and remote.calls == ["txn_big"]
    last = receipts()[-1]
    assert (last["result"], last["approver"]) == ("committed", "alice")


def test_with_approval_across_await_and_a_digit_changed():
    """with_approval around an await presents the approval; the same request for other arguments is refused."""
    remote = AsyncRemote()
    refund = async_refund(remote)

    async def run():
        with ctrlrun.context(agent="support-agent"):
            with pytest.raises(ctrlrun.ApprovalRequired) as asked:
                await refund(payment_id="txn_a", amount=200_000)
            request_id = asked.value.request_id
            await db(store.answer_approval, request_id, True, by="alice")
            with ctrlrun.with_approval(request_id):
                with pytest.raises(ctrlrun.ApprovalMismatch):
                    await refund(payment_id="txn_a", amount=200_001)
                await asyncio.sleep(0)
                assert (await refund(payment_id="txn_a", amount=200_000))["amount"] == 200_000
                with pytest.raises(ctrlrun.ApprovalMismatch):  # single use
                    await refund(payment_id="txn_b", amount=200_000)

    asyncio.run(run())
    assert remote.calls == ["txn_a"]


def test_context_follows_await_and_gather():
    """The principal set around asyncio.gather is each task's; tasks made in different contexts keep theirs."""
    remote = AsyncRemote()
    refund = async_refund(remote)

    async def as_agent(agent: str, payment_id: str):
        with ctrlrun.context(agent=agent):
            await asyncio.sleep(0)
            return await refund(payment_id=payment_id, amount=5)

    async def run():
        with ctrlrun.context(agent="support-agent"):
            await asyncio.gather(*(refund(payment_id=f"txn_g{i}", amount=5) for i in range(3)))
        await asyncio.gather(as_agent("agent-a", "txn_x"), as_agent("agent-b", "txn_y"))

    asyncio.run(run())
    agents = {r["effect_key"]: r["principal"]["agent"] for r in receipts()}
    assert agents == {"refund:txn_g0": "support-agent", "refund:txn_g1": "support-agent",
                      "refund:txn_g2": "support-agent", "refund:txn_x": "agent-a", "refund:txn_y": "agent-b"}


def test_cancelled_while_running_is_held_then_swept_ambiguous():
    """A task cancelled while its async function runs records nothing: the record stays executing,
    its lease is no longer renewed, and the sweeper marks it ambiguous - never failed."""
    remote = AsyncRemote()
    remote.delay = 5
    refund = async_refund(remote, lease=dt.timedelta(seconds=0.4))

    async def run():
        with ctrlrun.context(agent="support-agent"):
            task = asyncio.create_task(refund(payment_id="txn_c", amount=5))
            for _ in range(200):
                await asyncio.sleep(0.01)
                if await db(EffectRecord.objects.filter(pk="refund:txn_c").exists):
                    break
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(run())
    assert state("refund:txn_c") == "executing"
    assert remote.calls == []  # it was cut off inside its await
    assert not receipts()  # nothing recorded for the interrupted attempt
    time.sleep(0.6)  # past the 0.4 s lease, which nothing renews any more
    swept = store.sweep_lapsed()
    assert [e.effect_key for e in swept] == ["refund:txn_c"]
    assert state("refund:txn_c") == "ambiguous"
    assert receipts()[-1]["result"] == "ambiguous"


def test_cancelled_while_a_sync_executor_runs_waits_for_it_and_records_it():
    """A plain function run in a thread by acall() cannot be interrupted: cancelling the task waits
    for it, records its real outcome, then raises CancelledError."""
    control = Control()
    ran = []
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(60)  # still running when the task is cancelled, however loaded the machine
        ran.append(1)
        return "sent"

    async def run():
        task = asyncio.create_task(control.acall("email.send", {"msg_id": "m1"}, slow, principal="mailer"))
        while not started.is_set():  # not a fixed sleep: on a loaded machine the thread starts late
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0)  # the task takes the cancellation while the function runs
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert ran == [1]
    assert state("email:m1") == "committed"


def test_reconcile_eagerly_with_an_async_hook(hook_registry):
    """reconcile_eagerly asks an async hook right after the lost reply; its not_executed frees the key."""
    remote = AsyncRemote()
    hook_calls = []

    async def reconcile(effect_key: str) -> str:
        hook_calls.append(effect_key)
        return "not_executed"

    refund = async_refund(remote, reconcile=reconcile, reconcile_eagerly=True)

    async def run():
        with ctrlrun.context(agent="support-agent"):
            await lose_reply(refund, remote, "txn_e")
            assert await db(state, "refund:txn_e") == "failed"
            await refund(payment_id="txn_e", amount=5)

    asyncio.run(run())
    assert hook_calls == ["refund:txn_e"] and remote.calls == ["txn_e", "txn_e"]
    assert state("refund:txn_e") == "committed"


def test_deferred_reconcile_asks_an_async_hook(hook_registry):
    """The reconcile pass (sync, as the command runs it) runs an async hook to completion."""
    from ctrlrun import reconcile

    remote = AsyncRemote()
    refund = async_refund(remote, reconcile=AsyncHook("committed"))

    async def lose():
        with ctrlrun.context(agent="support-agent"):
            await lose_reply(refund, remote, "txn_d")

    asyncio.run(lose())
    report = reconcile.run_once()
    assert [line.outcome for line in report.lines] == ["committed"]
    assert state("refund:txn_d") == "committed"


def test_a_sync_hook_blocking_trigger_from_async(hook_registry):
    """A plain hook works for an async function too (run in a thread)."""
    remote = AsyncRemote()
    hook = Hook("not_executed")
    refund = async_refund(remote, reconcile=hook)

    async def run():
        with ctrlrun.context(agent="support-agent"):
            await lose_reply(refund, remote, "txn_s")
            return await refund(payment_id="txn_s", amount=5)

    assert asyncio.run(run())["id"] == "re_txn_s"
    assert hook.asked == ["refund:txn_s"] and remote.calls == ["txn_s", "txn_s"]


def _in_a_fresh_thread(coroutine_function):
    """Run a coroutine on a new event loop in a new thread; return (its result, whether that thread
    ever opened a database connection)."""
    out: dict = {}

    def main():
        out["result"] = asyncio.run(coroutine_function())
        out["touched"] = any(connections[alias].connection is not None for alias in connections)

    thread = threading.Thread(target=main)
    thread.start()
    thread.join()
    return out["result"], out["touched"]


@pytest.fixture
def phase_times(monkeypatch):
    """How long each store phase took, in its store thread (to set beside the loop's longest stall)."""
    from ctrlrun.kernel import drive

    times: list[float] = []
    real = drive._phase

    def timed(control, op):
        started = time.monotonic()
        try:
            return real(control, op)
        finally:
            times.append(time.monotonic() - started)

    monkeypatch.setattr(drive, "_phase", timed)
    return times


def _stalls(stop: asyncio.Event, gaps: list[float]):
    async def beat():
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.002)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    return beat()


def test_200_tasks_on_one_key_run_once_and_the_loop_never_touches_the_database(capsys, phase_times):
    """200 concurrent tasks on one key: exactly one execution, 199 duplicates; the event loop's thread
    opens no database connection, and its heartbeat keeps beating (max stall printed)."""
    remote = AsyncRemote()
    refund = async_refund(remote)
    gaps: list[float] = []

    async def run():
        stop = asyncio.Event()
        beat = asyncio.create_task(_stalls(stop, gaps))
        with ctrlrun.context(agent="support-agent"):
            results = await asyncio.gather(*(refund(payment_id="txn_one", amount=5) for _ in range(200)),
                                           return_exceptions=True)
        stop.set()
        await beat
        return results

    results, touched = _in_a_fresh_thread(run)
    assert remote.calls == ["txn_one"]
    kinds = sorted(type(r).__name__ for r in results)
    assert kinds.count("dict") == 1 and kinds.count("DuplicateEffect") == 199, kinds[:3]
    assert not touched
    assert EffectRecord.objects.get(pk="refund:txn_one").attempt == 1
    with capsys.disabled():
        print(f"\n[measured] 200 tasks, one key: loop heartbeat max stall {max(gaps) * 1000:.1f} ms over "
              f"{len(gaps)} beats; longest store phase {max(phase_times) * 1000:.1f} ms of {len(phase_times)}")


def test_200_tasks_on_distinct_keys_each_run_once(capsys, phase_times):
    """200 concurrent tasks on 200 keys: each runs once and commits; the loop opens no connection."""
    remote = AsyncRemote()
    refund = async_refund(remote)
    gaps: list[float] = []

    async def run():
        stop = asyncio.Event()
        beat = asyncio.create_task(_stalls(stop, gaps))
        with ctrlrun.context(agent="support-agent"):
            results = await asyncio.gather(*(refund(payment_id=f"txn_{i}", amount=5) for i in range(200)))
        stop.set()
        await beat
        return results

    results, touched = _in_a_fresh_thread(run)
    assert len(results) == 200 and sorted(remote.calls) == sorted(f"txn_{i}" for i in range(200))
    assert not touched
    assert EffectRecord.objects.filter(state="committed").count() == 200
    with capsys.disabled():
        print(f"\n[measured] 200 tasks, 200 keys: loop heartbeat max stall {max(gaps) * 1000:.1f} ms over "
              f"{len(gaps)} beats; longest store phase {max(phase_times) * 1000:.1f} ms of {len(phase_times)}")


def test_scripted_approvals_with_an_async_control():
    """A Control with a scripted approver: granted -> runs under it; denied -> refused, never run."""
    control = Control(approvals=ScriptedApprovalProvider(["grant", "deny"]))
    ran = []

    @ctrlrun.protect("stripe.refund", effect="refund:{payment_id}", wait=True, control=control)
    async def refund(payment_id: str, amount: int) -> str:
        ran.append(payment_id)
        return "ok"

    async def run():
        with ctrlrun.context(agent="support-agent"):
            assert await refund(payment_id="txn_p", amount=200_000) == "ok"
            with pytest.raises(ctrlrun.ActionDenied, match="denied by cli:scripted"):
                await refund(payment_id="txn_q", amount=200_000)

    asyncio.run(run())
    assert ran == ["txn_p"]
    assert [answer for _, answer in control.approvals.answered] == ["grant", "deny"]
