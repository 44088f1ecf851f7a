"""The state table is what the code does: every edge of ``states.TRANSITIONS`` driven through the
public store and the decorator on a real database, and every other pair refused, by the store's one
state write (``effects.move_effect``) and by the database's own trigger (plain SQL, whoever connects)."""
from __future__ import annotations

import datetime as dt
import itertools

import pytest
from django.db import DatabaseError, connection, transaction

import ctrlrun
from ctrlrun import store
from ctrlrun.errors import IllegalTransition
from ctrlrun.models import EffectRecord
from ctrlrun.states import INITIAL_STATE, TRANSITIONS, EffectState, Result
from tests.support import hold_key, make_ambiguous

pytestmark = pytest.mark.usefixtures("store_db")

S = EffectState
#: The edges the tests below drive, filled in as the module is read.
DRIVEN: set[tuple[EffectState, EffectState]] = set()


def drives(source: EffectState, target: EffectState):
    def mark(test):
        DRIVEN.add((source, target))
        return test
    return mark


def state(key: str) -> tuple[str, int]:
    record = EffectRecord.objects.get(pk=key)
    return record.state, record.attempt


# --------------------------------------------------------------------------- every edge, driven


@drives(S.NEW, S.EXECUTING)
def test_new_to_executing_a_first_reservation_runs_the_function(refund, remote, agent):
    """A key nobody holds is taken executing at attempt 1 while the function runs."""
    seen = []
    remote.refund = lambda payment_id, amount: seen.append(state(f"refund:{payment_id}")) or {}
    assert not EffectRecord.objects.filter(pk="refund:t1").exists()
    refund(payment_id="t1", amount=1)
    assert seen == [("executing", 1)]


@drives(S.FAILED, S.EXECUTING)
def test_failed_to_executing_a_retry_after_not_executed_takes_the_next_attempt(refund, remote, agent):
    """A failed key is taken again, executing at attempt 2, by a retry."""
    make_ambiguous(refund, remote, "t2", ctrlrun.NotExecuted("refused before sending"))
    assert state("refund:t2") == ("failed", 1)
    seen = []
    remote.refund = lambda payment_id, amount: seen.append(state(f"refund:{payment_id}")) or {}
    refund(payment_id="t2", amount=1)
    assert seen == [("executing", 2)]


@drives(S.EXECUTING, S.EXECUTING)
def test_executing_to_executing_the_heartbeat_moves_the_lease_later():
    """renew_lease keeps a live holder executing with a later lease."""
    held = hold_key("refund:t3", minutes=1)
    before = EffectRecord.objects.get(pk="refund:t3").lease_expires_at
    assert store.renew_lease(held.call, held.attempt, dt.timedelta(minutes=10))
    after = EffectRecord.objects.get(pk="refund:t3")
    assert (after.state, after.attempt) == ("executing", 1) and after.lease_expires_at > before


@drives(S.EXECUTING, S.COMMITTED)
def test_executing_to_committed_the_function_returned(refund, agent):
    """A function that returns leaves its key committed."""
    refund(payment_id="t4", amount=1)
    assert state("refund:t4") == ("committed", 1)


@drives(S.EXECUTING, S.FAILED)
def test_executing_to_failed_the_function_raised_not_executed(refund, remote):
    """NotExecuted is the one route to failed."""
    make_ambiguous(refund, remote, "t5", ctrlrun.NotExecuted("connection refused"))
    assert state("refund:t5") == ("failed", 1)


@drives(S.EXECUTING, S.AMBIGUOUS)
def test_executing_to_ambiguous_a_lost_reply_or_a_lapsed_lease(refund, remote, clock):
    """Any other exception leaves the key ambiguous; so does a sweep of a lapsed lease."""
    make_ambiguous(refund, remote, "t6")
    assert state("refund:t6") == ("ambiguous", 1)
    hold_key("refund:t6b", minutes=1)
    clock.advance(minutes=2)
    [swept] = store.sweep_lapsed(effect_key="refund:t6b")
    assert (swept.state, swept.error) == ("ambiguous", store.LEASE_LAPSED_ERROR)


@drives(S.AMBIGUOUS, S.AMBIGUOUS)
def test_ambiguous_to_ambiguous_a_swept_holder_fails_or_a_hook_cannot_say(clock):
    """A holder swept while it ran records its exception on the ambiguous row; a hook's 'unknown' defers."""
    held = hold_key("refund:t7", minutes=1)
    clock.advance(minutes=2)
    store.sweep_lapsed(effect_key="refund:t7")
    written = store.record_outcome(held.call, held.attempt, Result.AMBIGUOUS, error="TimeoutError: read timed out")
    record = EffectRecord.objects.get(pk="refund:t7")
    assert written.accepted and (record.state, record.error) == ("ambiguous", "TimeoutError: read timed out")
    moved = store.record_reconciliation("refund:t7", None, "reconcile:stripe.refund", "deferred",
                                        store.HookAnswer("unknown"), attempt=1)
    record = EffectRecord.objects.get(pk="refund:t7")
    assert moved is None and (record.state, record.reconcile_failures) == ("ambiguous", 1)
    assert record.reconcile_after is not None


