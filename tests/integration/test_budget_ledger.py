"""The budget ledger (authority, §C5) in the store: charged with the reservation, refused when a charge
does not fit, released when an attempt ends failed, held while it runs or is ambiguous, kept once
committed; receipts, observe mode, ``effects``, ``stats``, the guard; OS processes racing for the last
unit. The kernel does not pass charges yet, so these drive the store layer directly (real rows, no
mocks), on whichever database the suite runs against."""
from __future__ import annotations

import datetime as dt
import json
import time

import pytest
from django.db import DatabaseError, transaction

import ctrlrun
from ctrlrun import conf, store
from ctrlrun.control import Control
from ctrlrun.models import Approval, BudgetLedger, EffectRecord
from ctrlrun.policy import parse_policy
from ctrlrun.states import Decision, Result, blocked_reason

from tests.support import LEDGER_POLICY, event, receipts, run_command, run_together, script_environment

pytestmark = pytest.mark.usefixtures("store_db")

DAY = 86400
LEASE = dt.timedelta(minutes=5)


def amount_budget(amount: int, limit: int = 100_000, window: int = DAY, grant: str = "support") -> store.Charge:
    return store.Charge(grant, "amount", amount, limit, window)


def count_budget(limit: int = 5, window: int = DAY, grant: str = "support") -> store.Charge:
    return store.Charge(grant, "count", 1, limit, window)


def call_for(payment_id: str, amount: int, *charges: store.Charge, decision: Decision = Decision.ALLOW,
             reason: str = "rule[0]") -> store.Call:
    action = ctrlrun.Action("stripe.refund", {"payment_id": payment_id, "amount": amount},
                            ctrlrun.Principal(agent="support-agent"), environment=conf.environment())
    return store.Call(action, decision, reason, None, f"refund:{payment_id}", budget_charges=charges)


def refund_call(payment_id: str, amount: int, limit: int = 100_000, count_limit: int = 5, **kwargs) -> store.Call:
    return call_for(payment_id, amount, amount_budget(amount, limit), count_budget(count_limit), **kwargs)


def take(call: store.Call, **kwargs):
    return store.reserve(call, LEASE, opening=True, hold_ambiguous=False, **kwargs)


def run(call: store.Call, result: Result = Result.COMMITTED, **kwargs):
    """Reserve and record the outcome; the Reserved."""
    taken = take(call, **kwargs)
    assert isinstance(taken, store.Reserved), taken
    store.record_outcome(taken.call, taken.attempt, result, error=None if result is Result.COMMITTED else "boom",
                         value={"ok": True})
    return taken


def ledger(metric: str | None = None) -> list[tuple]:
    rows = BudgetLedger.objects.order_by("id")
    if metric:
        rows = rows.filter(metric=metric)
    return [(r.grant_id, r.metric, r.amount, r.effect_key, r.attempt, r.released_at is not None) for r in rows]


def spent(metric: str = "amount", window: int = DAY) -> tuple[int, int]:
    consumed, held, _ = store.budget_usage("support", metric, window)
    return consumed, held


# --------------------------------------------------------------------------- charging and refusing


def test_a_taken_key_charges_every_budget_in_the_reservation(clock):
    taken = take(refund_call("txn_1", 40_000))
    assert isinstance(taken, store.Reserved)
    assert ledger() == [("support", "amount", 40_000, "refund:txn_1", 1, False),
                        ("support", "count", 1, "refund:txn_1", 1, False)]
    assert {r.consumed_at for r in BudgetLedger.objects.all()} == {clock.now}
    assert spent() == (0, 40_000)  # running: held
    store.record_outcome(taken.call, taken.attempt, Result.COMMITTED, value=1)
    assert spent() == (40_000, 0) and spent("count") == (1, 0)
    (receipt,) = receipts()
    assert receipt["budget_charges"] == [{"grant_id": "support", "metric": "amount", "amount": 40_000},
                                         {"grant_id": "support", "metric": "count", "amount": 1}]


