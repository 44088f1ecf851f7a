"""Review of issue 12 (authority, delegation, budgets): each test here failed on the code it was
written against, and pins the fix."""
from __future__ import annotations

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.canonical import Principal
from ctrlrun.control import Control
from ctrlrun.models import BudgetLedger, EffectRecord
from ctrlrun.policy import parse_policy
from tests.support import receipts

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: support
      subject: {agent: orchestrator}
      actions: ["stripe.*"]
      resources: ["payment:*"]
      expires_at: "2099-01-01T00:00:00Z"
      delegable: true
    - id: mailer
      subject: {agent: mailer}
      actions: [email.send]
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    decision: allow
  email.send:
    decision: allow
"""
CHILD = """\
subject: {agent: worker}
actions: [stripe.refund]
resources: ["payment:*"]
expires_at: "2098-12-31T00:00:00Z"
"""
ORCHESTRATOR = Principal(agent="orchestrator")


@pytest.fixture
def control():
    return Control(policy=parse_policy(POLICY))


def test_a_delegation_with_a_long_budget_window_does_not_make_every_row_unreadable(control):
    """A window of 12000 days is a valid window (under a hundred years); stored as seconds it must read back."""
    made = control.delegate("support", CHILD + "budgets: [{metric: count, limit: 5, window: P12000D}]\n",
                            by=ORCHESTRATOR)
    assert control.call("email.send", {"msg_id": "m1"}, lambda: "sent", principal="mailer") == "sent"
    assert control.call("stripe.refund", {"payment_id": "p1", "amount": 1}, lambda: "ok", principal="worker") == "ok"
    assert store.get_delegation(made.id).problem is None


def test_every_window_a_row_stores_reads_back():
    from ctrlrun.policy.authority import MAX_WINDOW, parse_window

    assert parse_window("P12000D") == parse_window(f"PT{12000 * 86400}S")
    assert parse_window(f"PT{int(MAX_WINDOW.total_seconds())}S") == MAX_WINDOW
    with pytest.raises(ValueError, match="hundred years"):
        parse_window(f"PT{int(MAX_WINDOW.total_seconds()) + 1}S")
    with pytest.raises(ValueError, match="hundred years"):
        parse_window("P99999999999D")


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


@pytest.mark.slow
def test_delegate_never_reads_more_of_a_grant_file_than_a_policy_may_be(tmp_path):
    """``delegate --file /dev/zero`` must be refused by its size, as a policy file is, not read into memory."""
    import resource
    import subprocess
    import sys

    from tests.support import script_environment

    env = script_environment(tmp_path, POLICY)

    def capped() -> None:  # a process that reads /dev/zero to the end runs out of this, not the machine
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = subprocess.run([sys.executable, "-m", "ctrlrun", "delegate", "--parent", "support", "--file", "/dev/zero",
                           "--as", "orchestrator"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=capped)
    assert done.returncode == 1, done.stderr
    assert "1,048,576 bytes" in done.stderr and "Traceback" not in done.stderr


LEDGER_ROW = ("support", "amount", 40_000, "refund:p1", 1)


def _charged_row():
    import datetime as dt

    from ctrlrun.models import BudgetLedger as Row

    return Row.objects.create(grant_id="support", metric="amount", amount=40_000, effect_key="refund:p1", attempt=1,
                              consumed_at=dt.datetime(2026, 11, 29, 12, tzinfo=dt.timezone.utc))


@pytest.mark.parametrize("change", [
    'UPDATE "ctrlrun_budgetledger" SET "amount" = 0',
    'UPDATE "ctrlrun_budgetledger" SET "consumed_at" = \'2000-01-01 00:00:00\'',
    'UPDATE "ctrlrun_budgetledger" SET "grant_id" = \'elsewhere\'',
    'UPDATE "ctrlrun_budgetledger" SET "effect_key" = \'refund:other\', "attempt" = 7',
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


def test_inspect_grant_shows_a_delegations_budget(control, use_policy):
    """A delegation's budget is charged like a grant's; ``inspect --grant dlg_...`` must show it."""
    from tests.support import run_command

    use_policy(POLICY)
    made = control.delegate("support", CHILD + "budgets: [{metric: count, limit: 5, window: P1D}]\n",
                            by=ORCHESTRATOR)
    assert control.call("stripe.refund", {"payment_id": "p1", "amount": 1}, lambda: "ok", principal="worker") == "ok"
    lines = run_command("inspect", "--grant", made.id)  # the settings' policy is this one (the fixture)
    assert lines[0] == f"grant {made.id}"
    assert any(line.strip().startswith("count: 1 of 5 per day") for line in lines), lines