@drives(S.AMBIGUOUS, S.COMMITTED)
def test_ambiguous_to_committed_a_person_says_it_happened(refund, remote):
    """resolve --committed moves an ambiguous key to committed, resolved by that person."""
    key = make_ambiguous(refund, remote, "t8")
    view = store.resolve(key, "committed", by="alice", reason="the dashboard shows it")
    assert (view.state, view.resolved_by) == ("committed", "alice") and state(key) == ("committed", 1)


@drives(S.AMBIGUOUS, S.FAILED)
def test_ambiguous_to_failed_a_hook_says_it_did_not_happen(refund, remote):
    """A reconcile hook's not_executed moves an ambiguous key to failed."""
    key = make_ambiguous(refund, remote, "t9")
    moved = store.record_reconciliation(key, None, "reconcile:stripe.refund", "deferred",
                                        store.HookAnswer("not_executed"), attempt=1)
    assert moved == "failed" and state(key) == ("failed", 1)
    assert EffectRecord.objects.get(pk=key).resolved_by == "reconcile:stripe.refund"


def test_every_edge_of_the_table_is_driven_above():
    """The tests above drive exactly the edges of the state table, no more, no fewer."""
    assert DRIVEN == set(TRANSITIONS)


# --------------------------------------------------------------------------- every other pair, refused

PAIRS = list(itertools.product(list(EffectState), repeat=2))
NOT_EDGES = [pair for pair in PAIRS if pair not in TRANSITIONS]


@pytest.mark.parametrize(("source", "target"), NOT_EDGES, ids=[f"{a}->{b}" for a, b in NOT_EDGES])
def test_the_one_state_write_refuses_a_pair_not_in_the_table(source, target):
    """effects.move_effect raises IllegalTransition before running anything for a pair the table lacks."""
    hold_key("refund:held", minutes=5)
    with store.base.write_phase() as when, store.base.statements() as cursor:
        with pytest.raises(IllegalTransition) as caught:
            store.effects.move_effect(cursor, store.sql.EFFECT_LAPSE, source, target,
                                      ["boom", store.base.time_param(connection)(when), "mac", "refund:held"])
    assert (caught.value.source, caught.value.target) == (source.value, target.value)
    assert state("refund:held") == ("executing", 1)


@pytest.fixture
def rows(refund, remote, agent):
    """One record in each state the store leaves a record in, made through the decorator."""
    refund(payment_id="c", amount=1)
    make_ambiguous(refund, remote, "f", ctrlrun.NotExecuted("refused"))
    make_ambiguous(refund, remote, "a")
    hold_key("refund:e", minutes=5)
    return {S.COMMITTED: "refund:c", S.FAILED: "refund:f", S.AMBIGUOUS: "refund:a", S.EXECUTING: "refund:e"}


STORED = [S.EXECUTING, S.COMMITTED, S.FAILED, S.AMBIGUOUS]
TRIGGER_CASES = [(a, b) for a, b in NOT_EDGES if a in STORED]


def test_the_database_refuses_every_pair_not_in_the_table(rows):
    """A plain SQL UPDATE of the state along a pair the table lacks is refused by the trigger; the row stays."""
    assert TRIGGER_CASES
    for source, target in TRIGGER_CASES:
        key = rows[source]
        with pytest.raises(DatabaseError):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute('UPDATE "ctrlrun_effectrecord" SET "state" = %s WHERE "effect_key" = %s',
                               [target.value, key])
        assert EffectRecord.objects.get(pk=key).state == source.value, (source, target)


def test_the_database_creates_a_record_only_in_the_initial_state():
    """A plain SQL INSERT of a record in any state but the table's initial one is refused."""
    for target in [s for s in EffectState if s is not INITIAL_STATE]:
        with pytest.raises(DatabaseError):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    'INSERT INTO "ctrlrun_effectrecord" ("effect_key","action","state","action_id","attempt",'
                    '"reconcile_failures","created_at","updated_at") VALUES (%s,%s,%s,%s,1,0,%s,%s)',
                    [f"refund:{target.value}", "stripe.refund", target.value, "act_x", dt.datetime.now(dt.timezone.utc),
                     dt.datetime.now(dt.timezone.utc)])
        assert not EffectRecord.objects.filter(pk=f"refund:{target.value}").exists()