def test_an_exhausted_budget_refuses_with_nothing_taken(clock):
    run(refund_call("txn_1", 40_000))
    run(refund_call("txn_2", 40_000))
    refused = take(refund_call("txn_3", 40_000))
    assert isinstance(refused, store.Refused) and refused.final
    error = refused.error
    assert isinstance(error, ctrlrun.ActionDenied) and error.reason == "budget_exhausted"
    assert str(error).startswith("budget 'amount' on grant 'support' over 1 day is exhausted: 80,000 of 100,000 "
                                 "spent, this call needs 40,000 (20,000 left)")
    assert refused.call.budget_charges == ()
    assert not EffectRecord.objects.filter(pk="refund:txn_3").exists()
    assert len(ledger("amount")) == 2 and spent() == (80_000, 0)
    denied = event("ACTION_DENIED", effect_key="refund:txn_3")
    assert denied.data == {"reason": "budget_exhausted", "grant_id": "support", "metric": "amount", "window": DAY}
    action_id = refused.call.action.action_id
    from tests.support import events

    assert events(action_id) == ["ACTION_PROPOSED", "POLICY_EVALUATED", "ACTION_DENIED"]
    receipt = receipts()[-1]
    # recorded as a constraint refusal is: denied, decision deny (POLICY_EVALUATED keeps the policy's allow)
    assert (receipt["result"], receipt["decision"], receipt["decision_reason"]) == ("denied", "deny",
                                                                                    "budget_exhausted")
    assert receipt["budget_charges"] == [] and receipt["error"] == str(error)
    assert store.verify().ok


def test_the_limit_itself_fits_and_one_more_does_not(clock):
    run(refund_call("txn_1", 60_000, limit=100_000))
    run(refund_call("txn_2", 40_000, limit=100_000))  # exactly the limit
    assert spent() == (100_000, 0)
    refused = take(refund_call("txn_3", 1, limit=100_000))
    assert isinstance(refused, store.Refused) and refused.error.reason == "budget_exhausted"
    assert "100,000 of 100,000 spent, this call needs 1. Nothing ran" in str(refused.error)
    run(refund_call("txn_4", 0, limit=100_000))  # nothing more: fits (its count still does)


def test_a_limit_of_zero(clock):
    assert isinstance(take(call_for("txn_1", 0, amount_budget(0, limit=0))), store.Reserved)  # 0 of 0 fits
    refused = take(call_for("txn_2", 5, amount_budget(5, limit=0)))
    assert refused.error.reason == "budget_exhausted"
    refused = take(call_for("txn_3", 0, count_budget(limit=0)))
    assert refused.error.reason == "budget_exhausted"
    assert "budget 'count' on grant 'support' over 1 day is exhausted: 0 of 0 spent, this call needs 1" in str(
        refused.error)


def test_every_charge_is_checked_before_any_is_written(clock):
    """The count fits, the ancestor's amount does not: no row at all is written."""
    run(call_for("txn_1", 900, amount_budget(900, limit=1000, grant="org")))
    refused = take(call_for("txn_2", 200, count_budget(grant="support"), amount_budget(200, limit=1000, grant="org")))
    assert refused.error.reason == "budget_exhausted" and "grant 'org'" in str(refused.error)
    assert [row[3] for row in ledger()] == ["refund:txn_1"]


def test_several_budgets_on_one_metric_share_one_row(clock):
    """amount <= 100000 a day and <= 50000 an hour: one row per call, each budget sums it over its window."""
    hourly, daily = amount_budget(30_000, 50_000, 3600), amount_budget(30_000, 100_000, DAY)
    run(call_for("txn_1", 30_000, hourly, daily))
    assert ledger() == [("support", "amount", 30_000, "refund:txn_1", 1, False)]
    assert receipts()[-1]["budget_charges"] == [{"grant_id": "support", "metric": "amount", "amount": 30_000}]
    refused = take(call_for("txn_2", 30_000, hourly, daily))
    assert "over 1 hour is exhausted: 30,000 of 50,000" in str(refused.error)
    clock.advance(hours=1)
    run(call_for("txn_3", 30_000, hourly, daily))
    assert spent("amount") == (60_000, 0)
    with pytest.raises(ctrlrun.InvalidArgument, match="cost different amounts"):
        take(call_for("txn_4", 1, amount_budget(1), amount_budget(2)))


