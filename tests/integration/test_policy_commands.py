"""``policy propose`` and ``policy replay`` (§D7), in-process (manage.py's commands) and as the
standalone ``ctrlrun`` command in another OS process."""
from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest

import ctrlrun
from ctrlrun import store
from ctrlrun.control import Control
from tests.support import GOVERNED_POLICY as GOVERNED, receipts, run_command, script_environment

pytestmark = pytest.mark.usefixtures("store_db")

WIDER = GOVERNED.replace("amount_lte: 1000", "amount_lte: 5000")


def failing(*args: str) -> str:
    """Run ``policy ARGS`` as the command line would: its 'Error:' line (stderr) and exit status 1."""
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as stopped:
        from django.core.management import ManagementUtility

        import contextlib

        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            ManagementUtility(["manage.py", "policy", *args]).execute()
    assert stopped.value.code == 1, (out.getvalue(), err.getvalue())
    assert "Traceback" not in err.getvalue()
    return err.getvalue()


@pytest.fixture
def files(use_policy, tmp_path):
    path = use_policy(GOVERNED)
    wider = tmp_path / "wider.yaml"
    wider.write_text(WIDER)
    return path, wider


def test_propose_asks_then_commits_with_the_approval(files):
    _, wider = files
    lines = run_command("policy", "propose", "--file", str(wider), "--by", "olivia")
    approval = lines[0].removeprefix("proposed ")
    assert lines == [f"proposed {approval}", f"approve it with: python manage.py approve {approval}",
                     f"then run it again with the approval: python manage.py policy propose --file {wider} "
                     f"--by olivia --approval {approval}"]
    pending = store.get_approval(approval)
    assert (pending.action, pending.agent, pending.user) == ("ctrlrun.policy.change", "ctrlrun-cli", "olivia")
    run_command("approve", approval, "--by", "ana")
    candidate = Control.from_file(wider).policy_hash
    assert run_command("policy", "propose", "--file", str(wider), "--by", "olivia", "--approval", approval) == [
        f"committed {candidate}"]
    last = receipts()[-1]
    assert (last["action"], last["result"], last["effect_key"]) == ("ctrlrun.policy.change", "committed",
                                                                    f"policy:{candidate}")


def test_propose_json(files):
    current, wider = files
    document = json.loads(run_command("policy", "propose", "--file", str(wider), "--json")[0])
    assert document["status"] == "pending" and document["approval_id"].startswith("apr_")
    assert document["to"] == Control.from_file(wider).policy_hash
    assert document["from"] == Control.from_file(current).policy_hash


def test_replay_lists_the_decisions_that_change_and_writes_nothing(files, agent):
    _, wider = files
    control = Control.from_file(files[0])
    assert control.call("stripe.refund", {"payment_id": "p1", "amount": 10}, lambda: "ok") == "ok"
    with pytest.raises(ctrlrun.ActionDenied):
        control.call("stripe.refund", {"payment_id": "p2", "amount": 3000}, lambda: "ok")
    before = receipts()
    denied = before[-1]["receipt_id"]
    assert run_command("policy", "replay", "--file", str(wider)) == [
        f"{denied}  stripe.refund  deny (rule[1])  ->  allow (rule[0])"]
    document = json.loads(run_command("policy", "replay", "--file", str(wider), "--json")[0])
    assert document == {"changed": [{"receipt_id": denied, "action": "stripe.refund",
                                     "from": {"decision": "deny", "reason": "rule[1]"},
                                     "to": {"decision": "allow", "reason": "rule[0]"}}], "skipped": []}
    assert run_command("policy", "replay", "--file", str(wider), "--last", "1") == [
        f"{denied}  stripe.refund  deny (rule[1])  ->  allow (rule[0])"]
    same = files[0]
    assert run_command("policy", "replay", "--file", str(same)) == [f"no recorded decision changes under {same}"]
    assert receipts() == before


def test_replay_lists_an_unreadable_receipt_as_skipped(files, agent):
    from ctrlrun.models import Receipt
    from tests.support import evidence_unguarded

    control = Control.from_file(files[0])
    control.call("stripe.refund", {"payment_id": "p1", "amount": 10}, lambda: "ok")
    with evidence_unguarded():
        Receipt.objects.update(document="{not json")
    assert run_command("policy", "replay", "--file", str(files[1])) == [
        f"no recorded decision changes under {files[1]}", "skipped: receipt #1: its document is not JSON"]


@pytest.mark.parametrize("args, says", [
    (["replay", "--last", "0"], "--last must be at least 1"),
    (["replay", "--last", "x"], "whole number"),
])
def test_replay_bad_counts_exit_1(files, args, says):
    assert says in failing(*args, "--file", str(files[1]))


def test_a_candidate_that_does_not_load_is_one_error_line(files, tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8)))
    broken = tmp_path / "broken.yaml"
    broken.write_text("schema: ctrlrun.policy/v6\nactions: [1\n")
    for path in (bomb, broken, tmp_path / "missing.yaml"):
        for command in ("propose", "replay"):
            message = failing(command, "--file", str(path))
            assert message.startswith("Error: ") and str(path) in message, message


def test_propose_under_observe_mode_is_refused(use_policy, tmp_path):
    use_policy(GOVERNED.replace("actions:", "mode: observe\nactions:", 1))
    wider = tmp_path / "wider.yaml"
    wider.write_text(WIDER)
    assert "observe mode" in failing("propose", "--file", str(wider))


def test_the_standalone_command_proposes_approves_and_replays(tmp_path):
    """``ctrlrun policy ...`` in a plain script's folder: the proposer is the OS user (or --by)."""
    env = script_environment(tmp_path, GOVERNED)
    (tmp_path / "wider.yaml").write_text(WIDER)

    def ctrlrun_(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ctrlrun", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=180)

    asked = ctrlrun_("policy", "propose", "--file", "wider.yaml", "--by", "olivia")
    assert asked.returncode == 0, asked.stderr
    approval = asked.stdout.splitlines()[0].removeprefix("proposed ")
    assert asked.stdout.splitlines()[1] == f"approve it with: ctrlrun approve {approval}"
    assert ctrlrun_("approve", approval, "--by", "ana").returncode == 0
    done = ctrlrun_("policy", "propose", "--file", "wider.yaml", "--by", "olivia", "--approval", approval)
    assert done.returncode == 0 and done.stdout.startswith("committed sha256:"), done.stderr
    replayed = ctrlrun_("policy", "replay", "--file", "wider.yaml", "--last", "0")
    assert replayed.returncode == 1 and replayed.stderr.startswith("Error: --last must be at least 1")
    assert "Traceback" not in replayed.stderr
