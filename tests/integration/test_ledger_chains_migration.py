"""Migration 0026 on a store migrated to 0019 holding budget charges (an OS process on a scratch
SQLite file): each (grant, metric)'s rows get their places in (consumed_at, id) order with running
totals, a row whose v1 signature held is signed v2 and one that did not stays unsigned, the budget
check finds what the rows sum to, and the guard is version 8 (a row off its chain is refused)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import LEDGER_POLICY, REPO

SCRIPT = r'''
import datetime as dt, json
from ctrlrun import standalone
standalone.configure_settings()
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

call_command("migrate", "ctrlrun", "0019_drop_unread_indexes", verbosity=0, interactive=False)
from ctrlrun import guards
from ctrlrun.store import signatures as sig
Old = MigrationExecutor(connection).loader.project_state(("ctrlrun", "0019_drop_unread_indexes")).apps.get_model(
    "ctrlrun", "BudgetLedger")
noon = dt.datetime(2026, 12, 1, 12, tzinfo=dt.timezone.utc)
# written out of time order (a transaction that waited for the lock), one released, one forged
for key, metric, amount, minutes, released, good in (
        ("refund:a", "amount", 10, 5, False, True), ("refund:b", "amount", 20, 1, True, True),
        ("refund:c", "amount", 30, 9, False, False), ("refund:a", "count", 1, 5, False, True)):
    at = noon + dt.timedelta(minutes=minutes)
    fields = ("support", metric, amount, key, 1, at, at if released else None)
    Old.objects.create(grant_id="support", metric=metric, amount=amount, effect_key=key, attempt=1, consumed_at=at,
                       released_at=fields[-1], mac=sig.ledger_mac_v1(*fields) if good else "forged")
call_command("migrate", "ctrlrun", "0026_ledger_chains", verbosity=0, interactive=False)
from ctrlrun.models import BudgetLedger
from ctrlrun import store
from ctrlrun.store import budgets
from ctrlrun.store.base import write_phase
out = {"guard": guards.installed(connection)}
out["rows"] = [[r.effect_key, r.metric, r.n, r.cum, sig.ledger_ok((r.grant_id, r.metric, r.amount, r.effect_key,
               r.attempt, r.consumed_at, r.released_at, r.n, r.cum), r.mac)]
               for r in BudgetLedger.objects.order_by("metric", "n")]
with write_phase():
    out["spent"] = [budgets.exhausted([store.Charge("support", "amount", 1, 0, 86400)], noon + dt.timedelta(hours=1),
                                      lock=False)[1],
                    budgets.exhausted([store.Charge("support", "amount", 1, 0, 60 * 60 + 60 * 5)],  # from 12:05 on
                                      noon + dt.timedelta(hours=1, minutes=10), lock=False)[1]]
try:
    with connection.cursor() as cursor:
        cursor.execute('INSERT INTO "ctrlrun_budgetledger" ("grant_id", "metric", "amount", "effect_key", "attempt", '
                       '"consumed_at", "n", "cum") VALUES (\'support\', \'amount\', 5, \'refund:d\', 1, '
                       '\'2026-12-01 13:00:00\', 4, 0)')
    out["off_chain"] = "allowed"
except Exception:
    out["off_chain"] = "refused"
print(json.dumps(out))
'''


def test_0026_chains_the_rows_and_re_signs_what_verified(tmp_path):
    (tmp_path / "ctrlrun.yaml").write_text(LEDGER_POLICY)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_CONFIG")}
    env.update(PYTHONPATH=str(REPO), CTRLRUN_CONFIG=str(tmp_path / "ctrlrun.yaml"),
               CTRLRUN_STATE=str(tmp_path / "store.db"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["guard"] == 11
    assert out["rows"] == [["refund:b", "amount", 1, 20, True], ["refund:a", "amount", 2, 30, True],
                           ["refund:c", "amount", 3, 60, False], ["refund:a", "count", 1, 1, True]]
    assert out["spent"] == [40, 30]  # 10 + 30 (20 released); from 12:05 on (exclusive): 30
    assert out["off_chain"] == "refused"
