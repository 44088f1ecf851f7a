"""Attacks on Django-native resumption (ctrlrun.resumption): races on the claim, resumers that
raise or hang, rows edited by SQL to point elsewhere, hostile state, names and modules, the signal
receiver firing twice, expiry with no signal. The rule under attack: a paused run never runs a
tool without ctrlrun's grant for the exact action hash, and is resumed at most once."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from django.db import connections

import ctrlrun
from ctrlrun import resumption, store
from ctrlrun.models import Approval, PausedRun
from tests.support import (FRAMEWORKS, REFUND_POLICY, evidence_unguarded, ledger, pause, paused_row, receipts,
                           resume_runs, rewrite_paused, script_environment, seen, write_paused_state)

pytestmark = pytest.mark.usefixtures("store_db")


# --------------------------------------------------------------------------- the claim under races


def test_many_threads_claim_one_run_and_exactly_one_wins(files):
    """Eight connections race the conditional UPDATE (SQLite and PostgreSQL alike): one claim."""
    approval_id = pause("pydantic-ai")
    store.answer_approval(approval_id, True, by="alice")
    pk = paused_row(approval_id).pk
    barrier, won, errors = threading.Barrier(8), [], []

    def claim(n: int) -> None:
        try:
            barrier.wait()
            if store.claim_paused_run(pk, "granted", f"thread:{n}"):
                won.append(n)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and len(won) == 1
    assert paused_row(approval_id).claimed_by == f"thread:{won[0]}"


def test_many_threads_resume_ready_at_once_and_each_refund_runs_once(files):
    ids = [pause("pydantic-ai", {"payment_id": f"txn_t{n}", "amount": 500_000}) for n in range(4)]
    for approval_id in ids:
        store.answer_approval(approval_id, True, by="alice")
    barrier, outcomes, errors = threading.Barrier(4), [], []

    def run() -> None:
        try:
            barrier.wait()
            outcomes.extend(resumption.resume_ready())
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sorted(o.approval_id for o in outcomes if o.status == "resumed") == sorted(ids)
    assert sorted(line.split()[1] for line in ledger(files)) == sorted(f"txn_t{n}" for n in range(4))


# --------------------------------------------------------------------------- rows edited by SQL


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_run_pointed_at_another_granted_request_never_runs_its_tool(framework, files):
    """Run A (txn_500k, never answered) is edited to wait on request B, granted for other arguments:
    resumed under B's grant, A's call is refused (the hash differs); B's grant stays unused."""
    waiting = pause(framework)
    other = pause("pydantic-ai", {"payment_id": "txn_other", "amount": 400_000}, thread="t-other")
    store.answer_approval(other, True, by="alice")
    with evidence_unguarded():  # B's own run gone (by the store's owner): A takes its place
        PausedRun.objects.filter(approval_id=other).delete()
    rewrite_paused(waiting, approval_id=other)

    outcomes = resumption.resume_ready()
    assert [o.approval_id for o in outcomes] == [other]
    assert ledger(files) == []  # neither refund ran
    approval = store.get_approval(other)
    assert approval.status == "granted" and approval.consumed_by is None
    assert store.get_approval(waiting).status == "pending"
    assert not [r for r in receipts() if r["result"] == "committed"]


def test_a_run_whose_framework_column_was_edited_fails_without_running(files):
    approval_id = pause("pydantic-ai")
    store.answer_approval(approval_id, True, by="alice")
    rewrite_paused(approval_id, framework="openai-agents", resume_with="openai-refunds")
    (outcome,) = resumption.resume_ready()
    assert outcome.status == "failed" and "\n" not in outcome.detail
    assert ledger(files) == [] and store.get_approval(approval_id).consumed_by is None


def test_a_forged_answer_on_the_approval_row_never_resumes_the_run(files):
    """The approval row is edited by SQL to granted (its signature no longer holds): the run is not
    resumed on it, and it stays pending for the real answer."""
    approval_id = pause("pydantic-ai")
    with evidence_unguarded():
        Approval.objects.filter(pk=approval_id).update(status="granted", approver="mallory")
    assert not store.get_approval(approval_id).signature_ok
    outcomes = resumption.resume_ready()
    assert [(o.status, "does not carry ctrlrun's signature" in o.detail) for o in outcomes] == [("skipped", True)]
    assert paused_row(approval_id).status == "pending" and ledger(files) == [] and seen(files) == []


# --------------------------------------------------------------------------- resumers that raise or hang


def test_a_resumer_raising_a_base_exception_is_recorded_and_not_resumed_again(files):
    @resumption.resumer("exits")
    def exits(paused, answer):
        raise SystemExit(3)

    try:
        approval_id = pause("pydantic-ai")
        rewrite_paused(approval_id, resume_with="exits")
        store.answer_approval(approval_id, True, by="alice")
        with pytest.raises(SystemExit):
            resumption.resume_ready()
        row = paused_row(approval_id)
        assert (row.status, row.error) == ("failed", "interrupted while resuming")
        assert resumption.resume_ready() == []
    finally:
        resumption.unregister("exits")


def test_an_answer_that_changes_after_the_claim_is_told_as_it_was_and_the_grant_decides(files, clock):
    """Granted when claimed, expired by the time the resumer calls: the resumer is told granted (what
    was claimed), and ctrlrun refuses the call on the grant as it is then."""

    @resumption.resumer("late")
    def late(paused, answer):
        clock.advance(hours=48)  # the resumer takes so long that the grant runs out
        app_resume(paused, answer)

    from tests.resumable_agents import resume_pydantic as app_resume

    try:
        approval_id = pause("pydantic-ai")
        rewrite_paused(approval_id, resume_with="late")
        store.answer_approval(approval_id, True, by="alice")
        (outcome,) = resumption.resume_ready()
        assert (outcome.status, outcome.answer) == ("resumed", "granted")
        assert ledger(files) == []
        (told,) = seen(files)
        assert "ctrlrun refused" in told["text"], told
    finally:
        resumption.unregister("late")


