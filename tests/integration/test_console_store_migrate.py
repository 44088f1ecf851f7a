"""A store made by a plain script (or by the demo) becomes a console database with one ``migrate``.

Each test is real processes on real databases: a plain script (no Django project, cwd in a folder
holding ctrlrun.yaml) makes protected calls and so creates its store; then ``python manage.py
migrate`` is run from the repository root with ``DATABASE_URL`` pointing at that store, as the
docs/console.md says; the console's groups must then exist with their permissions, and the script's receipts
must still be there with their chain intact (read by the console's ``manage.py receipts`` and by the
script folder's ``ctrlrun receipts``).

A standalone store applies only ctrlrun's migrations (no auth, no contenttypes installed): these
tests are what failed with ``InconsistentMigrationHistory`` when migration 0005 depended on auth's
migrations only where auth was installed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support import REPO, require_postgresql

POLICY = """\
schema: ctrlrun.policy/v2
actions:
  email.send:
    effect: "email:{msg_id}"
    decision: allow
  iam.grant_admin:
    decision: deny
"""

#: Three calls: two sent, one denied (a refusal leaves a receipt too); argv[1] names the messages.
SCRIPT = """
import sys

import ctrlrun

@ctrlrun.protect("email.send", effect="email:{msg_id}")
def send(msg_id: str) -> str:
    return "sent " + msg_id

@ctrlrun.protect("iam.grant_admin")
def grant(user: str) -> None:
    raise SystemExit("a denied call ran")

with ctrlrun.context(agent="mailer"):
    batch = sys.argv[1] if len(sys.argv) > 1 else ""
    print(send(msg_id="m1" + batch))
    print(send(msg_id="m2" + batch))
    try:
        grant(user="mallory")
    except ctrlrun.ActionDenied:
        print("denied")
"""

VIEW_ALL = ["view_approval", "view_delegation", "view_effectrecord", "view_event", "view_policydocument", "view_receipt"]
#: The console's groups and their permissions (ctrlrun's app label), as the console needs them.
GROUPS = {
    "approvers": sorted(VIEW_ALL + ["decide_approval"]),
    "auditors": sorted(VIEW_ALL),
    "resolvers": sorted(VIEW_ALL + ["resolve_effect"]),
}

#: Prints {group: [codename, ...]} for every group, and the receipt count, as JSON.
SHOW = """
import json
from django.contrib.auth.models import Group
from ctrlrun.models import Receipt
groups = {g.name: sorted(f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.all())
          for g in Group.objects.order_by("name")}
print(json.dumps({"groups": groups, "receipts": Receipt.objects.count()}))
"""

#: What an operator might do: take decide_approval away from approvers (e.g. during an incident).
REVOKE = """
from django.contrib.auth.models import Group, Permission
Group.objects.get(name="approvers").permissions.remove(Permission.objects.get(codename="decide_approval"))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this test run's database, settings or signing key."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLRUN_") and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "SECRET_KEY")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done


def manage(*args: str, database_url: str, key_file: Path) -> subprocess.CompletedProcess:
    """``python manage.py ARGS`` from the repository root on the given store, as docs/console.md says:
    DATABASE_URL at the store, and CTRLRUN_SIGNING_KEY the script's key (its key file's text): the
    console has a SECRET_KEY of its own, and a key derived from it would not be the store's."""
    env = clean_env(DATABASE_URL=database_url, CTRLRUN_SIGNING_KEY=key_file.read_text().strip(),
                    SECRET_KEY="a-console-secret-key-not-the-signing-key", DEBUG="1")
    return run([sys.executable, "manage.py", *args], REPO, env)


def script_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "agent"
    folder.mkdir()
    (folder / "ctrlrun.yaml").write_text(POLICY)
    (folder / "agent.py").write_text(SCRIPT)
    return folder


def console_state(database_url: str, key_file: Path) -> dict:
    shown = ok(manage("shell", "-v", "0", "-c", SHOW, database_url=database_url, key_file=key_file)).stdout
    return json.loads(shown.strip().splitlines()[-1])


