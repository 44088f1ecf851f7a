"""What the commands say, said truthfully: who answered and what consumed an approval; resolve's
errors naming the command as the user runs it, and its required reason; reconcile's records in
backoff, and an --action that names nothing.

On the test database (SQLite or PostgreSQL) through ``call_command`` (which is ``manage.py``), and
as ``ctrlrun ...`` OS processes on a plain script's store where the wording depends on the entry
point.
"""
from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError

import ctrlrun
from ctrlrun.canonical import evidence_time
from ctrlrun.models import Approval, EffectRecord, Event
from tests.support import (CLI25_AMBIGUOUS_SCRIPT, Hook, clean_env, hold_key, make_ambiguous, policy_text, protected_refund,
                           run_command)

pytestmark = pytest.mark.usefixtures("hook_registry", "store_db")


# --------------------------------------------------------------------------- approvals


def ask_and_grant(refund, by: str = "dana") -> str:
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_2", amount=500000)
    request_id = caught.value.request_id
    run_command("approve", request_id, "--by", by)
    return request_id


def test_approvals_says_who_granted_and_which_call_consumed(refund, clock):
    """A consumed approval: granted by the person, consumed by the call (its action id), each said as such."""
    request_id = ask_and_grant(refund)
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id):
        refund(payment_id="txn_2", amount=500000)
    consumer = Approval.objects.get(pk=request_id).consumed_by
    assert consumer.startswith("act_")
    [line] = run_command("approvals")
    assert line.endswith(f"  granted by dana, consumed by {consumer}"), line
    assert "consumed by dana" not in line


def test_approvals_says_an_approval_expired_unused(refund, clock):
    """Granted, then past its expiry when presented: 'granted by dana, expired unused', not 'expired by dana'."""
    request_id = ask_and_grant(refund)
    clock.advance(minutes=16)
    with ctrlrun.context(agent="support-agent"), ctrlrun.with_approval(request_id), \
            pytest.raises(ctrlrun.ApprovalMismatch):
        refund(payment_id="txn_2", amount=500000)
    [line] = run_command("approvals")
    assert line.endswith("  granted by dana, expired unused"), line


def test_approvals_says_who_denied(refund, clock):
    with ctrlrun.context(agent="support-agent"), pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_2", amount=500000)
    run_command("deny", caught.value.request_id, "--by", "dana")
    [line] = run_command("approvals")
    assert line.endswith("  denied by dana"), line


# --------------------------------------------------------------------------- resolve: the command as it is run


def test_resolve_unknown_key_points_at_manage_py_effects():
    """Under manage.py the hint is 'python manage.py effects', not the console script's command."""
    with pytest.raises(CommandError) as caught:
        run_command("resolve", "refund:nope", "--failed", "--by", "alice", "--reason", "checked")
    assert str(caught.value) == "no effect 'refund:nope' to resolve; 'python manage.py effects' lists the keys"
    assert caught.value.returncode == 1


def test_resolve_lapsed_lease_points_at_manage_py_reconcile(clock):
    hold_key("refund:txn_9")
    clock.advance(minutes=6)
    with pytest.raises(CommandError) as caught:
        run_command("resolve", "refund:txn_9", "--failed", "--by", "alice", "--reason", "checked")
    message = str(caught.value)
    assert message.startswith("effect 'refund:txn_9' is executing, not ambiguous")
    assert "'python manage.py reconcile'" in message and "ctrlrun reconcile" not in message
    assert EffectRecord.objects.get(pk="refund:txn_9").state == "executing"


def test_resolve_stale_attempt_points_at_manage_py_effects(refund, remote, agent):
    remote.fail_with = ctrlrun.NotExecuted("refused before any byte was sent")
    with pytest.raises(ctrlrun.NotExecuted):
        refund(payment_id="txn_1", amount=100)
    make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(CommandError) as caught:
        run_command("resolve", "refund:txn_1", "--failed", "--by", "alice", "--reason", "checked", "--attempt", "1")
    message = str(caught.value)
    assert message.startswith("effect 'refund:txn_1' is at attempt 2, not 1: it moved since you looked")
    assert "'python manage.py effects --state ambiguous' shows it now" in message and "ctrlrun effects" not in message


def test_the_store_says_no_command_name_for_the_console():
    """store.resolve (what the console calls too) names no command line in its messages."""
    from ctrlrun import store

    with pytest.raises(ctrlrun.StateConflict) as caught:
        store.resolve("refund:nope", "failed", by="alice", reason="checked")
    assert (caught.value.what, caught.value.ident, caught.value.found) == ("effect", "refund:nope", "missing")
    assert "ctrlrun " not in str(caught.value) and "manage.py" not in str(caught.value)


# --------------------------------------------------------------------------- resolve: a given reason says something


@pytest.mark.parametrize("reason", ["", "   ", "\t\n", "\u200b", " \u200b\u2060 "])
def test_resolve_refuses_a_blank_reason(ambiguous_key, reason):
    """--reason "" (or only spaces or invisible characters) is a usage error, as the console's required reason."""
    with pytest.raises(CommandError) as caught:
        run_command("resolve", ambiguous_key, "--failed", "--by", "alice", "--reason", reason)
    assert caught.value.returncode == 2
    assert "a given --reason must say something" in str(caught.value)
    assert EffectRecord.objects.get(pk=ambiguous_key).state == "ambiguous"
    assert not Event.objects.filter(type="EFFECT_RESOLVED").exists()


