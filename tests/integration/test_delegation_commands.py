"""``delegate`` and ``revoke`` (§C3) as manage.py commands on the test store, and as the ``ctrlrun``
console script in a folder of its own: outputs, refusals as one ``Error:`` line, exit codes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

import ctrlrun
from ctrlrun.control import default_control
from ctrlrun.models import Delegation, Event
from tests.support import CHILD, DELEGABLE_CHILD, GRANDCHILD, REPO, policy_text, run_command, script_environment

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = policy_text("delegation")


@pytest.fixture
def files(use_policy, tmp_path):
    use_policy(POLICY)
    for name, text in (("child", CHILD), ("delegable", DELEGABLE_CHILD), ("grandchild", GRANDCHILD),
                       ("wide", CHILD.replace('resources: ["payment:*"]\n', "")), ("named", "id: mine\n" + CHILD)):
        (tmp_path / f"{name}.yaml").write_text(text)
    return tmp_path


def refused(*args: str) -> CommandError:
    with pytest.raises(CommandError) as error:
        call_command(*args)
    assert "\n" not in str(error.value) and "Traceback" not in str(error.value)
    return error.value


def test_delegate_prints_the_id_and_a_call_runs_under_it(files):
    lines = run_command("delegate", "--parent", "support", "--file", str(files / "child.yaml"), "--as", "orchestrator")
    ident = lines[0].removeprefix("created ")
    assert lines == [f"created {ident}", "parent support at depth 1",
                     f"revoke it with: python manage.py revoke {ident}"]
    row = Delegation.objects.get(pk=ident)
    assert (row.created_via, row.created_by_agent, row.created_by_user) == ("cli", "orchestrator", None)
    assert default_control().call("stripe.refund", {"payment_id": "p1", "amount": 5}, lambda: "ok",
                                  principal="worker") == "ok"


def test_delegate_json(files):
    [line] = run_command("delegate", "--parent", "support", "--file", str(files / "child.yaml"),
                         "--as", "orchestrator/alice", "--json")
    document = json.loads(line)
    assert list(document) == ["delegation_id", "parent_id", "depth", "created_by_agent", "created_by_user",
                              "created_via", "created_at"]
    assert (document["created_by_user"], document["created_via"], document["depth"]) == ("alice", "cli", 1)


@pytest.mark.parametrize(("parent", "file", "who", "message"), [
    ("support", "wide", "orchestrator", "Error: containment: the grant is not contained in 'support' on 'resources'"),
    ("support", "child", "mallory", "Error: not_the_subject: "),
    ("mailer", "child", "mailer", "Error: parent_not_delegable: "),
    ("nope", "child", "orchestrator", "Error: unknown_parent: "),
    ("support", "named", "orchestrator", "Error: "),
    ("support", "missing", "orchestrator", "Error: cannot read "),
    ("support", "child", "/x", "Error: --as takes AGENT or AGENT/USER"),
])
def test_delegate_refusals(files, parent, file, who, message):
    error = refused("delegate", "--parent", parent, "--file", str(files / f"{file}.yaml"), "--as", who)
    assert f"Error: {error}".startswith(message) or str(error).startswith(message)
    assert error.returncode == 1
    assert not Delegation.objects.exists()


def test_revoke_one_twice_and_by_selector(files):
    parent = default_control().delegate("support", DELEGABLE_CHILD, by="orchestrator")
    child = default_control().delegate(parent.id, GRANDCHILD, by="worker")
    other = default_control().delegate("support", CHILD, by="orchestrator")
    assert run_command("revoke", parent.id, "--by", "ops") == [
        f"revoked {parent.id} by ops", "every delegation beneath it is denied from the next evaluation"]
    again = run_command("revoke", parent.id)
    assert len(again) == 1 and again[0].startswith(f"{parent.id} was already revoked at ") and again[0].endswith(
        " by ops")
    with pytest.raises(ctrlrun.AuthorityDenied, match="authority_revoked"):
        default_control().call("stripe.refund", {"payment_id": "p1", "amount": 5}, lambda: "ok", principal="helper")
    lines = run_command("revoke", "--under", "support")
    assert lines[-2:] == ["revoked 2 of 3 matching --under support; 1 already revoked",
                          "every delegation beneath them is denied from the next evaluation"]
    assert {line.split()[1] for line in lines[:-2]} == {child.id, other.id}
    assert Delegation.objects.get(pk=child.id).revoked_by == "cli:local"
    assert Event.objects.filter(type="DELEGATION_REVOKED").count() == 3
    assert str(refused("revoke", "--created-by", "nobody")) == "no delegation matched --created-by nobody"
    assert "no delegation 'dlg_nope'" in str(refused("revoke", "dlg_nope"))
    assert refused("revoke").returncode == 2
    assert refused("revoke", parent.id, "--under", "support").returncode == 2
    lines = run_command("revoke", "--created-by", "orchestrator")
    assert lines == ["revoked 0 of 2 matching --created-by orchestrator; 2 already revoked"]


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLRUN_") and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "ctrlrun.cli", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_console_script(tmp_path):
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    (tmp_path / "child.yaml").write_text(CHILD)
    made = cli(tmp_path, "delegate", "--parent", "support", "--file", "child.yaml", "--as", "orchestrator")
    assert made.returncode == 0, made.stderr
    ident = made.stdout.split()[1]
    assert made.stdout.splitlines()[2] == f"revoke it with: ctrlrun revoke {ident}"
    wrong = cli(tmp_path, "delegate", "--parent", "support", "--file", "child.yaml", "--as", "mallory")
    assert (wrong.returncode, wrong.stderr.startswith("Error: not_the_subject: ")) == (1, True)
    assert "Traceback" not in wrong.stderr
    done = cli(tmp_path, "revoke", ident, "--by", "me")
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, f"revoked {ident} by me")
    assert cli(tmp_path, "revoke").returncode == 2
    assert cli(tmp_path, "revoke", "dlg_missing").returncode == 1
    listed = cli(tmp_path, "--help")
    assert "delegate" in listed.stdout and "revoke" in listed.stdout
    for command in ("delegate", "revoke"):
        shown = cli(tmp_path, command, "--help").stdout
        assert shown.count("--") >= 3 and "show this help" in shown


@pytest.mark.slow
def test_delegate_never_reads_more_of_a_grant_file_than_a_policy_may_be(tmp_path):
    """``delegate --file /dev/zero`` must be refused by its size, as a policy file is, not read into memory."""
    import resource

    env = script_environment(tmp_path, POLICY)

    def capped() -> None:  # a process that reads /dev/zero to the end runs out of this, not the machine
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = subprocess.run([sys.executable, "-m", "ctrlrun", "delegate", "--parent", "support", "--file", "/dev/zero",
                           "--as", "orchestrator"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=capped)
    assert done.returncode == 1, done.stderr
    assert "1,048,576 bytes" in done.stderr and "Traceback" not in done.stderr