# --------------------------------------------------------------------------- hostile state, names, modules


@pytest.mark.parametrize("state", [
    '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "deep-dict",
])
def test_a_deeply_nested_state_is_a_one_line_error_and_stores_nothing(state, files):
    approval_id = pause("pydantic-ai")
    with evidence_unguarded():
        PausedRun.objects.all().delete()
    if state == "deep-dict":
        state = {}
        for _ in range(100_000):
            state = {"a": state}
    with pytest.raises(ctrlrun.InvalidArgument) as refused:
        resumption.pause(approval_id, "pydantic-ai", state, resume_with="pydantic-refunds")
    assert "nested" in str(refused.value) and "\n" not in str(refused.value)
    assert PausedRun.objects.count() == 0


def test_a_deeply_nested_state_written_by_sql_fails_that_run_in_one_line(files, tmp_path):
    approval_id = pause("pydantic-ai")
    store.answer_approval(approval_id, True, by="alice")
    write_paused_state(approval_id, '{"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    done = resume_runs(tmp_path, "--import", "tests.resumable_agents")
    assert done.returncode == 1 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert paused_row(approval_id).status == "failed" and ledger(files) == []


def test_a_large_state_is_stored_and_resumed(files):
    approval_id = pause("pydantic-ai")
    row = paused_row(approval_id)
    data = json.loads(row.state)
    data["padding"] = "x" * 5_000_000
    write_paused_state(row.approval_id, json.dumps(data))
    store.answer_approval(approval_id, True, by="alice")
    (outcome,) = resumption.resume_ready()
    assert outcome.status == "resumed" and len(ledger(files)) == 1


@pytest.mark.parametrize("name", ["a\x00b", "a\nb", "refunds\u202e", "\u200brefunds", "tab\there", 7, None, ""])
def test_hostile_resumer_names_are_refused(name):
    with pytest.raises(ctrlrun.InvalidArgument) as refused:
        resumption.resumer(name)
    assert "\n" not in str(refused.value) and "\x00" not in str(refused.value)
    assert name not in resumption.resumers()


@pytest.mark.parametrize("name", ["a\nb", "evil\u202e", "x" * 300, "<b>x</b>", "nul\x00"])
def test_a_hostile_resume_with_written_by_sql_is_skipped_in_one_escaped_line(name, files, tmp_path):
    approval_id = pause("pydantic-ai")
    store.answer_approval(approval_id, True, by="alice")
    if "\x00" in name and connections["default"].vendor == "postgresql":
        name = name.replace("\x00", "\\0")  # PostgreSQL cannot store NUL; still hostile
    rewrite_paused(approval_id, resume_with=name[:200])
    done = resume_runs(tmp_path, "--import", "tests.resumable_agents")
    assert done.returncode == 1 and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    assert "\u202e" not in done.stdout and "\x00" not in done.stdout
    (line,) = [line for line in done.stdout.splitlines() if approval_id in line]
    assert "skipped" in line
    assert paused_row(approval_id).status == "pending" and ledger(files) == []


def test_an_import_name_with_a_nul_character_is_a_one_line_error():
    with pytest.raises(ctrlrun.InvalidArgument, match="could not import resumer module") as refused:
        resumption.discover(["nul\x00"])
    assert "\x00" not in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("module", ["", ".relative", "no.such.module", "a\nb", "tests.support:x",
                                    "tests.broken_resumers"])
def test_hostile_import_names_are_one_line_errors(module, tmp_path):
    (tmp_path / "tests").mkdir(exist_ok=True)
    env = script_environment(tmp_path, REFUND_POLICY)
    if module == "tests.broken_resumers":  # a module that raises when imported
        broken = tmp_path / "broken_resumers.py"
        broken.write_text("raise RuntimeError('the app is misconfigured\\nsecond line')\n")
        module = "broken_resumers"
        env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    done = subprocess.run([sys.executable, "-m", "ctrlrun", "resume_runs", "--once", "--import", module], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (1, 2), done
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "could not import resumer module" in done.stderr, done.stderr


# --------------------------------------------------------------------------- the signal receiver, expiry


def test_the_signal_receiver_connected_twice_and_fired_twice_resumes_once(files):
    approval_id = pause("pydantic-ai")
    resumption.connect_signal_receiver()
    resumption.connect_signal_receiver()
    try:
        store.answer_approval(approval_id, True, by="alice")
        from ctrlrun.signals import approval_answered

        approval_answered.send(sender="test", event=type("E", (), {"approval_id": approval_id})())
    finally:
        resumption.disconnect_signal_receiver()
    assert len(ledger(files)) == 1 and paused_row(approval_id).status == "resumed"


def test_expiry_sends_no_signal_and_resume_runs_tells_the_agent(files, clock):
    approval_id = pause("pydantic-ai")
    resumption.connect_signal_receiver()
    try:
        clock.advance(hours=48)
        assert paused_row(approval_id).status == "pending"  # nothing happened on its own
        (outcome,) = resumption.resume_ready()
    finally:
        resumption.disconnect_signal_receiver()
    assert (outcome.status, outcome.answer) == ("resumed", "expired") and ledger(files) == []


def test_a_granted_request_that_ran_out_unused_resumes_as_expired(files, clock):
    approval_id = pause("pydantic-ai")
    store.answer_approval(approval_id, True, by="alice")
    clock.advance(hours=48)
    (outcome,) = resumption.resume_ready()
    assert (outcome.status, outcome.answer) == ("resumed", "expired") and ledger(files) == []
    assert store.get_approval(approval_id).status == "expired"
