"""``ctrlrun init`` / ``manage.py ctrlrun_init``: the starter policy it writes loads and decides as its
comments say, nothing is ever overwritten, and the console script makes .ctrlrun/ beside it."""
from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from ctrlrun.management.commands.ctrlrun_init import STARTER_POLICY, write_new
from ctrlrun.policy import load_policy
from tests.support import REPO


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLRUN_") and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "ctrlrun.cli", "init", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def decide(policy, action: str, **arguments) -> tuple[str, str]:
    evaluation = policy.evaluate(action, arguments)
    return str(evaluation.decision.value), evaluation.reason


def test_console_script_writes_the_policy_and_the_store_folder(tmp_path):
    done = cli(tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:2] == ["wrote ctrlrun.yaml", "created .ctrlrun/"]
    assert any(line.startswith("Next: edit ctrlrun.yaml") for line in lines)
    assert any("@ctrlrun.protect(" in line for line in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ctrlrun", "ctrlrun.yaml"]
    assert (tmp_path / ".ctrlrun").is_dir() and list((tmp_path / ".ctrlrun").iterdir()) == []  # no store yet
    assert (tmp_path / "ctrlrun.yaml").read_text() == STARTER_POLICY


def test_the_starter_loads_and_decides_as_it_says(tmp_path):
    path = tmp_path / "ctrlrun.yaml"
    path.write_text(STARTER_POLICY)
    policy = load_policy(path)
    assert policy.schema == "ctrlrun.policy/v2"
    assert sorted(policy.actions) == ["crm.lookup_customer", "email.send", "iam.grant_admin",
                                      "k8s.delete_namespace", "orders.get", "stripe.refund"]
    assert decide(policy, "db.drop_table", name="payments") == ("deny", "unknown_action")
    assert decide(policy, "crm.lookup_customer", id="c1") == ("allow", "decision")
    assert decide(policy, "orders.get", id="o1") == ("allow", "decision")
    assert decide(policy, "email.send", message_id="m1") == ("allow", "decision")
    assert decide(policy, "iam.grant_admin", user="mallory") == ("deny", "decision")
    assert decide(policy, "k8s.delete_namespace", cluster="prod", name="payments") == ("approve", "decision")
    bands = {amount: decide(policy, "stripe.refund", payment_id="p", amount=amount)
             for amount in (-1, 0, 1, 50000, 50001, 1000000, 1000001)}
    assert bands == {-1: ("deny", "rule[2]"), 0: ("deny", "rule[2]"), 1: ("allow", "rule[0]"),
                     50000: ("allow", "rule[0]"), 50001: ("approve", "rule[1]"),
                     1000000: ("approve", "rule[1]"), 1000001: ("deny", "rule[2]")}
    entries = policy.actions
    assert entries["email.send"].effect.text == "email:{message_id}"
    assert entries["stripe.refund"].effect.text == "refund:{payment_id}"
    assert entries["k8s.delete_namespace"].effect.text == "namespace:{cluster}:{name}"
    assert "An action this file does not list is DENIED" in STARTER_POLICY.split("schema:")[0]  # our comment


def test_never_overwrites(tmp_path):
    existing = tmp_path / "ctrlrun.yaml"
    existing.write_bytes(b"schema: ctrlrun.policy/v2\nactions: {}  # mine\n")
    before = existing.read_bytes(), existing.stat().st_mtime_ns
    done = cli(tmp_path)
    assert done.returncode == 1
    assert done.stderr == "Error: ctrlrun.yaml already exists; delete it first (nothing was written)\n"
    assert done.stdout == ""
    assert (existing.read_bytes(), existing.stat().st_mtime_ns) == before
    assert not (tmp_path / ".ctrlrun").exists()


def test_a_symlink_in_the_way_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.txt"
    (tmp_path / "ctrlrun.yaml").symlink_to(target)  # dangling
    done = cli(tmp_path)
    assert done.returncode == 1 and "already exists" in done.stderr
    assert not target.exists()


def test_write_new_refuses_a_file_made_meanwhile(tmp_path):
    """The write itself is exclusive (O_EXCL): a file that appears after the check is kept as it is."""
    path = tmp_path / "ctrlrun.yaml"
    path.write_text("theirs\n")
    with pytest.raises(FileExistsError):
        write_new(path, STARTER_POLICY)
    assert path.read_text() == "theirs\n"


def test_path_elsewhere_and_a_missing_folder(tmp_path):
    (tmp_path / "conf").mkdir()
    done = cli(tmp_path, "--path", "conf/agents.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == ["wrote conf/agents.yaml", "created conf/.ctrlrun/"]
    assert load_policy(tmp_path / "conf" / "agents.yaml").schema == "ctrlrun.policy/v2"
    missing = cli(tmp_path, "--path", "nope/ctrlrun.yaml")
    assert missing.returncode == 1
    assert missing.stderr.startswith("Error: the folder nope does not exist")
    assert "Traceback" not in missing.stderr and not (tmp_path / "nope").exists()


def test_console_script_help(tmp_path):
    done = cli(tmp_path, "--help")
    assert done.returncode == 0 and "--path FILE" in done.stdout and "ctrlrun init" in done.stdout
    assert list(tmp_path.iterdir()) == []


def test_listed_by_ctrlrun_help(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTRLRUN_")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-m", "ctrlrun.cli", "--help"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert "\n  init " in done.stdout and "\n  stats " in done.stdout


def test_manage_py_writes_the_file_and_the_settings_line_but_no_folder(tmp_path):
    out = StringIO()
    target = tmp_path / "ctrlrun.yaml"
    call_command("ctrlrun_init", "--path", str(target), stdout=out, stderr=StringIO())
    lines = out.getvalue().splitlines()
    assert lines[0] == f"wrote {target}"
    assert not any(line.startswith("created ") for line in lines)
    assert any("the store is this project's database" in line.lower() for line in lines)
    assert '    CTRLRUN_POLICY = BASE_DIR / "ctrlrun.yaml"' in lines
    assert not (tmp_path / ".ctrlrun").exists()
    assert target.read_text() == STARTER_POLICY
    with pytest.raises(CommandError, match="already exists; delete it first"):
        call_command("ctrlrun_init", "--path", str(target), stdout=StringIO(), stderr=StringIO())
    assert target.read_text() == STARTER_POLICY