def test_the_window_slides(clock):
    run(refund_call("txn_1", 70_000))
    clock.advance(hours=12)
    run(refund_call("txn_2", 30_000))
    clock.advance(hours=12, seconds=-1)  # txn_1 is 1 second inside the window
    assert take(refund_call("txn_3", 50_000)).error.reason == "budget_exhausted"
    clock.advance(seconds=1)  # now - window == txn_1's time: (now - window, now] leaves it out
    assert spent() == (30_000, 0)
    run(refund_call("txn_4", 50_000))
    consumed, held, holding = store.budget_usage("support", "amount", 3600)
    assert (consumed, held, holding) == (50_000, 0, [])
    # budget_usage answers for any time
    assert store.budget_usage("support", "amount", DAY, now=clock.now - dt.timedelta(hours=12))[0] == 100_000


# --------------------------------------------------------------------------- release and hold


def test_not_executed_releases_the_charge(clock):
    run(refund_call("txn_1", 90_000), Result.FAILED)
    assert ledger("amount") == [("support", "amount", 90_000, "refund:txn_1", 1, True)]
    assert spent() == (0, 0)
    run(refund_call("txn_2", 90_000))  # it fits again
    # the failed key's retry charges its new attempt
    retry = take(refund_call("txn_1", 10_000))
    assert isinstance(retry, store.Reserved) and retry.attempt == 2
    assert ledger("amount")[-1] == ("support", "amount", 10_000, "refund:txn_1", 2, False)


def ambiguous(payment_id: str, amount: int) -> store.Reserved:
    taken = take(refund_call(payment_id, amount))
    store.record_outcome(taken.call, taken.attempt, Result.AMBIGUOUS, error="read timed out")
    return taken


def test_an_ambiguous_attempt_holds_its_charge(clock):
    ambiguous("txn_1", 60_000)
    consumed, held, holding = store.budget_usage("support", "amount", DAY)
    assert (consumed, held) == (0, 60_000)
    assert holding == [("refund:txn_1", "ambiguous", 60_000, 1, clock.now)]
    assert take(refund_call("txn_2", 50_000)).error.reason == "budget_exhausted"  # held counts


def test_a_hook_saying_not_executed_releases(clock):
    taken = ambiguous("txn_1", 60_000)
    moved = store.record_reconciliation("refund:txn_1", taken.call.action.action_id, "reconcile:test", "deferred",
                                        store.HookAnswer("not_executed"), attempt=1)
    assert moved == "failed"
    assert ledger("amount") == [("support", "amount", 60_000, "refund:txn_1", 1, True)]
    assert spent() == (0, 0)


def test_a_hook_saying_unknown_keeps_holding(clock):
    taken = ambiguous("txn_1", 60_000)
    store.record_reconciliation("refund:txn_1", taken.call.action.action_id, "reconcile:test", "deferred",
                                store.HookAnswer("unknown"), attempt=1)
    assert spent() == (0, 60_000)


def test_a_person_resolving_failed_releases_and_committed_keeps(clock):
    ambiguous("txn_1", 30_000)
    ambiguous("txn_2", 40_000)
    lines = run_command("resolve", "refund:txn_1", "--failed", "--by", "rita", "--reason", "no refund at stripe")
    assert lines
    store.resolve("refund:txn_2", "committed", by="rita", reason="stripe shows it")
    assert ledger("amount") == [("support", "amount", 30_000, "refund:txn_1", 1, True),
                                ("support", "amount", 40_000, "refund:txn_2", 1, False)]
    assert spent() == (40_000, 0)