def expected_groups() -> dict[str, list[str]]:
    return {name: [f"ctrlrun.{codename}" for codename in codenames] for name, codenames in GROUPS.items()}


def check_becomes_console(folder: Path, database_url: str, key_file: Path, receipts: int,
                          cli_env: dict[str, str]) -> None:
    """One migrate makes the store a console database; the evidence is intact, from both sides."""
    migrated = ok(manage("migrate", "--no-input", database_url=database_url, key_file=key_file))
    assert "InconsistentMigrationHistory" not in migrated.stderr
    state = console_state(database_url, key_file)
    assert state == {"groups": expected_groups(), "receipts": receipts}

    verified = ok(manage("receipts", "--verify-chain", database_url=database_url, key_file=key_file))
    assert f"chain: {receipts} of {receipts} receipts verified" in verified.stdout
    assert "the chain is intact" in verified.stdout
    assert "signature_invalid" not in verified.stdout
    listed = ok(manage("receipts", database_url=database_url, key_file=key_file)).stdout.splitlines()
    assert len(listed) == receipts

    # The script's side still reads (and writes) the same store, now that it has the console's tables.
    again = ok(run([sys.executable, "agent.py", "-again"], folder, cli_env))
    assert again.stdout.split() == ["sent", "m1-again", "sent", "m2-again", "denied"]
    standalone = ok(run([sys.executable, "-m", "ctrlrun", "receipts", "--verify-chain"], folder, cli_env))
    assert "the chain is intact" in standalone.stdout

    # A second migrate changes nothing, and leaves a group an operator changed as the operator left it.
    ok(manage("shell", "-c", REVOKE, database_url=database_url, key_file=key_file))
    ok(manage("migrate", "--no-input", database_url=database_url, key_file=key_file))
    changed = console_state(database_url, key_file)["groups"]
    assert changed["approvers"] == [p for p in expected_groups()["approvers"] if p != "ctrlrun.decide_approval"]
    assert changed["resolvers"] == expected_groups()["resolvers"]


@pytest.mark.slow
def test_a_scripts_sqlite_store_becomes_a_console_database_with_one_migrate(tmp_path):
    """A plain script's .ctrlrun/state.db: migrate succeeds, the three groups exist, the receipts are intact."""
    folder = script_folder(tmp_path)
    env = clean_env()
    first = ok(run([sys.executable, "agent.py"], folder, env))
    assert first.stdout.split() == ["sent", "m1", "sent", "m2", "denied"]
    store = folder / ".ctrlrun" / "state.db"
    key_file = folder / ".ctrlrun" / "signing.key"
    assert store.exists() and key_file.exists()

    check_becomes_console(folder, f"sqlite:///{store}", key_file, receipts=3, cli_env=env)


@pytest.mark.slow
def test_the_demos_store_becomes_a_console_database_with_one_migrate(tmp_path):
    """`manage.py demo` keeps its store in DIR/.ctrlrun/state.db (docs/console.md says to browse it in the
    console): one migrate makes it a console database, and its receipts verify there."""
    demo_dir = tmp_path / "demo"
    env = clean_env()
    ok(run([sys.executable, "manage.py", "demo", "--dir", str(demo_dir)], REPO, env, timeout=600))
    store = demo_dir / ".ctrlrun" / "state.db"
    key_file = demo_dir / ".ctrlrun" / "signing.key"
    assert store.exists() and key_file.exists()
    database_url = f"sqlite:///{store}"
    count = len(ok(run([sys.executable, "-m", "ctrlrun", "receipts"], demo_dir, env)).stdout.splitlines())
    assert count > 5

    ok(manage("migrate", "--no-input", database_url=database_url, key_file=key_file))
    assert console_state(database_url, key_file) == {"groups": expected_groups(), "receipts": count}
    verified = ok(manage("receipts", "--verify-chain", database_url=database_url, key_file=key_file))
    assert "the chain is intact" in verified.stdout and "signature_invalid" not in verified.stdout
    assert "the chain is intact" in ok(run([sys.executable, "-m", "ctrlrun", "receipts", "--verify-chain"],
                                           demo_dir, env)).stdout


