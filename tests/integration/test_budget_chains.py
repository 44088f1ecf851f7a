"""The budget ledger's chains (docs/budgets.md): a budget check reads two running totals and the
window's released rows, never the whole ledger; what it finds is what summing the rows finds, and
the database refuses a row that does not continue its (grant, metric) chain."""
from __future__ import annotations

import datetime as dt
import random

import pytest
from django.db import DatabaseError, connection, transaction

import ctrlrun
from ctrlrun import conf, store
from ctrlrun.models import BudgetLedger
from ctrlrun.states import Decision, Result
from ctrlrun.store import budgets
from ctrlrun.store.base import write_phase
from ctrlrun.store.signatures import ledger_ok

pytestmark = pytest.mark.usefixtures("store_db")

LEASE = dt.timedelta(minutes=5)
WINDOWS = (60, 3600, 86400)


def _call(key: str, amount: int, limit: int = 10**15) -> store.Call:
    action = ctrlrun.Action("stripe.refund", {"payment_id": key, "amount": amount},
                            ctrlrun.Principal(agent="support-agent"), environment=conf.environment())
    charges = (store.Charge("support", "amount", amount, limit, 86400), store.Charge("support", "count", 1, 10**9, 60))
    return store.Call(action, Decision.ALLOW, "rule[0]", None, f"refund:{key}", budget_charges=charges)


def _run(key: str, amount: int, result: Result, limit: int = 10**15) -> None:
    taken = store.reserve(_call(key, amount, limit), LEASE, opening=True, hold_ambiguous=False)
    assert isinstance(taken, store.Reserved), taken
    store.record_outcome(taken.call, taken.attempt, result, error=None if result is Result.COMMITTED else "boom",
                         value={"ok": True})


def _checked(metric: str, window: int, when: dt.datetime) -> int:
    """What a reservation's check finds spent (a charge that never fits makes it say)."""
    with write_phase():
        found = budgets.exhausted([store.Charge("support", metric, 1, 0, window)], when, lock=False)
    assert found is not None
    return found[1]


def _summed(metric: str, window: int, when: dt.datetime) -> int:
    """The same by summing every row, as the ledger was read before the chains."""
    since = when - dt.timedelta(seconds=window)
    return sum(BudgetLedger.objects.filter(grant_id="support", metric=metric, released_at__isnull=True,
                                           consumed_at__gt=since).values_list("amount", flat=True))


def test_the_check_finds_what_summing_the_rows_finds(clock):
    """Charges committed, failed (released) and ambiguous (held), the clock moving by irregular steps
    and sometimes not at all: at every step, every window, the two seeks and the released rows give
    exactly the sum of the un-released rows in the window."""
    rng = random.Random(21)
    for step in range(120):
        result = rng.choice([Result.COMMITTED, Result.COMMITTED, Result.FAILED, Result.AMBIGUOUS])
        _run(f"t{step}", rng.randrange(0, 5000), result)
        clock.advance(seconds=rng.choice([0, 0, 1, 7, 59, 60, 61, 1800, 3600]))
        for metric in ("amount", "count"):
            for window in WINDOWS:
                assert _checked(metric, window, clock.now) == _summed(metric, window, clock.now), (step, metric, window)
    assert BudgetLedger.objects.filter(released_at__isnull=False).exists()
    assert store.verify().ok


def test_each_chain_counts_its_rows_and_sums_their_amounts(clock):
    for n, (amount, result) in enumerate([(10, Result.COMMITTED), (20, Result.FAILED), (0, Result.COMMITTED),
                                          (5, Result.COMMITTED)]):
        _run(f"t{n}", amount, result)
        clock.advance(seconds=1)
    rows = list(BudgetLedger.objects.filter(metric="amount").order_by("n"))
    assert [(r.n, r.amount, r.cum, r.released_at is not None) for r in rows] == [
        (1, 10, 10, False), (2, 20, 30, True), (3, 0, 30, False), (4, 5, 35, False)]
    assert [r.n for r in BudgetLedger.objects.filter(metric="count").order_by("id")] == [1, 2, 3, 4]
    assert all(ledger_ok((r.grant_id, r.metric, r.amount, r.effect_key, r.attempt, r.consumed_at, r.released_at,
                          r.n, r.cum), r.mac) for r in BudgetLedger.objects.all())


