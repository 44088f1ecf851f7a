"""The command line on a real database (§7, §9, §12): receipts, effects, inspect, resolve, the
system check on the policy, and the ``ctrlrun`` console script as a real process."""
from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.core.management.base import SystemCheckError

import ctrlrun
from ctrlrun.models import EffectRecord, Event, Receipt
from tests.support import REPO, hold_key, make_ambiguous, receipts, run_command

pytestmark = pytest.mark.usefixtures("store_db")

WHEN = "2026-11-29T12:00:00.000Z"  # the clock fixture's time, as evidence prints it

RECEIPT_KEYS = [
    "schema", "receipt_id", "action_id", "action", "action_hash", "principal", "resource", "arguments",
    "environment", "decision", "decision_reason", "approval_id", "approver", "effect_key", "attempt", "result",
    "execution", "would_have", "error", "started_at", "finished_at", "seq", "prev_hash", "policy_hash",
    "policy_version", "controls", "precondition_at_request", "precondition_at_recheck", "approvers",
    "authority_grant_id", "task", "scope_hash", "budget_charges", "hop",
]


@pytest.fixture
def ambiguous(refund, remote, agent):
    """refund:txn_1 left AMBIGUOUS by a lost reply; returns its action_id."""
    make_ambiguous(refund, remote, "txn_1")
    return EffectRecord.objects.get(pk="refund:txn_1").action_id


# --------------------------------------------------------------------------- receipts


def test_receipts_empty():
    """With no receipts the command says so."""
    assert run_command("receipts") == ["no receipts yet"]


def test_receipts_lines(refund, agent, clock):
    """Each receipt is one line: finished, receipt id, action, decision/result, key (or -), agent."""
    refund(payment_id="txn_1", amount=100)
    with pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_2", amount=10**9)

    @ctrlrun.protect("audit.note")
    def note(text: str) -> None: ...

    note(text="hello")
    lines = run_command("receipts")
    ids = [d["receipt_id"] for d in receipts()]
    assert lines == [
        f"{WHEN}  {ids[0]}  stripe.refund  allow/committed  refund:txn_1  support-agent",
        f"{WHEN}  {ids[1]}  stripe.refund  deny/denied  refund:txn_2  support-agent",
        f"{WHEN}  {ids[2]}  audit.note  allow/committed  -  support-agent",
    ]
    assert all(re.fullmatch(r"ctr_[0-9a-f]{32}", i) for i in ids)


def test_receipts_last(refund, agent, clock):
    """--last 1 prints only the most recent receipt."""
    refund(payment_id="txn_1", amount=100)
    refund(payment_id="txn_2", amount=100)
    [line] = run_command("receipts", "--last", "1")
    assert "refund:txn_2" in line and receipts()[-1]["receipt_id"] in line


def test_receipts_last_must_be_positive():
    """--last 0 is a usage error."""
    with pytest.raises(CommandError):
        run_command("receipts", "--last", "0")


def test_receipts_json_lines_have_34_keys_in_order(refund, agent, clock):
    """--json prints each stored document, one per line, with the 34 receipt keys in order."""
    refund(payment_id="txn_1", amount=100)
    with pytest.raises(ctrlrun.DuplicateEffect):
        refund(payment_id="txn_1", amount=100)
    lines = run_command("receipts", "--json")
    docs = [json.loads(line) for line in lines]
    assert [list(d) for d in docs] == [RECEIPT_KEYS, RECEIPT_KEYS]
    assert len(RECEIPT_KEYS) == 34
    assert [(d["result"], d["seq"]) for d in docs] == [("committed", 1), ("blocked", 2)]
    assert lines == [r.document for r in Receipt.objects.order_by("seq")]
    assert docs[0]["schema"] == "ctrlrun.receipt/v7"


# --------------------------------------------------------------------------- effects


def test_effects_empty():
    """With no effect records the command says so; with a state filter it names the state."""
    assert run_command("effects") == ["no effects yet"]
    assert run_command("effects", "--state", "ambiguous") == ["no effects are ambiguous"]


