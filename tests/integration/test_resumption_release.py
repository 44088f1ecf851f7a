"""A paused run stuck in ``resuming`` (its process died after claiming it) and the human way out:
``resume_runs --release APPROVAL_ID --by NAME [--reason TEXT]`` (docs/resumption.md).

Real processes: a resumer that blocks is SIGKILLed after it claimed the run; a person releases the
run; another process resumes it; the refund runs exactly once.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from django.core.management import CommandError, call_command

from ctrlrun import resumption, store
from ctrlrun.models import PausedRun
from tests.support import (REFUND_POLICY, ledger, pause, paused_row, receipts, resume_runs, rewrite_paused,
                           script_environment)

pytestmark = pytest.mark.usefixtures("store_db")


def release(*args: str) -> list[str]:
    from io import StringIO

    out = StringIO()
    call_command("resume_runs", "--release", *args, stdout=out)
    return out.getvalue().splitlines()


def refused(*args: str) -> str:
    with pytest.raises(CommandError) as error:
        release(*args)
    text = str(error.value)
    assert "\n" not in text and getattr(error.value, "returncode", 1) == 1, text
    return text


def claimed_run(clock, by: str = "deadhost:4242") -> str:
    approval_id = pause("pydantic-ai")
    store.answer_approval(approval_id, True, by="alice")
    assert store.claim_paused_run(paused_row(approval_id).pk, "granted", by)
    return approval_id


def test_a_claim_older_than_the_threshold_is_released_with_who_when_and_why(files, clock):
    approval_id = claimed_run(clock)
    clock.advance(minutes=11)
    lines = release(approval_id, "--by", "alice", "--reason", "the worker was OOM-killed")
    assert lines[0].startswith(f"{approval_id}  resuming  pydantic-ai run, pydantic-refunds, claimed by deadhost:4242 at "
                               "2026-11-29 12:00:00 UTC; answer granted"), lines
    assert "is pending again (by alice: the worker was OOM-killed)" in lines[1]
    row = paused_row(approval_id)
    assert (row.status, row.released_by, row.release_reason) == ("pending", "alice", "the worker was OOM-killed")
    assert row.released_at == store.now() and row.released_claim == "deadhost:4242 at 2026-11-29 12:00:00 UTC"

    (outcome,) = resumption.resume_ready()  # the next pass resumes it, once
    assert (outcome.status, outcome.answer) == ("resumed", "granted")
    assert len(ledger(files)) == 1 and paused_row(approval_id).status == "resumed"
    assert paused_row(approval_id).released_by == "alice"  # the release stays on the row


def test_release_refuses_an_unknown_id_another_state_or_a_recent_claim(files, clock, settings):
    assert "no paused run waits on request 'apr_nobody'" in refused("apr_nobody", "--by", "alice")
    waiting = pause("pydantic-ai", {"payment_id": "txn_w", "amount": 500_000}, thread="t-w")
    assert f"the run paused on {waiting} is pending, not resuming" in refused(waiting, "--by", "alice")

    approval_id = claimed_run(clock)
    clock.advance(minutes=9)
    text = refused(approval_id, "--by", "alice")
    assert "claimed by deadhost:4242 at 2026-11-29 12:00:00 UTC, 9 minutes ago" in text
    assert "older than 10 minutes (CTRLRUN_RESUME_RELEASE_AFTER_SECONDS)" in text and "may still be running" in text
    settings.CTRLRUN_RESUME_RELEASE_AFTER_SECONDS = 3600
    clock.advance(minutes=2)
    assert "older than 60 minutes" in refused(approval_id, "--by", "alice")
    assert paused_row(approval_id).status == "resuming" and paused_row(approval_id).released_by is None

    settings.CTRLRUN_RESUME_RELEASE_AFTER_SECONDS = 600
    release(approval_id, "--by", "alice")
    (outcome,) = resumption.resume_ready()
    assert outcome.status == "resumed"
    assert f"the run paused on {approval_id} is resumed, not resuming" in refused(approval_id, "--by", "alice")
    assert len(ledger(files)) == 1


def test_release_needs_a_name_and_is_used_alone(files, clock):
    approval_id = claimed_run(clock)
    clock.advance(minutes=11)
    for args, expected in [((approval_id,), "--release needs --by NAME"),
                           ((approval_id, "--by", "  "), "--release needs --by NAME"),
                           ((approval_id, "--by", "alice", "--once"), "--release is used alone")]:
        with pytest.raises(CommandError, match=expected) as error:
            release(*args)
        assert error.value.returncode == 2
    with pytest.raises(CommandError, match="--by and --reason go with --release"):
        call_command("resume_runs", "--once", "--by", "alice")
    assert paused_row(approval_id).status == "resuming"


def test_the_console_script_refuses_in_one_line_and_exit_1(files, tmp_path):
    approval_id = pause("pydantic-ai")
    env = script_environment(tmp_path, REFUND_POLICY)
    for target, expected in [("apr_nobody", "no paused run waits on request 'apr_nobody'"),
                             (approval_id, "is pending, not resuming")]:
        done = subprocess.run([sys.executable, "-m", "ctrlrun", "resume_runs", "--release", target, "--by", "alice"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1, done.stderr
        assert expected in done.stderr and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_released_claim_never_finishes_the_next_claim(files, clock):
    """The first process comes back after its claim was released and another took the run: its
    finish changes nothing; the second's claim stands and finishes its own run."""
    approval_id = claimed_run(clock, by="host:1")
    first_at = paused_row(approval_id).claimed_at
    clock.advance(minutes=11)
    release(approval_id, "--by", "alice")
    second_at = store.claim_paused_run(paused_row(approval_id).pk, "granted", "host:2")
    assert second_at
    store.finish_paused_run(paused_row(approval_id).pk, error="late", claim=("host:1", first_at))
    row = paused_row(approval_id)
    assert (row.status, row.claimed_by, row.error) == ("resuming", "host:2", None)
    store.finish_paused_run(row.pk, claim=("host:2", second_at))
    assert paused_row(approval_id).status == "resumed"


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_resumer_killed_after_claiming_is_released_and_resumed_by_another_process_once(when, files, tmp_path,
                                                                                      settings):
    """A real process claims the run and hangs (before, or after, the refund ran); it is SIGKILLed,
    the run stays resuming; a person releases it; another process resumes it: one refund."""
    approval_id = pause("pydantic-ai")
    rewrite_paused(approval_id, resume_with="blocking-refunds")
    store.answer_approval(approval_id, True, by="alice")
    env = script_environment(tmp_path, REFUND_POLICY)
    env.update({k: v for k, v in os.environ.items() if k.startswith("RESUME_")})
    blocked = tmp_path / "blocked.pid"
    stuck = subprocess.Popen([sys.executable, "-m", "ctrlrun", "resume_runs", "--once", "--import",
                              "tests.resumable_agents"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**env, "RESUME_BLOCK": when, "RESUME_BLOCKED": str(blocked)})
    try:
        deadline = time.monotonic() + 120
        while not blocked.exists() and stuck.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert blocked.exists(), stuck.communicate(timeout=5)
        assert int(blocked.read_text()) == stuck.pid
    finally:
        os.kill(stuck.pid, signal.SIGKILL)
        stuck.communicate(timeout=30)
    assert stuck.returncode == -signal.SIGKILL
    row = paused_row(approval_id)
    assert row.status == "resuming" and row.claimed_by.endswith(f":{stuck.pid}")
    assert len(ledger(files)) == (1 if when == "after" else 0)
    assert "nothing to resume" in resume_runs(tmp_path, "--import", "tests.resumable_agents").stdout  # stuck

    settings.CTRLRUN_RESUME_RELEASE_AFTER_SECONDS = 1
    time.sleep(1.2)
    lines = release(approval_id, "--by", "alice", "--reason", f"worker {stuck.pid} was killed")
    assert f"claimed by {row.claimed_by}" in lines[0]
    done = resume_runs(tmp_path, "--import", "tests.resumable_agents")
    assert done.returncode == 0, done.stderr
    assert f"{approval_id}  resumed (granted)" in done.stdout
    (line,) = ledger(files)  # exactly once, whichever process ran it
    assert line.split()[1:] == ["txn_500k", "500000"]
    row = paused_row(approval_id)
    assert row.status == "resumed" and row.released_by == "alice" and not row.claimed_by.endswith(f":{stuck.pid}")
    committed = [r for r in receipts() if r["result"] == "committed" and r["effect_key"] == "refund:txn_500k"]
    assert len(committed) == 1 and committed[0]["approval_id"] == approval_id