def test_committed_is_never_released_and_a_late_outcome_changes_nothing(clock):
    taken = run(refund_call("txn_1", 40_000))
    late = store.record_outcome(taken.call, taken.attempt, Result.FAILED, error="late")
    assert not late.accepted
    assert ledger("amount") == [("support", "amount", 40_000, "refund:txn_1", 1, False)]
    assert spent() == (40_000, 0)


def test_a_swept_attempt_holds_and_its_late_failure_changes_nothing(clock):
    taken = take(refund_call("txn_1", 40_000))
    clock.advance(minutes=6)
    (swept,) = store.sweep_lapsed()
    assert swept.state == "ambiguous"
    late = store.record_outcome(taken.call, taken.attempt, Result.FAILED, error="it raised NotExecuted, too late")
    assert not late.accepted
    assert spent() == (0, 40_000)  # still held: nobody knows whether it ran
    swept_receipt = [r for r in receipts() if r["effect_key"] == "refund:txn_1" and r["attempt"] == 1][0]
    assert swept_receipt["result"] == "ambiguous"
    assert swept_receipt["budget_charges"] == [{"grant_id": "support", "metric": "amount", "amount": 40_000},
                                               {"grant_id": "support", "metric": "count", "amount": 1}]


# --------------------------------------------------------------------------- approvals and other refusals


def granted_approval(call: store.Call) -> str:
    request = store.request_approval(call, dt.timedelta(hours=48))
    store.answer_approval(request.approval_id, True, by="ana")
    return request.approval_id


def test_a_budget_refusal_leaves_the_approval_granted(clock):
    run(refund_call("txn_1", 90_000))
    call = refund_call("txn_2", 20_000, decision=Decision.APPROVE, reason="rule[1]")
    approval_id = granted_approval(call)
    refused = take(call, presented=approval_id)
    assert refused.error.reason == "budget_exhausted"
    assert Approval.objects.get(pk=approval_id).status == "granted"
    receipt = receipts()[-1]
    assert (receipt["result"], receipt["decision"], receipt["approval_id"]) == ("denied", "deny", approval_id)
    assert event("ACTION_DENIED", approval_id=approval_id).data["reason"] == "budget_exhausted"
    clock.advance(hours=24)  # the first refund leaves the window: the same approval now runs it
    taken = take(call, presented=approval_id)
    assert isinstance(taken, store.Reserved)
    assert Approval.objects.get(pk=approval_id).status == "consumed"


def test_a_duplicate_is_refused_as_one_and_charges_nothing(clock):
    run(refund_call("txn_1", 40_000))
    refused = take(refund_call("txn_1", 40_000))
    assert isinstance(refused.error, ctrlrun.DuplicateEffect)
    assert refused.call.budget_charges == () and receipts()[-1]["budget_charges"] == []
    assert len(ledger("amount")) == 1


def test_the_attempt_ceiling_comes_before_the_budget(clock):
    run(refund_call("txn_1", 90_000), Result.FAILED)
    run(refund_call("txn_2", 90_000))
    refused = take(refund_call("txn_1", 90_000), max_attempts=1)
    assert refused.error.reason == "attempt_ceiling" and receipts()[-1]["budget_charges"] == []


def test_an_unkeyed_call_with_charges_is_refused_clearly():
    call = store.Call(ctrlrun.Action("audit.note", {}, ctrlrun.Principal(agent="a"), environment=conf.environment()),
                      Decision.ALLOW, "decision", None, None, budget_charges=(count_budget(),))
    with pytest.raises(ctrlrun.InvalidArgument, match="needs an effect key"):
        store.begin_unkeyed(call)


def test_charges_are_checked_when_they_are_made():
    with pytest.raises(ValueError, match="amount and limit are >= 0"):
        store.Charge("support", "amount", -1, 10, DAY)
    with pytest.raises(ValueError, match="at least 1 second"):
        store.Charge("support", "amount", 1, 10, 0)
    with pytest.raises(TypeError, match="must be an int"):
        store.Charge("support", "amount", True, 10, DAY)