def test_effects_lines_and_state_filter(clock, refund, ambiguous):
    """Each record is one line: key, state, attempt, holder, last change; --state filters."""
    refund(payment_id="txn_2", amount=100)
    committed_by = EffectRecord.objects.get(pk="refund:txn_2").action_id
    assert run_command("effects") == [
        f"refund:txn_1  ambiguous  attempt 1  {ambiguous}  {WHEN}",
        f"refund:txn_2  committed  attempt 1  {committed_by}  {WHEN}",
    ]
    assert run_command("effects", "--state", "ambiguous") == [
        f"refund:txn_1  ambiguous  attempt 1  {ambiguous}  {WHEN}"]
    assert run_command("effects", "--state", "failed") == ["no effects are failed"]


def test_effects_marks_lapsed_lease_and_resolver(clock, refund, ambiguous):
    """A held record past its lease says '(lease expired)'; a resolved one says who resolved it."""
    hold_key("refund:txn_9")
    run_command("resolve", "refund:txn_1", "--committed", "--by", "alice", "--reason", "checked the remote")
    clock.advance(minutes=6)
    lines = run_command("effects")
    assert lines[0].endswith("resolved by alice") and lines[0].startswith("refund:txn_1  committed")
    assert lines[1].startswith("refund:txn_9  executing  attempt 1") and lines[1].endswith("(lease expired)")


def test_effects_refuses_an_unknown_state():
    """--state takes only a stored state."""
    with pytest.raises(CommandError, match="invalid choice"):
        run_command("effects", "--state", "new")


# --------------------------------------------------------------------------- inspect


def test_inspect_text(refund, agent, clock):
    """inspect prints the action's summary, its effect and receipt, then one line per event."""
    refund(payment_id="txn_1", amount=100)
    [doc] = receipts()
    action_id = doc["action_id"]
    lines = run_command("inspect", action_id)
    assert lines[0] == f"{action_id}  stripe.refund"
    body = "\n".join(lines)
    assert re.search(r"^principal +support-agent$", body, re.M)
    assert re.search(r"^resource +-$", body, re.M)
    assert re.search(r"^environment +production$", body, re.M)
    assert re.search(r'^arguments +\{"amount": 100, "payment_id": "txn_1"\}$', body, re.M)
    assert re.search(r"^decision +allow  \(rule\[0\]\)$", body, re.M)
    assert re.search(r"^effect +refund:txn_1  committed  attempt 1$", body, re.M)
    assert re.search(rf"^receipt +{doc['receipt_id']}  committed$", body, re.M)
    types = ["ACTION_PROPOSED", "POLICY_EVALUATED", "EFFECT_RESERVED", "EXECUTION_STARTED", "EXECUTION_COMMITTED"]
    event_lines = [line for line in lines if re.match(r"^ *\d+  \d{4}-", line)]
    assert [line.split()[2] for line in event_lines] == types
    # (the k=v order follows the stored JSON, which PostgreSQL's jsonb reorders)
    assert set(event_lines[1].split()[3:]) == {"decision=allow", "reason=rule[0]"}


def test_inspect_json(refund, agent, clock):
    """inspect --json prints a ctrlrun.inspection/v2 document with the receipt, effect and events."""
    refund(payment_id="txn_1", amount=100)
    [doc] = receipts()
    document = json.loads("\n".join(run_command("inspect", doc["action_id"], "--json")))
    assert document["schema"] == "ctrlrun.inspection/v2"
    assert (document["action_id"], document["name"], document["decision"], document["reason"]) == (
        doc["action_id"], "stripe.refund", "allow", "rule[0]")
    assert document["receipt"] == doc
    assert document["effect"]["effect_key"] == "refund:txn_1" and document["effect"]["state"] == "committed"
    assert [e["type"] for e in document["events"]][-1] == "EXECUTION_COMMITTED"
    assert all(e["action_id"] == doc["action_id"] for e in document["events"])


def test_inspect_unfinished_action_has_no_receipt(clock, ambiguous):
    """inspect of an action whose worker has not finished shows '-' for the receipt."""
    action_id = hold_key("refund:txn_9").call.action.action_id
    lines = run_command("inspect", action_id)
    assert any(re.match(r"^receipt +-  ", line) for line in lines)
    assert any(re.match(r"^effect +refund:txn_9  executing  attempt 1$", line) for line in lines)


