"""Migration 0017 on a store migrated to 0016 holding approvals (an OS process on a scratch SQLite
file): a row whose v1 signature holds is re-signed as v2 (returned 0) and still verifies; one that
did not verify still does not; the guard is back, now counting give-backs (version 7, recorded)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import GIVE_BACK_POLICY, REPO

SCRIPT = r'''
import datetime as dt, json, sqlite3, sys
from ctrlrun import standalone
standalone.configure_settings()
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

call_command("migrate", "ctrlrun", "0016_signed_rows", verbosity=0, interactive=False)
from ctrlrun import signing
from ctrlrun.store import signatures as sig
Approval = MigrationExecutor(connection).loader.project_state(("ctrlrun", "0016_signed_rows")).apps.get_model(
    "ctrlrun", "Approval")
now = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
from ctrlrun import guards
assert guards.installed(connection) == 6  # what 0016 installs
guards.remove(connection)
for ident, status, good in (("apr_" + "a" * 32, "granted", True), ("apr_" + "b" * 32, "granted", False),
                            ("apr_" + "c" * 32, "consumed", True)):
    row = Approval(approval_id=ident, status=status, action="stripe.refund", action_id="act_1",
                   action_hash="sha256:" + "0" * 64, action_json="{}", agent="support-agent",
                   effect_key="refund:t1", decision_reason="rule[1]", created_at=now, expires_at=now,
                   approver="bob", answered_at=now, consumed_at=now if status == "consumed" else None,
                   consumed_by="act_1" if status == "consumed" else None)
    row.mac = signing.sign(sig.APPROVAL_DOMAIN_V1, sig.approval_document_v1(row)) if good else "forged"
    row.save()
guards.install(connection, 6)
call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
from ctrlrun.models import Approval as Current
assert guards.installed(connection) == guards.CURRENT  # 7 at 0017, and every later version
out = {r.approval_id[4]: [r.returned, sig.approval_signature_ok(r)] for r in Current.objects.all()}
try:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ctrlrun_approval SET status = 'granted', consumed_at = NULL, consumed_by = NULL "
                       "WHERE status = 'consumed'")
    out["replay"] = "allowed"
except Exception as exc:
    out["replay"] = "refused"
print(json.dumps(out))
'''


def test_0017_re_signs_what_verified_and_nothing_else(tmp_path):
    (tmp_path / "ctrlrun.yaml").write_text(GIVE_BACK_POLICY)
    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_CONFIG")}
    env.update(PYTHONPATH=str(REPO), CTRLRUN_CONFIG=str(tmp_path / "ctrlrun.yaml"),
               CTRLRUN_STATE=str(tmp_path / "store.db"))
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"a": [0, True], "b": [0, False], "c": [0, True], "replay": "refused"}
