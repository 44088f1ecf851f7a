"""``inspect --grant ID`` (§C5): what a grant's budgets have spent and hold, from real calls on the real
store, through manage.py and the ``ctrlrun`` console script."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.core.management import CommandError

import ctrlrun
from ctrlrun import store
from ctrlrun.canonical import Principal
from ctrlrun.control import Control, default_control
from ctrlrun.policy import parse_policy
from tests.support import CHILD, REPO, policy_text, run_command, script_environment, start_held_call

pytestmark = pytest.mark.usefixtures("store_db")

POLICY = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: support
      subject: {agent: "support-*"}
      actions: [stripe.refund]
      budgets:
        - {metric: amount, limit: 100000, window: PT24H}
        - {metric: count, limit: 5, window: P1D}
    - id: mailer
      subject: {agent: mailer}
      actions: [email.send]
      budgets: [{metric: count, limit: 20, window: PT1H}]
    - id: open
      subject: {agent: reader}
      actions: [email.send]
actions:
  stripe.refund:
    effect: "refund:{payment_id}"
    decision: allow
  email.send:
    effect: "email:{to}"
    decision: allow
"""


@pytest.fixture
def policy(use_policy):
    return use_policy(POLICY)


def call(name: str, arguments: dict, agent: str, executor=lambda: "done"):
    return default_control().call(name, arguments, executor, principal=agent)


def refund(payment_id: str, amount: int, executor=lambda: "done"):
    return call("stripe.refund", {"payment_id": payment_id, "amount": amount}, "support-bot", executor)


def test_spent_budgets_in_words(policy, clock):
    refund("p1", 40000)
    refund("p2", 40000)
    with pytest.raises(ctrlrun.ActionDenied, match="budget_exhausted|exhausted"):
        refund("p3", 40000)
    assert run_command("inspect", "--grant", "support") == [
        "grant support",
        "amount: 80000 of 100000 per day, 0 held",
        "count: 2 of 5 per day, 0 held",
    ]


def test_holds_name_the_call_and_how_to_resolve_it(policy, clock):
    def lost():
        raise TimeoutError("no reply")

    def refused():
        raise ctrlrun.NotExecuted("the remote refused")

    call("email.send", {"to": "a"}, "mailer")
    with pytest.raises(TimeoutError):
        call("email.send", {"to": "amb"}, "mailer", lost)
    with pytest.raises(ctrlrun.NotExecuted):  # failed: its charge is given back, shown nowhere
        call("email.send", {"to": "gone"}, "mailer", refused)
    assert run_command("inspect", "--grant", "mailer") == [
        "grant mailer",
        "count: 2 of 20 per hour, 1 held",
        "  1 held by email:amb (ambiguous): once you know, "
        "'python manage.py resolve email:amb --committed|--failed'",
    ]
    document = json.loads("\n".join(run_command("inspect", "--grant", "mailer", "--json")))
    assert document == {
        "schema": "ctrlrun.budget/v1", "grant_id": "mailer", "at": "2026-11-29T12:00:00.000Z",
        "budgets": [{"metric": "count", "limit": 20, "window_seconds": 3600, "consumed": 2, "held": 1,
                     "holding": [{"effect_key": "email:amb", "state": "ambiguous", "amount": 1, "attempt": 1,
                                  "consumed_at": "2026-11-29T12:00:00.000Z"}]}],
    }
    store.resolve("email:amb", "committed", by="alice", reason="the mail went out")
    assert run_command("inspect", "--grant", "mailer")[1] == "count: 2 of 20 per hour, 0 held"
    clock.advance(hours=1, seconds=1)  # the window slid past every charge
    assert run_command("inspect", "--grant", "mailer")[1] == "count: 0 of 20 per hour, 0 held"


def test_a_grant_without_budgets_says_so(policy):
    assert run_command("inspect", "--grant", "open") == [
        "grant open", "no budgets: this grant's calls are not capped (a grant caps spend with 'budgets:')"]
    document = json.loads("\n".join(run_command("inspect", "--grant", "open", "--json")))
    assert (document["schema"], document["grant_id"], document["budgets"]) == ("ctrlrun.budget/v1", "open", [])