def test_inspect_unknown_action():
    """inspect of an id the store never saw is an error starting 'no action'."""
    with pytest.raises(CommandError) as caught:
        run_command("inspect", "act_nope")
    assert str(caught.value).startswith("no action act_nope")
    assert caught.value.returncode == 1


# --------------------------------------------------------------------------- resolve


def test_resolve_failed_moves_row_and_records_the_human(clock, ambiguous):
    """resolve --failed --by alice: row failed, resolved_by alice, one EFFECT_RESOLVED naming her and the reason."""
    receipts_before = Receipt.objects.count()
    lines = run_command("resolve", "refund:txn_1", "--failed", "--by", "alice", "--reason", "stripe shows no refund")
    assert lines == ["refund:txn_1 resolved failed by alice", "a retry of this effect is now permitted"]
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.resolved_by) == ("failed", "alice")
    assert record.error == "resolved failed by alice (was: TimeoutError: read timed out)"
    resolved = Event.objects.get(type="EFFECT_RESOLVED")
    assert resolved.data == {"state": "failed", "resolver": "alice", "resolved_by": "human", "attempt": 1,
                             "reason": "stripe shows no refund"}
    assert (resolved.action_id, resolved.effect_key) == (ambiguous, "refund:txn_1")
    assert Receipt.objects.count() == receipts_before  # resolving writes no receipt


def test_retry_after_resolve_failed_renews_at_attempt_2(refund, remote, ambiguous, agent):
    """After --failed the next call renews the key at attempt 2 and runs."""
    run_command("resolve", "refund:txn_1", "--failed", "--by", "alice", "--reason", "checked the remote")
    assert refund(payment_id="txn_1", amount=100) == {"id": "re_txn_1", "amount": 100}
    record = EffectRecord.objects.get(pk="refund:txn_1")
    assert (record.state, record.attempt, record.resolved_by) == ("committed", 2, None)
    assert remote.calls == [("txn_1", 100), ("txn_1", 100)]


def test_retry_after_resolve_committed_is_duplicate(refund, remote, ambiguous, agent):
    """After --committed the next call is refused as DuplicateEffect(committed) and does not run."""
    lines = run_command("resolve", "refund:txn_1", "--committed", "--by", "bob", "--reason", "checked the remote")
    assert lines[0] == "refund:txn_1 resolved committed by bob"
    with pytest.raises(ctrlrun.DuplicateEffect) as caught:
        refund(payment_id="txn_1", amount=100)
    assert caught.value.state == "committed"
    assert remote.calls == [("txn_1", 100)]


def test_resolve_refuses_a_row_that_is_not_ambiguous(refund, agent):
    """Only an ambiguous row can be resolved: a committed one is an error and stays as it is."""
    refund(payment_id="txn_1", amount=100)
    with pytest.raises(CommandError, match="is committed, not ambiguous") as caught:
        run_command("resolve", "refund:txn_1", "--failed", "--by", "alice", "--reason", "checked the remote")
    assert caught.value.returncode == 1
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "committed"
    assert not Event.objects.filter(type="EFFECT_RESOLVED").exists()


def test_resolve_refuses_a_lapsed_executing_row_with_a_hint(clock):
    """A held row whose lease lapsed is not ambiguous yet; the error points at 'reconcile'."""
    hold_key("refund:txn_9")
    clock.advance(minutes=6)
    with pytest.raises(CommandError, match="is executing, not ambiguous.*'python manage.py reconcile'"):
        run_command("resolve", "refund:txn_9", "--failed", "--by", "alice", "--reason", "checked the remote")


def test_resolve_unknown_key():
    """Resolving a key the store does not hold is an error naming it."""
    with pytest.raises(CommandError, match="no effect 'refund:nope'") as caught:
        run_command("resolve", "refund:nope", "--failed", "--by", "alice", "--reason", "checked the remote")
    assert caught.value.returncode == 1


