"""Edge cases found in review: awaitables, unencodable text, oversized names, index columns, and
verification while receipts are being written."""
from __future__ import annotations

import asyncio
import functools
import threading

import pytest
from django.db import connection

import ctrlrun
from ctrlrun import store
from ctrlrun.models import EffectRecord, Receipt
from tests.support import evidence_unguarded, receipts

pytestmark = pytest.mark.usefixtures("store_db")


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


@pytest.mark.parametrize(("agent_name", "message"), [
    ("a" * 201, "at most 200"), ("a\x00b", "NUL"), ("a\udcff", "lone surrogate"),
])
def test_names_the_store_cannot_hold_are_refused_before_anything_runs(refund, remote, agent_name, message):
    """An agent name too long, or with NUL or a lone surrogate, is InvalidArgument on every database."""
    with pytest.raises(ctrlrun.InvalidArgument, match=message):
        with ctrlrun.context(agent=agent_name):
            refund(payment_id="txn_1", amount=100)
    assert remote.calls == [] and not Receipt.objects.exists()


def test_edited_index_column_is_caught(refund, agent):
    """Editing only a receipt's result column (what lists show) is named, though the document is intact."""
    refund(payment_id="txn_1", amount=100)
    refund(payment_id="txn_2", amount=100)
    with evidence_unguarded(), connection.cursor() as cursor:
        cursor.execute('UPDATE "ctrlrun_receipt" SET "result" = %s WHERE "seq" = 1', ["failed"])
    report = store.verify()
    assert not report.ok
    assert [(b.name, b.seq) for b in report.breaks] == [("content_altered", 1)]
    assert "result column says 'failed'" in report.breaks[0].detail


def test_verification_while_receipts_are_written_reports_no_false_break(refund, agent):
    """Writers appending receipts during a check never make it report a broken head."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            with ctrlrun.context(agent=f"writer-{n}"):
                i = 0
                while not stop.is_set() and i < 60:
                    refund(payment_id=f"w{n}-{i}", amount=1)
                    i += 1
        except BaseException as exc:  # surfaced below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    reports = []
    try:
        for _ in range(15):
            reports.append(store.verify())
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert failures == []
    assert [r.breaks for r in reports if not r.ok] == []
    assert store.verify().ok