def test_an_unknown_grant_lists_the_grants(policy):
    with pytest.raises(CommandError, match=r"^no grant nope; the policy's grants are: support, mailer, open$"):
        run_command("inspect", "--grant", "nope")


def test_a_policy_without_authority(use_policy):
    use_policy()  # the refund policy: no authority section
    with pytest.raises(CommandError, match="no grant support: the policy .* has no authority section"):
        run_command("inspect", "--grant", "support")


def test_an_action_id_and_a_grant_together_or_neither(policy):
    with pytest.raises(CommandError, match="give one of an action id, --grant ID or --hop DLG"):
        run_command("inspect", "act_x", "--grant", "support")
    with pytest.raises(CommandError, match="an action id .* or --grant ID"):
        run_command("inspect")


def test_the_console_script(tmp_path, policy):
    refund("p1", 30000)
    env = script_environment(tmp_path, POLICY)
    env["PYTHONPATH"] = str(REPO)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ctrlrun.cli", "inspect", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    done = cli("--grant", "support")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == ["grant support", "amount: 30000 of 100000 per day, 0 held"]
    missing = cli("--grant", "nope")
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        "Error: no grant nope; the policy's grants are: support, mailer, open"]
    broken = tmp_path / "broken.yaml"
    broken.write_text("schema: ctrlrun.policy/v7\nauthority: 3\nactions: {}\n")
    unloadable = subprocess.run([sys.executable, "-m", "ctrlrun.cli", "inspect", "--grant", "support"], cwd=tmp_path,
                                env={**env, "CTRLRUN_CONFIG": str(broken)}, capture_output=True, text=True,
                                timeout=120)
    assert unloadable.returncode == 1
    [line] = unloadable.stderr.strip().splitlines()
    assert line.startswith("Error: the policy did not load, so its grants are unknown:") and "Traceback" not in line


def test_inspect_grant_shows_a_delegations_budget(use_policy):
    """A delegation's budget is charged like a grant's; ``inspect --grant dlg_...`` must show it."""
    delegating = policy_text("delegation")
    use_policy(delegating)
    control = Control(policy=parse_policy(delegating))
    made = control.delegate("support", CHILD + "budgets: [{metric: count, limit: 5, window: P1D}]\n",
                            by=Principal(agent="orchestrator"))
    assert control.call("stripe.refund", {"payment_id": "p1", "amount": 1}, lambda: "ok", principal="worker") == "ok"
    lines = run_command("inspect", "--grant", made.id)  # the settings' policy is this one (the fixture)
    assert lines[0] == f"grant {made.id}"
    assert any(line.strip().startswith("count: 1 of 5 per day") for line in lines), lines


SENDER = """\
schema: ctrlrun.policy/v7
authority:
  grants:
    - id: sender
      subject: {agent: sender}
      actions: [email.send]
      budgets: [{metric: count, limit: 2, window: P1D}]
actions:
  email.send:
    effect: "email:{to}"
    decision: allow
"""


def test_a_charge_held_by_another_process_counts_as_used(tmp_path, use_policy):
    """One send committed, one executing in another OS process: the budget of 2 is used up (the next send
    is refused budget_exhausted), and inspect --grant says so: 2 of 2, 1 held."""
    use_policy(SENDER)
    call("email.send", {"to": "a"}, "sender")
    held = start_held_call(tmp_path, SENDER, "email.send", {"to": "b"}, "sender")
    try:
        with pytest.raises(ctrlrun.ActionDenied) as refused:
            call("email.send", {"to": "c"}, "sender")
        assert refused.value.reason == "budget_exhausted"
        lines = run_command("inspect", "--grant", "sender")
        assert lines[:3] == ["grant sender", "count: 2 of 2 per day, 1 held", "  1 held by email:b (executing)"]
        [budget] = json.loads("\n".join(run_command("inspect", "--grant", "sender", "--json")))["budgets"]
        assert (budget["limit"], budget["consumed"], budget["held"]) == (2, 2, 1)
        assert [(h["effect_key"], h["state"], h["amount"]) for h in budget["holding"]] == [("email:b", "executing", 1)]
    finally:
        (tmp_path / "release").write_text("1")
        out, err = held.communicate(timeout=120)
    assert held.returncode == 0, err
    assert run_command("inspect", "--grant", "sender")[1] == "count: 2 of 2 per day, 0 held"