def test_resolve_refuses_a_stale_attempt(refund, remote, agent):
    """--attempt older than the row's current attempt is refused; the current one is accepted."""
    remote.fail_with = ctrlrun.NotExecuted("refused before any byte was sent")
    with pytest.raises(ctrlrun.NotExecuted):
        refund(payment_id="txn_1", amount=100)
    remote.fail_with = TimeoutError("read timed out")
    with pytest.raises(TimeoutError):
        refund(payment_id="txn_1", amount=100)
    assert EffectRecord.objects.get(pk="refund:txn_1").attempt == 2
    with pytest.raises(CommandError, match="at attempt 2, not 1"):
        run_command("resolve", "refund:txn_1", "--failed", "--by", "alice", "--attempt", "1", "--reason", "checked")
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"
    run_command("resolve", "refund:txn_1", "--failed", "--by", "alice", "--attempt", "2", "--reason", "checked")
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "failed"
    assert Event.objects.get(type="EFFECT_RESOLVED").data["attempt"] == 2


@pytest.mark.parametrize("flags", [[], ["--committed", "--failed"]])
def test_resolve_needs_exactly_one_answer(ambiguous, flags):
    """Neither or both of --committed/--failed is a usage error (exit 2) and moves nothing."""
    with pytest.raises(CommandError, match="exactly one of --committed or --failed") as caught:
        run_command("resolve", "refund:txn_1", *flags, "--by", "alice", "--reason", "checked the remote")
    assert caught.value.returncode == 2
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"


def test_resolve_by_defaults_to_the_os_user(ambiguous):
    """Without --by the resolver is the operating-system user."""
    lines = run_command("resolve", "refund:txn_1", "--committed", "--reason", "checked the remote")
    user = getpass.getuser()
    assert lines[0] == f"refund:txn_1 resolved committed by {user}"
    assert EffectRecord.objects.get(pk="refund:txn_1").resolved_by == user
    assert Event.objects.get(type="EFFECT_RESOLVED").data["resolver"] == user


def test_resolve_refuses_a_blank_name(ambiguous):
    """--by with a blank name is refused: a resolution names a person."""
    with pytest.raises(CommandError, match="--by NAME"):
        run_command("resolve", "refund:txn_1", "--failed", "--by", "  ", "--reason", "checked the remote")
    assert EffectRecord.objects.get(pk="refund:txn_1").state == "ambiguous"


# --------------------------------------------------------------------------- manage.py check


def check_refusal(settings, policy: Path, text: str) -> str:
    """Write ``text`` to ``policy`` and make it the project's policy; check must fail: its message."""
    policy.write_text(text)
    settings.CTRLRUN_POLICY = str(policy)
    with pytest.raises(SystemCheckError) as caught:
        call_command("check", stdout=StringIO(), stderr=StringIO())
    return str(caught.value)


def test_check_reports_a_malformed_policy_with_file_and_line(settings, tmp_path):
    """check fails on a malformed policy, naming the file and the line of the problem."""
    bad = tmp_path / "bad.yaml"
    text = check_refusal(settings, bad, "schema: ctrlrun.policy/v2\nactions:\n  stripe.refund:\n    decision: maybe\n")
    assert "ctrlrun.E002" in text
    assert f"{bad}, line 4" in text
    assert "maybe" in text


def test_check_reports_duplicate_key_line(settings, tmp_path):
    """A duplicate key is refused by check with the line it repeats on."""
    bad = tmp_path / "dup.yaml"
    text = check_refusal(settings, bad,
                         "schema: ctrlrun.policy/v2\nactions:\n  a:\n    decision: allow\n  a:\n    decision: deny\n")
    assert str(bad) in text and "line 5" in text


def test_check_passes_with_a_good_policy(use_policy):
    """check is silent about ctrlrun when the policy loads."""
    use_policy()
    out = StringIO()
    call_command("check", stdout=out, stderr=StringIO())
    assert "no issues" in out.getvalue()


def test_check_warns_about_a_missing_policy(settings, tmp_path):
    """A missing policy file is a warning, not an error: the check names the path."""
    settings.CTRLRUN_POLICY = str(tmp_path / "absent.yaml")
    err = StringIO()
    call_command("check", stdout=StringIO(), stderr=err)
    assert "ctrlrun.W001" in err.getvalue() and "absent.yaml" in err.getvalue()


