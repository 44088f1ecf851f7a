"""What the command line answers: resolve without --reason, messages naming manage.py in a project,
read commands that create nothing, approvals --status waiting, reconcile/resume_runs logging, the
delegations listing.

The console script runs as real OS processes in a plain script's folder (tests/support/'s script_*
helpers); manage.py runs against the test database through ``call_command`` or as a process.
"""
from __future__ import annotations

import json
import os
import pty
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError

from ctrlrun.models import EffectRecord, Event
from tests.support import (script_ambiguous_folder, script_env, script_loop, script_manage, script_run, make_ambiguous,
                           run_command)

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db")


def resolved_events(folder: Path) -> list[dict]:
    """The EFFECT_RESOLVED events' data in a script folder's store."""
    with sqlite3.connect(folder / ".ctrlrun" / "state.db") as db:
        rows = db.execute("SELECT data FROM ctrlrun_event WHERE type = 'EFFECT_RESOLVED' ORDER BY id").fetchall()
    return [json.loads(data) for (data,) in rows]


# --------------------------------------------------------------------------- item 3: resolve's reason


@pytest.mark.slow
def test_ctrlrun_resolve_without_a_reason_records_none(tmp_path):
    """`ctrlrun resolve KEY --failed` (the reference's command, the cookbook's) resolves, with no reason."""
    folder = script_ambiguous_folder(tmp_path / "script")
    done = script_run(folder, "resolve", "email:m1", "--failed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("email:m1 resolved failed by ")
    [data] = resolved_events(folder)
    assert data["state"] == "failed" and "reason" not in data


@pytest.mark.slow
def test_ctrlrun_resolve_asks_for_a_reason_on_a_terminal(tmp_path):
    """On a terminal, resolve without --reason asks for one and records what was typed."""
    folder = script_ambiguous_folder(tmp_path / "script")
    main, side = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ctrlrun", "resolve", "email:m1", "--committed"], cwd=folder,
                                env=script_env(), stdin=side, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.write(main, b"the relay's log shows it delivered\n")
        out, err = proc.communicate(timeout=120)
    finally:
        os.close(main)
        os.close(side)
    assert proc.returncode == 0, err
    assert "reason" in err.lower()  # the prompt, on stderr: stdout stays the command's output
    [data] = resolved_events(folder)
    assert data["state"] == "committed" and data["reason"] == "the relay's log shows it delivered"


@pytest.mark.slow
def test_ctrlrun_resolve_refuses_a_given_blank_reason(tmp_path):
    folder = script_ambiguous_folder(tmp_path / "script")
    blank = script_run(folder, "resolve", "email:m1", "--failed", "--reason", " \u200b ")
    assert blank.returncode == 2 and len(blank.stderr.splitlines()) == 1, blank.stderr
    assert blank.stderr.startswith("Error: a given --reason must say something")
    assert resolved_events(folder) == []


def test_manage_py_resolve_without_a_reason_records_none(refund, remote, agent):
    key = make_ambiguous(refund, remote, "txn_1")
    lines = run_command("resolve", key, "--failed", "--by", "alice")
    assert lines[0] == f"{key} resolved failed by alice"
    assert EffectRecord.objects.get(pk=key).state == "failed"
    data = Event.objects.get(type="EFFECT_RESOLVED").data
    assert "reason" not in data


@pytest.mark.parametrize("reason", ["", "   ", "\t\n", "\u200b"])
def test_manage_py_resolve_refuses_a_given_blank_reason(refund, remote, agent, reason):
    key = make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(CommandError) as caught:
        run_command("resolve", key, "--failed", "--by", "alice", "--reason", reason)
    assert caught.value.returncode == 2
    assert EffectRecord.objects.get(pk=key).state == "ambiguous"


# --------------------------------------------------------------------------- item 15: words people read


def test_approvals_status_waiting_is_pending(refund, agent):
    """`approvals --status waiting` (the console's word) lists the pending requests."""
    import ctrlrun

    with pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_2", amount=500000)
    [line] = run_command("approvals", "--status", "waiting")
    assert line.startswith(f"{caught.value.request_id}  pending  stripe.refund")
    assert run_command("approvals", "--status", "waiting") == run_command("approvals", "--status", "pending")
    assert run_command("approvals", "--status", "granted") == ["no approval requests are granted"]


def test_inspect_explains_the_reason_decision(agent):
    """A bare entry decision's reason, 'decision', is said in words: the entry's decision is deny."""
    import ctrlrun

    @ctrlrun.protect("iam.grant_admin")
    def grant(user: str) -> None:
        raise AssertionError("a denied call never runs")

    with pytest.raises(ctrlrun.ActionDenied) as caught:
        grant(user="mallory")
    lines = run_command("inspect", caught.value.action_id)
    assert "decision    deny  (decision: the entry's decision is deny)" in lines, lines


def test_stats_says_ctrlrun_and_explains_decision(agent):
    import ctrlrun

    @ctrlrun.protect("iam.grant_admin")
    def grant(user: str) -> None:
        raise AssertionError("a denied call never runs")

    with pytest.raises(ctrlrun.ActionDenied):
        grant(user="mallory")
    lines = run_command("stats")
    assert lines[0].startswith("ctrlrun — ") and "CTRLRun" not in "\n".join(lines)
    assert any(line.strip().startswith("decision (the entry's decision is deny)") for line in lines), lines


# --------------------------------------------------------------------------- item 10: a project names manage.py


def test_in_a_project_ambiguous_effect_names_manage_py(refund, remote, agent):
    key = make_ambiguous(refund, remote, "txn_1")
    import ctrlrun

    with pytest.raises(ctrlrun.AmbiguousEffect) as caught:
        refund(payment_id="txn_1", amount=100)
    message = str(caught.value)
    assert f"'python manage.py resolve {key} --committed' or '--failed'" in message, message
    assert "ctrlrun resolve" not in message


def test_in_a_project_approval_required_names_manage_py(refund, agent):
    import ctrlrun

    with pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_2", amount=500000)
    message = str(caught.value)
    assert f"run 'python manage.py approve {caught.value.request_id}'" in message, message
    assert "ctrlrun approve" not in message


@pytest.mark.slow
def test_in_a_script_ambiguous_effect_names_ctrlrun(tmp_path):
    folder = script_ambiguous_folder(tmp_path / "script")
    again = subprocess.run([sys.executable, "-c", (
        "import ctrlrun\n"
        "@ctrlrun.protect('email.send', effect='email:{msg_id}')\n"
        "def send(msg_id: str) -> None:\n"
        "    pass\n"
        "with ctrlrun.context(agent='mailer'):\n"
        "    try:\n"
        "        send(msg_id='m1')\n"
        "    except ctrlrun.AmbiguousEffect as exc:\n"
        "        print(exc)\n")], cwd=folder, env=script_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "'ctrlrun resolve email:m1 --committed' or '--failed'" in again.stdout
    assert "manage.py" not in again.stdout


@pytest.mark.slow
def test_ctrlrun_in_a_project_folder_says_to_use_manage_py(tmp_path):
    """`ctrlrun receipts` beside manage.py, with no script store: one line naming 'python manage.py receipts'."""
    folder = tmp_path / "site"
    folder.mkdir()
    (folder / "manage.py").write_text("# a Django project's manage.py\n")
    done = script_run(folder, "receipts", "--last", "3")
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "'python manage.py receipts'" in done.stderr and "manage.py" in done.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["manage.py"]


# --------------------------------------------------------------------------- item 17: no policy here


@pytest.mark.slow
def test_ctrlrun_receipts_without_a_policy_says_so(tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    done = script_run(folder, "receipts")
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"Error: no ctrlrun.yaml in {folder}"), done.stderr
    assert "ctrlrun init" in done.stderr and "CTRLRUN_CONFIG" in done.stderr
    assert "no database" not in done.stderr
    assert list(folder.iterdir()) == []


# --------------------------------------------------------------------------- item 11: read commands create nothing


READ_COMMANDS = [["receipts"], ["effects"], ["inspect", "act_nope"], ["approvals"], ["stats"]]


@pytest.mark.slow
@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_manage_py_read_command_on_a_missing_sqlite_file_creates_nothing(tmp_path, command):
    missing = tmp_path / "missing.db"
    done = script_manage(*command, env=script_env(SECRET_KEY="cli-key", DATABASE_URL=f"sqlite:///{missing}"))
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"Error: no database at '{missing}'"), done.stderr
    assert "'python manage.py migrate'" in done.stderr
    assert not missing.exists()


@pytest.mark.slow
@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_ctrlrun_read_command_on_a_missing_sqlite_url_names_the_variable(tmp_path, command):
    (tmp_path / "ctrlrun.yaml").write_text("schema: ctrlrun.policy/v2\nactions: {}\n")
    done = script_run(tmp_path, *command, env=script_env(DATABASE_URL="sqlite:///missing.db"))
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("Error: no database at 'missing.db'") and "DATABASE_URL" in done.stderr
    assert "CTRLRUN_STATE" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctrlrun.yaml"]


@pytest.mark.slow
def test_manage_py_unreachable_postgresql_is_not_told_to_migrate():
    url = "postgresql://postgres@127.0.0.1:1/nowhere"  # port 1: nothing listens
    done = script_manage("receipts", env=script_env(SECRET_KEY="cli-key", DATABASE_URL=url))
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "migrate" not in done.stderr
    assert "could not be reached" in done.stderr and "DATABASE_URL" in done.stderr


@pytest.mark.slow
def test_manage_py_missing_postgresql_database_is_not_told_to_migrate():
    from tests.support import require_postgresql

    require_postgresql()
    url = "postgresql://postgres@127.0.0.1:5432/h_cli_no_such_database"
    done = script_manage("effects", env=script_env(SECRET_KEY="cli-key", DATABASE_URL=url))
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "migrate" not in done.stderr and "could not be reached" in done.stderr


# --------------------------------------------------------------------------- item 16: quiet loops, timestamped

#: A log line of the loop commands: an ISO-8601 UTC time first.
STAMPED = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "

HOOK_TOOLS = """\
import ctrlrun

def ask_relay(effect_key):
    return "committed"

@ctrlrun.protect("email.send", effect="email:{msg_id}", reconcile=ask_relay)
def send(msg_id: str) -> None:
    pass
"""


def quiet_store(tmp_path: Path) -> Path:
    """A script folder whose store holds one resolved effect: nothing for a loop to do."""
    folder = script_ambiguous_folder(tmp_path / "script")
    assert script_run(folder, "resolve", "email:m1", "--failed").returncode == 0
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("command", [["reconcile", "--loop"], ["resume_runs"]], ids=lambda c: c[0])
def test_an_idle_loop_says_nothing(tmp_path, command):
    """Idle passes every 0.2 s for 3 s print nothing (1,440 summaries a day at --interval 60 was the bug)."""
    folder = quiet_store(tmp_path)
    out, err, status = script_loop(folder, *command, "--interval", "0.2")
    assert status == 0, err
    assert out.splitlines() == ["stopped"], out
    assert err == ""


@pytest.mark.slow
@pytest.mark.parametrize("command", [["reconcile", "--loop"], ["resume_runs"]], ids=lambda c: c[0])
def test_an_idle_loop_at_verbosity_2_logs_each_pass_with_a_time(tmp_path, command):
    import re

    folder = quiet_store(tmp_path)
    out, err, status = script_loop(folder, *command, "--interval", "0.2", "-v", "2", lines=4)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[-1] == "stopped" and len(lines) >= 4, out
    assert all(re.match(STAMPED, line) for line in lines[:-1]), out
    assert all("idle" in line for line in lines[:-1]), out


@pytest.mark.slow
def test_a_reconcile_loop_logs_work_once_with_a_time(tmp_path):
    """A pass that reconciled something logs its line and a summary, timestamped; the idle passes after, nothing."""
    import re

    folder = script_ambiguous_folder(tmp_path / "script")
    (folder / "relay_tools.py").write_text(HOOK_TOOLS)
    out, err, status = script_loop(folder, "reconcile", "--loop", "--interval", "0.2", "--import", "relay_tools")
    assert status == 0, err
    lines = out.splitlines()
    assert lines[-1] == "stopped", out
    work = lines[:-1]
    assert len(work) == 2, out
    assert all(re.match(STAMPED, line) for line in work), out
    assert "email:m1  committed" in work[0]
    assert "1 committed" in work[1] and "swept 0" in work[1]


@pytest.mark.slow
def test_a_reconcile_loop_names_an_effect_needing_a_human_once(tmp_path):
    """An ambiguous effect without a hook is logged on the first pass, not again on every pass."""
    folder = script_ambiguous_folder(tmp_path / "script")
    out, err, status = script_loop(folder, "reconcile", "--loop", "--interval", "0.2")
    assert status == 0, err
    assert sum("email:m1  needs_human" in line for line in out.splitlines()) == 1, out


# --------------------------------------------------------------------------- item 18: the delegations listing

AUTHORITY_POLICY = """\
schema: ctrlrun.policy/v7
authority:
  max_delegation_depth: 2
  grants:
    - id: support
      subject: {agent: orchestrator}
      actions: ["stripe.*"]
      resources: ["payment:*"]
      constraints: {amount_lte: 50000}
      budgets:
        - {metric: count, limit: 100, window: PT1H}
      expires_at: "2099-01-01T00:00:00Z"
      delegable: true
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    resource: "payment:{payment_id}"
    decision: allow
"""
WORKER_GRANT = """\
subject: {agent: "worker\u202e"}
actions: [stripe.refund]
resources: ["payment:*"]
constraints: {amount_lte: 1000}
budgets:
  - {metric: count, limit: 20, window: PT1H}
expires_at: "2098-12-31T00:00:00Z"
"""


@pytest.fixture
def delegations(use_policy):
    from ctrlrun import Principal
    from ctrlrun.control import default_control

    use_policy(AUTHORITY_POLICY)
    control = default_control()
    kept = control.delegate("support", WORKER_GRANT, by=Principal(agent="orchestrator"))
    gone = control.delegate("support", WORKER_GRANT.replace("limit: 20", "limit: 5"),
                            by=Principal(agent="orchestrator", user="alice"))
    control.revoke(gone.id, by="dana")
    return kept, gone


def test_delegations_lists_each_with_its_limits_and_state(delegations):
    kept, gone = delegations
    lines = run_command("delegations")
    assert len(lines) == 2, lines
    text = "\n".join(lines)
    assert "\u202e" not in text and "worker\\u202e" in text  # hidden characters escaped
    first = next(line for line in lines if line.startswith(kept.id))
    for part in ("parent support", "depth 1", "to worker\\u202e", "actions stripe.refund", "resources payment:*",
                 "amount_lte 1000", "count 20 per 1 hour", "expires 2098-12-31T00:00:00.000Z",
                 "by orchestrator via api", "active"):
        assert part in first, (part, first)
    second = next(line for line in lines if line.startswith(gone.id))
    assert "by orchestrator/alice via api" in second and "revoked at " in second and " by dana" in second


def test_delegations_json_is_one_object_per_line(delegations):
    kept, gone = delegations
    documents = [json.loads(line) for line in run_command("delegations", "--json")]
    assert [d["delegation_id"] for d in documents] == sorted([kept.id, gone.id], key=[kept.id, gone.id].index)
    first = documents[0]
    assert first["parent_id"] == "support" and first["depth"] == 1 and first["agent"] == "worker\u202e"
    assert first["revoked"] is False and first["revoked_at"] is None
    assert first["grant"]["budgets"] == [{"limit": 20, "metric": "count", "window": 3600}] or \
        first["grant"]["budgets"][0]["limit"] == 20
    assert documents[1]["revoked"] is True and documents[1]["revoked_by"] == "dana"
    assert "\u202e" not in "\n".join(run_command("delegations", "--json"))  # escaped as \\u202e in the JSON text


def test_delegations_agent_and_active_select(delegations):
    kept, _ = delegations
    assert [line.split()[0] for line in run_command("delegations", "--active")] == [kept.id]
    assert run_command("delegations", "--agent", "nobody") == ["no delegations to agent nobody"]


def test_no_delegations_says_so(use_policy):
    assert run_command("delegations") == ["no delegations yet"]


@pytest.mark.slow
def test_ctrlrun_delegations_in_a_script_folder(tmp_path):
    folder = tmp_path / "script"
    folder.mkdir()
    (folder / "ctrlrun.yaml").write_text(AUTHORITY_POLICY)
    (folder / "child.yaml").write_text(WORKER_GRANT)
    made = script_run(folder, "delegate", "--parent", "support", "--file", "child.yaml", "--as", "orchestrator")
    assert made.returncode == 0, made.stderr
    ident = made.stdout.split()[1]
    done = script_run(folder, "delegations")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{ident}  parent support") and "\u202e" not in done.stdout
