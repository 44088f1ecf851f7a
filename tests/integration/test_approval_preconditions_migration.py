"""Migration 0022 on a store migrated to 0019 holding approvals (an OS process on a scratch SQLite
file): a row whose v2 signature holds is re-signed as v3 (no fingerprint) and still verifies; one that
did not verify still does not; the guard is back at version 8 and keeps the fingerprint fixed.
Backwards, a v3 row without a fingerprint verifies as v2 again, and one bound to a state is left
unsigned (never used unbound)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support import REPO

SCRIPT = r'''
import datetime as dt, json, os, sys
import django
django.setup()
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

call_command("migrate", "ctrlrun", "0019_drop_unread_indexes", verbosity=0, interactive=False)
from ctrlrun import guards, signing
from ctrlrun.store import signatures as sig
Approval = MigrationExecutor(connection).loader.project_state(("ctrlrun", "0019_drop_unread_indexes")).apps.get_model(
    "ctrlrun", "Approval")
now = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
guards.remove(connection)
for ident, good in (("apr_" + "a" * 32, True), ("apr_" + "b" * 32, False)):
    row = Approval(approval_id=ident, status="granted", action="stripe.refund", action_id="act_1",
                   action_hash="sha256:" + "0" * 64, action_json="{}", agent="support-agent",
                   effect_key="refund:t1", decision_reason="rule[1]", created_at=now, expires_at=now,
                   approver="bob", answered_at=now)
    row.mac = signing.sign(sig.APPROVAL_DOMAIN_V2, sig.approval_document_v2(row)) if good else "forged"
    row.save()
guards.install(connection, 7)
call_command("migrate", "ctrlrun", "0022_approval_preconditions", verbosity=0, interactive=False)
from ctrlrun.models import Approval as Current
out = {"guard": guards.installed(connection)}
out.update({r.approval_id[4]: sig.approval_signature_ok(r) for r in Current.objects.all()})
try:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE ctrlrun_approval SET precondition_fingerprint = 'sha256:x'")
    out["rebind"] = "allowed"
except Exception:
    out["rebind"] = "refused"
bound = Current.objects.get(approval_id="apr_" + "a" * 32)
bound.approval_id, bound.precondition_fingerprint = "apr_" + "c" * 32, "sha256:" + "1" * 64
sig.sign_approval(bound)
guards.remove(connection)
bound.save(force_insert=True)
call_command("migrate", "ctrlrun", "0019_drop_unread_indexes", verbosity=0, interactive=False)
out["back_guard"] = guards.installed(connection)
back = MigrationExecutor(connection).loader.project_state(("ctrlrun", "0019_drop_unread_indexes")).apps.get_model(
    "ctrlrun", "Approval")
out["back"] = {r.approval_id[4]: signing.is_valid(sig.APPROVAL_DOMAIN_V2, sig.approval_document_v2(r), r.mac)
               for r in back.objects.all()}
print(json.dumps(out))
'''


def test_0022_re_signs_what_verified_and_nothing_else(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_CONFIG")}
    env.update(PYTHONPATH=str(REPO), DJANGO_SETTINGS_MODULE="project.settings", DEBUG="1",
               DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
               CTRLRUN_SIGNING_KEY="tests-only-signing-key-0123456789abcdef")
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"guard": 8, "a": True, "b": False, "rebind": "refused", "back_guard": 7,
                   "back": {"a": True, "b": False, "c": False}}