def test_read_commands_work_with_a_malformed_policy(settings, tmp_path, ambiguous):
    """Reading evidence and resolving do not depend on the policy loading."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: nope\n")
    settings.CTRLRUN_POLICY = str(bad)
    assert run_command("effects")[0].startswith("refund:txn_1  ambiguous")
    assert len(run_command("receipts")) == 1
    run_command("resolve", "refund:txn_1", "--failed", "--by", "alice", "--reason", "checked the remote")


# --------------------------------------------------------------------------- the console script


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CTRLRUN_") and k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "ctrlrun.cli", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)


def test_cli_read_command_without_a_store_creates_nothing(tmp_path):
    """'ctrlrun receipts' in an empty folder exits 1 saying there is no ctrlrun.yaml here, and creates nothing;
    beside a policy with no store yet, 'Error: no database at' names the store's path."""
    folder = tmp_path / "empty"
    folder.mkdir()
    done = cli(folder, "receipts")
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: no ctrlrun.yaml in {folder}")
    assert list(folder.iterdir()) == []
    (folder / "ctrlrun.yaml").write_text("schema: ctrlrun.policy/v2\nactions: {}\n")
    done = cli(folder, "receipts")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: no database at")
    assert str(folder / ".ctrlrun" / "state.db") in done.stderr
    (folder / "ctrlrun.yaml").unlink()
    assert "Traceback" not in done.stderr
    assert list(folder.iterdir()) == []


def test_cli_help_lists_the_commands(tmp_path):
    """'ctrlrun --help' lists every command and exits 0."""
    folder = tmp_path / "empty"
    folder.mkdir()
    done = cli(folder, "--help")
    assert done.returncode == 0
    for name in ("receipts", "effects", "inspect", "resolve", "reconcile"):
        assert re.search(rf"^  {name} ", done.stdout, re.M), name
    assert list(folder.iterdir()) == []


def test_cli_unknown_command_exits_2(tmp_path):
    """An unknown command is a usage error: exit 2 with a message on stderr."""
    done = cli(tmp_path, "frobnicate")
    assert done.returncode == 2
    assert done.stderr.startswith("Error:") and "frobnicate" in done.stderr


def test_inspect_accepts_a_receipt_id(refund, agent):
    """'inspect ctr_...' (the id 'receipts' prints) shows that receipt's action."""
    refund(payment_id="txn_1", amount=100)
    doc = receipts()[-1]
    lines = run_command("inspect", doc["receipt_id"])
    assert lines[0] == f"{doc['action_id']}  stripe.refund"
    with pytest.raises(CommandError, match="no receipt ctr_nope"):
        run_command("inspect", "ctr_nope")


def test_inspect_of_a_call_waiting_for_approval(refund, agent):
    """A call stopped for approval has no receipt yet, and inspect says why."""
    with pytest.raises(ctrlrun.ApprovalRequired) as caught:
        refund(payment_id="txn_2", amount=500000)
    lines = run_command("inspect", caught.value.action_id)
    assert any(line.startswith("receipt     -  (none: the call stopped to ask a person") for line in lines)
    assert any(line.startswith(f"approval    {caught.value.request_id}  pending") for line in lines)


# --------------------------------------------------------------------------- hidden characters


def test_effects_and_receipts_show_hidden_characters_escaped(refund, clock):
    """A key or an agent name holding U+202E or U+200B is printed escaped by ``effects`` and ``receipts``
    (as by ``approvals`` and ``inspect``): a resolver reads ``effects`` before ``resolve``."""
    with ctrlrun.context(agent="support\u200b-agent"):
        refund(payment_id="txn_\u202e1000", amount=100)
    for lines in (run_command("effects"), run_command("receipts"), run_command("receipts", "--json")):
        text = "\n".join(lines)
        assert "\u202e" not in text and "\u200b" not in text, text
        assert "txn_\\u202e1000" in text, text
    assert all("support\\u200b-agent" in run_command("receipts", *flag)[0] for flag in ((), ("--json",)))
    (line,) = run_command("receipts", "--json")
    assert json.loads(line) == json.loads(Receipt.objects.get().document)  # the same document, escaped