BIG_POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: metered
      subject: {agent: metered}
      actions: [stripe.refund]
      budgets: [{metric: amount, limit: 9223372036854775807, window: P1D}]
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
"""


def test_an_amount_too_big_for_the_ledger_is_refused_before_anything_runs():
    control = Control(policy=parse_policy(BIG_POLICY))
    ran = []
    with pytest.raises(ctrlrun.InvalidArgument) as refused:
        control.call("stripe.refund", {"payment_id": "p1", "amount": 10**20}, lambda: ran.append(1),
                     principal="metered")
    assert refused.value.reason == "budget_unmeasurable"
    assert ran == [] and not BudgetLedger.objects.exists()
    assert control.call("stripe.refund", {"payment_id": "p2", "amount": 10**18}, lambda: "ok",
                        principal="metered") == "ok"
    assert store.verify().ok


def test_a_limit_the_ledger_cannot_sum_is_refused_when_the_policy_loads():
    from ctrlrun.errors import PolicyError

    with pytest.raises(PolicyError, match="at most 9223372036854775807"):
        parse_policy(BIG_POLICY.replace("9223372036854775807", "9223372036854775808"))


# --------------------------------------------------------------------------- observe mode


def test_observe_mode_reports_an_exhausted_budget_and_charges_nothing(clock):
    run(refund_call("txn_1", 90_000))
    seen = store.observe_begin(refund_call("txn_2", 20_000), LEASE)
    assert seen.held and seen.budget_exhausted
    assert seen.would_have(False) == {"decision": "allow", "reason": "rule[0]", "blocked_reason": "budget_exhausted"}
    assert seen.call.budget_charges == ()
    assert len(ledger("amount")) == 1  # observe mode writes no rows
    store.record_outcome(seen.call, seen.attempt, Result.COMMITTED, would_have=seen.would_have(False))
    receipt = receipts()[-1]
    assert receipt["result"] == "observed" and receipt["would_have"]["blocked_reason"] == "budget_exhausted"
    assert receipt["budget_charges"] == []
    fits = store.observe_begin(refund_call("txn_3", 10_000), LEASE)
    assert not fits.budget_exhausted and fits.would_have(False)["blocked_reason"] is None


def test_blocked_reason_puts_the_budget_after_the_ceiling_and_before_the_approval_gate():
    assert blocked_reason(Decision.APPROVE, "rule[1]", presented=False, ceiling=True, budget=True) == "attempt_ceiling"
    assert blocked_reason(Decision.APPROVE, "rule[1]", presented=False, budget=True) == "budget_exhausted"
    assert blocked_reason(Decision.APPROVE, "rule[1]", presented=True, budget=True,
                          approval_problem="mismatch") == "budget_exhausted"
    assert blocked_reason(Decision.DENY, "rule[2]", presented=False, budget=True) == "rule[2]"
    assert blocked_reason(Decision.APPROVE, "rule[1]", presented=False) == "approval_required"


# --------------------------------------------------------------------------- reports and the guard


def test_effects_shows_what_the_attempt_spent_or_holds(clock):
    run(refund_call("txn_1", 40_000))
    take(refund_call("txn_2", 10_000))
    run(refund_call("txn_3", 5), Result.FAILED)
    lines = {line.split()[0]: line for line in run_command("effects")}
    assert lines["refund:txn_1"].endswith("  spent 40000 amount on support, 1 count on support")
    assert lines["refund:txn_2"].endswith("  holds 10000 amount on support, 1 count on support")
    assert "spent" not in lines["refund:txn_3"] and "holds" not in lines["refund:txn_3"]  # released


def test_stats_counts_the_ledger_rows(clock):
    run(refund_call("txn_1", 40_000))
    run(refund_call("txn_2", 1), Result.FAILED)
    assert store.ledger_rows() == 4
    (line,) = [line for line in run_command("stats") if "budget ledger rows" in line]
    assert line.split()[-1] == "4"
    assert json.loads("\n".join(run_command("stats", "--json")))["ledger_rows"] == 4


def test_the_database_refuses_to_delete_ledger_rows(clock):
    run(refund_call("txn_1", 40_000))
    with pytest.raises(DatabaseError, match="never deleted"):
        with transaction.atomic():
            BudgetLedger.objects.all().delete()
    assert len(ledger()) == 2
    row = BudgetLedger.objects.first()
    row.released_at = clock.now  # releasing a committed charge: refused, whoever asks
    with pytest.raises(DatabaseError, match="effect record of its attempt is failed"), transaction.atomic():
        row.save(update_fields=["released_at"])


LEDGER_ROW = ("support", "amount", 40_000, "refund:p1", 1)


def _charged_row():
    import datetime as dt

    from ctrlrun.models import BudgetLedger as Row

    return Row.objects.create(grant_id="support", metric="amount", amount=40_000, effect_key="refund:p1", attempt=1,
                              consumed_at=dt.datetime(2026, 11, 29, 12, tzinfo=dt.timezone.utc), n=1, cum=40_000)


@pytest.mark.parametrize("change", [
    'UPDATE "ctrlrun_budgetledger" SET "amount" = 0',
    'UPDATE "ctrlrun_budgetledger" SET "consumed_at" = \'2000-01-01 00:00:00\'',
    'UPDATE "ctrlrun_budgetledger" SET "grant_id" = \'elsewhere\'',
    'UPDATE "ctrlrun_budgetledger" SET "effect_key" = \'refund:other\', "attempt" = 7',
    'UPDATE "ctrlrun_budgetledger" SET "cum" = 0',
    'UPDATE "ctrlrun_budgetledger" SET "n" = 2',
])
def test_plain_dml_cannot_erase_spend_by_rewriting_a_ledger_row(change):
    from django.db import DatabaseError, connection, transaction

    row = _charged_row()
    with pytest.raises(DatabaseError, match="ledger"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(change)
    row.refresh_from_db()
    assert (row.grant_id, row.metric, row.amount, row.effect_key, row.attempt) == LEDGER_ROW
    assert row.consumed_at.year == 2026


def test_a_released_charge_stays_released():
    from django.db import DatabaseError, connection, transaction

    from tests.support import hold_key

    row = _charged_row()
    hold_key("refund:p1")  # the attempt that made the charge ends failed (NotExecuted)...
    EffectRecord.objects.filter(pk="refund:p1").update(state="failed", lease_expires_at=None)
    with connection.cursor() as cursor:  # ...which is when the store releases it: allowed
        cursor.execute('UPDATE "ctrlrun_budgetledger" SET "released_at" = "consumed_at"')
    with pytest.raises(DatabaseError, match="ledger"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute('UPDATE "ctrlrun_budgetledger" SET "released_at" = NULL')
    row.refresh_from_db()
    assert row.released_at is not None


def test_a_colliding_insert_cannot_replace_a_ledger_row():
    """An insert that collides with a row and overwrites it: SQLite's REPLACE (which deletes the row it
    collides with without firing DELETE triggers), PostgreSQL's ON CONFLICT DO UPDATE. Both are refused."""
    from django.db import DatabaseError, connection, transaction

    row = _charged_row()
    columns = ('"id", "grant_id", "metric", "amount", "effect_key", "attempt", "consumed_at", "released_at"')
    values = "(%s, 'support', 'amount', 0, 'refund:p1', 1, '2026-11-29 12:00:00+00', NULL)"
    if connection.vendor == "sqlite":
        statement = f'INSERT OR REPLACE INTO "ctrlrun_budgetledger" ({columns}) VALUES {values}'
    else:
        statement = (f'INSERT INTO "ctrlrun_budgetledger" ({columns}) VALUES {values} '
                     f'ON CONFLICT ("id") DO UPDATE SET "amount" = 0')
    with pytest.raises(DatabaseError, match="ledger"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [row.id])
    row.refresh_from_db()
    assert row.amount == 40_000