def test_a_clock_that_went_back_stamps_the_predecessors_time(clock):
    """A charge made with a clock earlier than its chain's last row (a transaction that waited for the
    lock, a host behind another) takes that row's time: later, so it stays in a window longer."""
    from ctrlrun.testing import Clock, use_clock

    _run("t1", 10, Result.COMMITTED)
    first = clock.now
    with use_clock(Clock(first - dt.timedelta(seconds=30))):  # another process, 30 s behind
        _run("t2", 10, Result.COMMITTED)
    assert [r.consumed_at for r in BudgetLedger.objects.filter(metric="amount").order_by("n")] == [first, first]
    clock.advance(seconds=59)  # both charges are at `first`, 59 s ago: inside a one-minute window
    assert _checked("amount", 60, clock.now) == 20
    clock.advance(seconds=1)
    assert _checked("amount", 60, clock.now) == 0 == _summed("amount", 60, clock.now)


def test_a_running_total_past_what_the_ledger_holds_is_refused_clearly(clock):
    big, most = 2**62, 2**63 - 1
    _run("t1", big, Result.FAILED, most)  # released, but the running total keeps it
    _run("t2", big - 1, Result.FAILED, most)
    with pytest.raises(ctrlrun.BudgetRefused, match="running total .* would pass") as refused:
        store.reserve(_call("t3", 2, most), LEASE, opening=True, hold_ambiguous=False)
    assert refused.value.reason == "budget_unmeasurable"
    assert not BudgetLedger.objects.filter(effect_key="refund:t3").exists()


# --------------------------------------------------------------------------- what the database refuses

AT = "'2026-11-29 12:00:00'"


def _insert(n: int, cum: int, amount: int = 10, at: str = AT, key: str = "refund:forged", verb: str = "INSERT") -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'{verb} INTO "ctrlrun_budgetledger" ("grant_id", "metric", "amount", "effect_key", "attempt", '
                       f'"consumed_at", "released_at", "n", "cum") VALUES (\'support\', \'amount\', {amount}, '
                       f"'{key}', 1, {at}, NULL, {n}, {cum})")


@pytest.mark.parametrize(("n", "cum", "at"), [
    (3, 110, AT),                               # a gap: no row 2
    (2, 15, AT),                                # a running total that does not add up (lower: room made)
    (2, -90, AT),                               # far lower
    (1, 10, AT),                                # a second first row (a fork)
    (2, 110, "'2026-11-29 11:00:00'"),          # back in time: before the window's edge, out of its prefix
])
def test_a_row_that_does_not_continue_its_chain_is_refused(clock, n, cum, at):
    _run("t1", 100, Result.COMMITTED)  # the amount chain: n 1, cum 100, at 12:00
    before = list(BudgetLedger.objects.values_list("id", "n", "cum"))
    with pytest.raises(DatabaseError, match="ledger|UNIQUE|unique|duplicate"):
        _insert(n, cum, at=at)
    assert list(BudgetLedger.objects.values_list("id", "n", "cum")) == before
    assert _checked("amount", 86400, clock.now) == 100


def test_a_row_that_continues_its_chain_is_taken_and_named(clock):
    """The role can add a well-formed charge: it only makes the budget stricter, and the check names it."""
    _run("t1", 100, Result.COMMITTED)
    _insert(2, 110)
    assert _checked("amount", 86400, clock.now) == 110
    report = store.verify()
    assert not report.ok


def test_an_insert_replacing_a_place_is_refused(clock):
    """SQLite's INSERT OR REPLACE over another row's place would delete that row without a DELETE
    trigger; PostgreSQL has no such statement (its upsert is an update, refused)."""
    _run("t1", 100, Result.COMMITTED)
    if connection.vendor != "sqlite":
        with pytest.raises(DatabaseError, match="ledger"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute('INSERT INTO "ctrlrun_budgetledger" SELECT * FROM "ctrlrun_budgetledger" LIMIT 1 '
                           'ON CONFLICT ("grant_id", "metric", "n") DO UPDATE SET "cum" = 0')
    else:
        with pytest.raises(DatabaseError, match="ledger"):
            _insert(1, 0, amount=0, verb="INSERT OR REPLACE")
    assert list(BudgetLedger.objects.filter(metric="amount").values_list("effect_key", "cum")) == [("refund:t1", 100)]