def _postgres_server() -> dict:
    """The PostgreSQL server this test run uses (DATABASE_URL), else the machine's own at 127.0.0.1:5432:
    the test runs in the SQLite pass too (skipped there only on a machine with no server, never in CI)."""
    from django.db import connection

    settings_dict = connection.settings_dict
    if not settings_dict["ENGINE"].endswith("postgresql"):
        require_postgresql()
        return {"user": "postgres", "password": "", "host": "127.0.0.1", "port": 5432}
    return {"user": settings_dict.get("USER") or "postgres", "password": settings_dict.get("PASSWORD") or "",
            "host": settings_dict.get("HOST") or "127.0.0.1", "port": settings_dict.get("PORT") or 5432}


@pytest.fixture
def scratch_postgres():
    """A new, empty PostgreSQL database of its own (created and dropped here); its URL."""
    server = _postgres_server()
    import psycopg

    name = f"ctrlrun_console_{uuid.uuid4().hex[:12]}"
    admin = dict(server, dbname="postgres")
    with psycopg.connect(**admin, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    password = f":{server['password']}" if server["password"] else ""
    yield f"postgresql://{server['user']}{password}@{server['host']}:{server['port']}/{name}"
    with psycopg.connect(**admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.slow
def test_a_postgresql_store_first_made_by_a_script_becomes_a_console_database(tmp_path, scratch_postgres):
    """CTRLRUN_STORE_URL=postgresql://... for the script, then DATABASE_URL=the same for migrate: groups, receipts."""
    folder = script_folder(tmp_path)
    env = clean_env(CTRLRUN_STORE_URL=scratch_postgres)
    first = ok(run([sys.executable, "agent.py"], folder, env))
    assert first.stdout.split() == ["sent", "m1", "sent", "m2", "denied"]
    key_file = folder / ".ctrlrun" / "signing.key"  # beside the policy, for a PostgreSQL store
    assert key_file.exists() and not (folder / ".ctrlrun" / "state.db").exists()
    check_becomes_console(folder, scratch_postgres, key_file, receipts=3, cli_env=env)


@pytest.mark.slow
def test_manage_py_reads_a_scripts_store_without_a_secret_key(tmp_path):
    """No SECRET_KEY and no CTRLRUN_SIGNING_KEY (commands run without one): manage.py finds the key
    file beside the SQLite store, as the script did, instead of failing with a traceback."""
    folder = script_folder(tmp_path)
    ok(run([sys.executable, "agent.py"], folder, clean_env()))
    env = clean_env(DATABASE_URL=f"sqlite:///{folder / '.ctrlrun' / 'state.db'}")
    ok(run([sys.executable, "manage.py", "migrate", "--no-input"], REPO, env))
    verified = ok(run([sys.executable, "manage.py", "receipts", "--verify-chain"], REPO, env))
    assert "the chain is intact" in verified.stdout


@pytest.mark.slow
def test_a_named_key_file_wins_over_the_key_derived_from_secret_key(tmp_path):
    """CTRLRUN_SIGNING_KEY_FILE, when given, is the key even inside a project with a SECRET_KEY: the
    console opens a script's store with the path of its key file, no copying of the secret."""
    folder = script_folder(tmp_path)
    ok(run([sys.executable, "agent.py"], folder, clean_env()))
    store_file = folder / ".ctrlrun" / "state.db"
    env = clean_env(DATABASE_URL=f"sqlite:///{store_file}", CTRLRUN_SIGNING_KEY_FILE=str(folder / ".ctrlrun" / "signing.key"),
                    SECRET_KEY="a-console-secret-key-not-the-signing-key", DEBUG="1")
    ok(run([sys.executable, "manage.py", "migrate", "-v", "0"], REPO, env))
    checked = run([sys.executable, "manage.py", "receipts", "--verify-chain"], REPO, env)
    assert checked.returncode == 0 and "the chain is intact" in checked.stdout, checked.stdout + checked.stderr