# --------------------------------------------------------------------------- OS processes racing

RACER = """
import datetime as dt, fcntl, json, sys, time
import ctrlrun
ctrlrun.setup()
from ctrlrun import conf, store

start_at, worker, tries, limit = float(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
charges = (store.Charge("support", "count", 1, limit, 86400), store.Charge("org", "amount", 10, 10 * limit, 86400))
principal = ctrlrun.Principal(agent="worker-" + worker)
counts = {"ran": 0, "exhausted": 0, "other": []}
store.ledger_rows()  # connected and warm before the start
while time.time() < start_at:
    time.sleep(0.001)
for n in range(tries):
    key = f"refund:w{worker}-{n}"
    action = ctrlrun.Action("stripe.refund", {"payment_id": key, "amount": 10}, principal,
                            environment=conf.environment())
    call = store.Call(action, ctrlrun.Decision.ALLOW, "rule[0]", None, key, budget_charges=charges)
    try:
        taken = store.reserve(call, dt.timedelta(minutes=5), opening=True, hold_ambiguous=False)
    except ctrlrun.CTRLRunError as exc:
        counts["other"].append(f"{type(exc).__name__}: {exc}")
        continue
    if isinstance(taken, store.Reserved):
        with open("executions.log", "a") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            log.write(key + "\\n")
        store.record_outcome(taken.call, taken.attempt, ctrlrun.Result.COMMITTED, value=key)
        counts["ran"] += 1
    elif getattr(taken.error, "reason", None) == "budget_exhausted":
        counts["exhausted"] += 1
    else:
        counts["other"].append(f"{type(taken.error).__name__}: {taken.error}")
print(json.dumps(counts))
"""


