"""Issue 25's command-line items: resolve without --reason, messages naming manage.py in a project,
read commands that create nothing, approvals --status waiting, reconcile/resume_runs logging, the
delegations listing.

The console script runs as real OS processes in a plain script's folder (tests/support.py's cli25_*
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
from tests.support import cli25_ambiguous_folder, cli25_env, cli25_run, make_ambiguous, run_command

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
    folder = cli25_ambiguous_folder(tmp_path / "script")
    done = cli25_run(folder, "resolve", "email:m1", "--failed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("email:m1 resolved failed by ")
    [data] = resolved_events(folder)
    assert data["state"] == "failed" and "reason" not in data


@pytest.mark.slow
def test_ctrlrun_resolve_asks_for_a_reason_on_a_terminal(tmp_path):
    """On a terminal, resolve without --reason asks for one and records what was typed."""
    folder = cli25_ambiguous_folder(tmp_path / "script")
    main, side = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ctrlrun", "resolve", "email:m1", "--committed"], cwd=folder,
                                env=cli25_env(), stdin=side, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    folder = cli25_ambiguous_folder(tmp_path / "script")
    blank = cli25_run(folder, "resolve", "email:m1", "--failed", "--reason", " \u200b ")
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
