"""Each migration installs its own frozen guard version with its record, and its reverse puts back the
version before: ``migrate ctrlrun 0008`` and back on a scratch store (an OS process), on the database
the suite runs on (a SQLite file, or a scratch PostgreSQL database). ``manage.py check``'s W005 stays
silent while a migration is pending, names a guard removed afterwards, and ``migrate`` puts it back."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest

from ctrlrun import guards
from tests.support import POSTGRES_ADMIN_URL, REPO, require_postgresql

pytestmark = pytest.mark.slow

SCRIPT = r'''
import json, sys
from ctrlrun import standalone
standalone.configure_settings()
from django.core.management import call_command
from django.db import connection
from ctrlrun import guards
from ctrlrun.checks import check_guard

from django.db import transaction

def refused():
    """Whether the installed guard refuses moving the chain head back (every version does)."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute('UPDATE "ctrlrun_chainhead" SET "seq" = "seq" - 1')
    except Exception:
        return True
    return False

def state():
    version = guards.installed(connection)
    return [version, guards.missing_triggers(connection, version) if version else None,
            [m.id for m in check_guard()], refused()]

out = {}
call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
out["latest"] = state()
for target in sys.argv[1:]:
    call_command("migrate", "ctrlrun", target, verbosity=0, interactive=False)
    out["back " + target] = state()
for target in reversed(sys.argv[1:-1]):
    call_command("migrate", "ctrlrun", target, verbosity=0, interactive=False)
    out["forward " + target] = state()
call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
out["again"] = state()
guards.remove(connection)
out["removed"] = state()
call_command("migrate", "ctrlrun", verbosity=0, interactive=False)
out["repaired"] = state()
print(json.dumps(out))
'''

#: Where to step, newest first, and the guard version each leaves in place.
STEPS = {"0031_suspended_continuations": 13, "0027_retention": 12, "0026_ledger_chains": 11, "0025_verified_approvers": 10, "0024_notifications": 9, "0022_approval_preconditions": 8, "0019_drop_unread_indexes": 7,
         "0017_approval_returned": 7, "0016_signed_rows": 6, "0015_ledger_release_only": 5, "0014_delegations": 4,
         "0013_budget_ledger": 3, "0012_paused_run_release": 2, "0009_chain_checks": 2,
         "0008_event_chain_and_signatures": 1}


@pytest.fixture
def scratch(tmp_path, django_db_blocker):
    """Environment variables for a process whose store is a fresh database of the suite's vendor."""
    from django.db import connection

    env = {k: v for k, v in os.environ.items()
           if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "CTRLRUN_STORE_URL", "CTRLRUN_CONFIG",
                        "CTRLRUN_STATE")}
    (tmp_path / "ctrlrun.yaml").write_text("schema: ctrlrun.policy/v2\nactions: {}\n")
    env.update(PYTHONPATH=str(REPO), CTRLRUN_CONFIG=str(tmp_path / "ctrlrun.yaml"))
    if connection.vendor == "sqlite":
        env["CTRLRUN_STATE"] = str(tmp_path / "store.db")
        yield env
        return
    require_postgresql()
    name = f"ctrlrun_guardv_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env["CTRLRUN_STORE_URL"] = f"postgresql://postgres@127.0.0.1:5432/{name}"
        yield env
    finally:
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrating_back_to_0008_and_forward_installs_each_version(scratch, tmp_path):
    done = subprocess.run([sys.executable, "-c", SCRIPT, *STEPS], cwd=tmp_path, env=scratch, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    current = guards.CURRENT
    expected = {"latest": [current, [], [], True], "again": [current, [], [], True],
                "removed": [None, None, ["ctrlrun.W005"], False], "repaired": [current, [], [], True]}
    # W005 is silent while a migration is pending: migrating installs each version
    expected.update({f"back {t}": [v, [], [], True] for t, v in STEPS.items()})
    expected.update({f"forward {t}": [v, [], [], True] for t, v in list(STEPS.items())[:-1]})
    assert out == expected