@pytest.mark.slow
def test_eight_processes_racing_spend_the_budget_exactly_once(tmp_path):
    """Eight OS processes, three calls each, for a budget with room for exactly five: five run, nineteen
    are refused, and the ledger sums to the limit on both budgets."""
    workers, tries, limit = 8, 3, 5
    env = script_environment(tmp_path, LEDGER_POLICY)
    (tmp_path / "racer.py").write_text(RACER)
    start_at = time.time() + 5.0
    outputs = run_together(tmp_path, "racer.py", [[str(start_at), str(n), str(tries), str(limit)]
                                                  for n in range(workers)], env)
    counts = [json.loads(out) for out in outputs]
    assert [c["other"] for c in counts] == [[]] * workers
    assert sum(c["ran"] for c in counts) == limit
    assert sum(c["exhausted"] for c in counts) == workers * tries - limit
    executed = (tmp_path / "executions.log").read_text().split()
    assert len(executed) == len(set(executed)) == limit
    assert sum(BudgetLedger.objects.filter(metric="count").values_list("amount", flat=True)) == limit
    assert sum(BudgetLedger.objects.filter(metric="amount").values_list("amount", flat=True)) == 10 * limit
    assert set(BudgetLedger.objects.values_list("effect_key", flat=True)) == set(executed)
    assert store.budget_usage("support", "count", DAY)[:2] == (limit, 0)
    for metric in ("count", "amount"):  # each chain written in turn under its lock: no gap, no fork, true totals
        chain = list(BudgetLedger.objects.filter(metric=metric).order_by("n").values_list("n", "amount", "cum",
                                                                                           "consumed_at"))
        assert [n for n, *_ in chain] == list(range(1, limit + 1))
        assert [cum for _, _, cum, _ in chain] == [sum(a for _, a, _, _ in chain[:i + 1]) for i in range(limit)]
        assert [at for *_, at in chain] == sorted(at for *_, at in chain)
    assert EffectRecord.objects.filter(state="committed").count() == limit
    assert store.verify().ok