def test_resolve_without_a_reason_records_none(ambiguous_key):
    """--reason left out (not on a terminal): resolved, and the event carries no reason (issue 25)."""
    run_command("resolve", ambiguous_key, "--failed", "--by", "alice")
    assert EffectRecord.objects.get(pk=ambiguous_key).state == "failed"
    assert "reason" not in Event.objects.get(type="EFFECT_RESOLVED").data


@pytest.fixture
def ambiguous_key(refund, remote, agent) -> str:
    return make_ambiguous(refund, remote, "txn_1")


# --------------------------------------------------------------------------- reconcile


def test_reconcile_lists_a_record_in_backoff_with_when_it_is_due(remote, agent, clock):
    """A record whose hook answered 'unknown' waits in backoff: the next pass lists it, and when it is due."""
    hook = Hook("unknown")
    refund = protected_refund(remote, reconcile=hook)
    make_ambiguous(refund, remote, "txn_1")
    first = run_command("reconcile")
    assert first[0] == "refund:txn_1  unknown  the hook answered unknown"
    due = EffectRecord.objects.get(pk="refund:txn_1").reconcile_after
    assert due == clock.now + dt.timedelta(seconds=30)

    clock.advance(seconds=10)
    lines = run_command("reconcile")
    assert lines[0] == (f"refund:txn_1  backoff  the hook gave no answer (1 time); asked again from "
                        f"{evidence_time(due)} (in 20s)")
    assert lines[-1].endswith("; 1 waiting in backoff")
    assert hook.asked == ["refund:txn_1"]  # not asked during the backoff

    clock.advance(seconds=30)
    assert run_command("reconcile")[0] == "refund:txn_1  unknown  the hook answered unknown"
    assert hook.asked == ["refund:txn_1", "refund:txn_1"]


def test_reconcile_backoff_respects_action(remote, agent, clock):
    refund = protected_refund(remote, reconcile=Hook("unknown"))
    make_ambiguous(refund, remote, "txn_1")
    run_command("reconcile")
    lines = run_command("reconcile", "--action", "email.send")
    assert not any(line.startswith("refund:txn_1") for line in lines)


def test_reconcile_unknown_action_is_an_error_listing_the_known_ones(remote, agent):
    """--action nope (not in the policy, no hook, no record): exit 2, naming the known actions."""
    refund = protected_refund(remote, reconcile=Hook("committed"))
    make_ambiguous(refund, remote, "txn_1")
    with pytest.raises(CommandError) as caught:
        run_command("reconcile", "--action", "nope")
    assert caught.value.returncode == 2
    message = str(caught.value)
    assert message.startswith("no action 'nope' is known here")
    for known in ("stripe.refund", "email.send", "audit.note", "iam.grant_admin"):
        assert known in message
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"  # nothing ran


def test_reconcile_action_with_records_but_no_policy_entry_is_known(use_policy, remote, agent, clock):
    """An action known only by its records (since dropped from the policy) is reconciled, not refused."""
    refund = protected_refund(remote)
    make_ambiguous(refund, remote, "txn_1")
    use_policy("schema: ctrlrun.policy/v2\nactions: {}\n")
    lines = run_command("reconcile", "--action", "stripe.refund")
    assert lines[0].startswith("refund:txn_1  needs_human")


def test_reconcile_known_action_with_nothing_to_do_says_so(clock):
    """--action email.send (in the policy), nothing held or ambiguous: exit 0 and a line saying so."""
    lines = run_command("reconcile", "--action", "email.send")
    assert lines[0] == "nothing to reconcile for email.send: no lapsed lease, no ambiguous effect"
    assert lines[-1].startswith("swept 0 lapsed lease(s); asked 0 hook(s)")


# --------------------------------------------------------------------------- the console script's wording


POLICY = policy_text("email")  # email.send, keyed by message, allowed


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ctrlrun", *args], cwd=folder, env=clean_env(), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_console_script_messages_name_ctrlrun(tmp_path):
    """Under `ctrlrun`, resolve's hint is 'ctrlrun effects', and its usage errors are one line, exit 2."""
    (tmp_path / "ctrlrun.yaml").write_text(POLICY)
    made = subprocess.run([sys.executable, "-c", CLI25_AMBIGUOUS_SCRIPT], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr

    unknown = cli(tmp_path, "resolve", "email:nope", "--failed", "--reason", "checked")
    assert (unknown.returncode, unknown.stdout) == (1, "")
    assert unknown.stderr == "Error: no effect 'email:nope' to resolve; 'ctrlrun effects' lists the keys\n"

    blank = cli(tmp_path, "resolve", "email:m1", "--failed", "--reason", "  ")
    assert blank.returncode == 2 and len(blank.stderr.splitlines()) == 1
    assert blank.stderr.startswith("Error: a given --reason must say something")

    nope = cli(tmp_path, "reconcile", "--action", "nope")
    assert nope.returncode == 2 and len(nope.stderr.splitlines()) == 1
    assert nope.stderr.startswith("Error: no action 'nope' is known here") and "email.send" in nope.stderr

    resolved = cli(tmp_path, "resolve", "email:m1", "--failed", "--reason", "no such message at the relay")
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout.splitlines()[1] == "a retry of this effect is now permitted"
