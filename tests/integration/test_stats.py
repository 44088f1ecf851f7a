"""``stats`` on a real store, in enforce mode: the counts of real protected calls (allowed, denied
by a rule, by a bare decision, an unknown action, a lost reply, a duplicate, one waiting for a
human), the text and the ctrlrun.stats/v1 document, --since against the store's clock, usage
errors, an empty store, an unreadable row, a policy that does not load; in-process and as the
``ctrlrun`` console script."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

import ctrlrun
from ctrlrun.management.commands.stats import Command as StatsCommand
from ctrlrun.models import Receipt
from ctrlrun.stats import FOOTNOTE_ENFORCE, FOOTNOTE_WAITING, OBSERVE_BANNER
from tests.support import REFUND_POLICY
from tests.support import make_ambiguous, protected_refund, receipts, run_command, store_environment

pytestmark = pytest.mark.usefixtures("store_db")

#: The refund policy, observed: every call runs, receipts say what enforcing would have done.
OBSERVING_POLICY = REFUND_POLICY.replace("schema: ctrlrun.policy/v2", "schema: ctrlrun.policy/v3\nmode: observe")
START = "2026-11-29T12:00:00.000Z"  # the clock fixture's time, as evidence prints it


def stats_json(*args: str) -> dict:
    [line] = run_command("stats", "--json", *args)
    return json.loads(line)


def run_stats(*args: str) -> tuple[list[str], str]:
    out, err = StringIO(), StringIO()
    call_command("stats", *args, stdout=out, stderr=err)
    return out.getvalue().splitlines(), err.getvalue()


@pytest.fixture
def calls(refund, remote, agent, clock):
    """Seven real calls, six receipts: allowed, denied by rule[2], a bare 'decision' deny, an unknown
    action, a lost reply (ambiguous), a duplicate (blocked); and one waiting for a human (no receipt)."""

    @ctrlrun.protect("iam.grant_admin")
    def grant_admin(user: str) -> None: ...

    @ctrlrun.protect("db.drop_table")
    def drop_table(name: str) -> None: ...

    refund(payment_id="txn_1", amount=100)
    clock.advance(seconds=1)
    with pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_2", amount=10**9)
    with pytest.raises(ctrlrun.ActionDenied):
        grant_admin(user="mallory")
    with pytest.raises(ctrlrun.ActionDenied):
        drop_table(name="payments")
    clock.advance(seconds=1)
    make_ambiguous(refund, remote, "txn_3")
    with pytest.raises(ctrlrun.DuplicateEffect):
        refund(payment_id="txn_1", amount=100)
    with pytest.raises(ctrlrun.ApprovalRequired):
        refund(payment_id="txn_4", amount=500000)
    assert len(receipts()) == 6


def test_enforce_counts_of_real_calls(calls):
    doc = stats_json()
    assert doc == {
        "schema": "ctrlrun.stats/v1", "mode": "enforce", "since": "2026-11-28T12:00:02.000Z",
        "from": START, "to": "2026-11-29T12:00:02.000Z", "actions": 6, "denied": 3,
        "denied_by_reason": {"decision": 1, "rule[2]": 1, "unknown_action": 1}, "ambiguous_outcomes": 1,
        "ledger_rows": 0,
    }
    assert list(doc)[6] == "ledger_rows" and "unreadable_receipts" not in doc  # the store has a (empty) ledger


def test_enforce_text(calls):
    lines, err = run_stats()
    assert err == ""  # enforce mode: no banner
    assert lines[0] == f"ctrlrun — {START} .. 2026-11-29T12:00:02.000Z   (enforce mode)"
    assert [line.strip().rsplit(None, 1) for line in lines[1:8]] == [
        ["actions", "6"], ["denied", "3"], ["decision (the entry's decision is deny)", "1"], ["rule[2]", "1"],
        ["unknown_action (the policy does not name the action)", "1"],
        ["ambiguous outcomes", "1"], ["budget ledger rows", "0"]]
    assert lines[3].startswith("    decision")  # reasons indented under 'denied'
    assert lines[8:] == ["", FOOTNOTE_ENFORCE, FOOTNOTE_WAITING]


def test_since_counts_only_receipts_at_or_after_the_boundary(refund, agent, clock):
    refund(payment_id="txn_1", amount=100)
    with pytest.raises(ctrlrun.ActionDenied):
        refund(payment_id="txn_2", amount=10**9)
    clock.advance(hours=3)
    refund(payment_id="txn_3", amount=100)
    assert stats_json("--since", "2h")["actions"] == 1
    assert stats_json("--since", "2h")["denied"] == 0
    assert stats_json("--since", "2h")["since"] == "2026-11-29T13:00:00.000Z"
    assert stats_json("--since", "181m")["actions"] == 3
    assert stats_json("--since", "1d") | {"since": None} == stats_json("--since", "181m") | {"since": None}
    # an ISO boundary, inclusive: the first two finished at exactly 12:00:00.000Z
    assert stats_json("--since", "2026-11-29T13:00:00+01:00")["actions"] == 3
    assert stats_json("--since", "2026-11-29T12:00:00.001Z")["actions"] == 1
    late = stats_json("--since", "2026-11-29T16:00:00Z")
    assert (late["actions"], late["from"], late["to"]) == (0, None, None)


def test_default_window_is_the_last_24_hours(refund, agent, clock):
    refund(payment_id="txn_1", amount=100)
    clock.advance(hours=25)
    refund(payment_id="txn_2", amount=100)
    doc = stats_json()
    assert doc["actions"] == 1 and doc["since"] == "2026-11-29T13:00:00.000Z"


def test_empty_store():
    doc = stats_json("--since", "1h")
    assert doc["actions"] == 0 and doc["denied"] == 0 and doc["denied_by_reason"] == {}
    assert (doc["from"], doc["to"]) == (None, None)
    lines, _ = run_stats("--since", "2026-11-29T12:00:00Z")
    assert lines[0] == "ctrlrun — no receipts since 2026-11-29T12:00:00.000Z   (enforce mode)"
    assert lines[1].split() == ["actions", "0"]


@pytest.mark.parametrize("since", ["5", "2w", "1mo", "2026-11-29T12:00:00", "soon", "0001-01-01T00:00:00+01:00"])
def test_bad_since_is_a_usage_error(since):
    with pytest.raises(CommandError, match="--since") as caught:
        run_command("stats", "--since", since)
    assert "<n>m, <n>h or <n>d" in str(caught.value) or "offset" in str(caught.value) or "year" in str(caught.value)
    with pytest.raises(CommandError) as given:  # as a keyword, skipping argparse: the same, exit 2
        call_command("stats", since=since, stdout=StringIO(), stderr=StringIO())
    assert given.value.returncode == 2


def test_an_unreadable_row_is_counted_not_fatal(refund, agent, clock):
    refund(payment_id="txn_1", amount=100)
    ts = Receipt.objects.get().ts
    Receipt.objects.create(receipt_id="ctr_" + "0" * 32, action_id="act_" + "0" * 32, action="x", agent="x",
                           decision="allow", result="committed", ts=ts, document="{not json")
    doc = stats_json()
    assert doc["unreadable_receipts"] == 1 and doc["actions"] == 1
    lines, _ = run_stats()
    assert lines[4].split() == ["budget", "ledger", "rows", "0"]
    assert lines[5].split() == ["unreadable", "receipts", "1"]


def test_a_policy_that_does_not_load_is_one_line_exit_1(settings, tmp_path):
    from ctrlrun.protect import reset_runtime

    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: ctrlrun.policy/v2\nactions: [\n")
    settings.CTRLRUN_POLICY = str(bad)
    reset_runtime()
    with pytest.raises(CommandError, match="the policy did not load") as caught:
        run_command("stats")
    assert str(bad) in str(caught.value) and caught.value.returncode == 1


def test_observe_banner_goes_to_stderr(use_policy):
    """The helper every policy-loading command uses: the banner on stderr for an observe-mode policy,
    nothing for an enforcing one."""
    from ctrlrun.policy import parse_policy

    command = StatsCommand(stdout=StringIO(), stderr=StringIO())
    assert command.warn_if_observing(parse_policy(REFUND_POLICY)) is False
    assert command.stderr._out.getvalue() == ""
    assert command.warn_if_observing(parse_policy(OBSERVING_POLICY)) is True
    assert command.stderr._out.getvalue() == OBSERVE_BANNER + "\n"
    assert command.stdout._out.getvalue() == ""


# --------------------------------------------------------------------------- the console script


def cli(folder: Path, *args: str) -> subprocess.CompletedProcess:
    env = store_environment()
    (folder / "ctrlrun.yaml").write_text(REFUND_POLICY)
    return subprocess.run([sys.executable, "-m", "ctrlrun.cli", "stats", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


def test_console_script_counts_the_same(calls, tmp_path):
    done = cli(tmp_path, "--since", "2026-11-29T00:00:00Z", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc == stats_json("--since", "2026-11-29T00:00:00Z")
    assert doc["actions"] == 6 and doc["denied"] == 3 and doc["ambiguous_outcomes"] == 1
    text = cli(tmp_path, "--since", "2026-11-29T00:00:00Z")
    assert text.returncode == 0 and text.stderr == ""
    assert text.stdout.splitlines()[0] == f"ctrlrun — {START} .. 2026-11-29T12:00:02.000Z   (enforce mode)"


def test_console_script_bad_since_exits_2(tmp_path):
    done = cli(tmp_path, "--since", "3w")
    assert done.returncode == 2
    assert done.stderr.startswith("Error: argument --since: '3w'") and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_console_script_help(tmp_path):
    done = cli(tmp_path, "--help")
    assert done.returncode == 0
    for option in ("--since WHEN", "--json", "no weeks, months or bare numbers"):
        assert option in " ".join(done.stdout.split())


def test_console_script_reports_a_broken_policy(tmp_path):
    env = store_environment()
    (tmp_path / "ctrlrun.yaml").write_text("schema: ctrlrun.policy/v9\nactions: {}\n")
    done = subprocess.run([sys.executable, "-m", "ctrlrun.cli", "stats"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: the policy did not load") and "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_the_store_reader_streams_in_batches(refund, agent, clock):
    """store.receipt_documents_since yields parsed documents lazily, in batches (not one list)."""
    from ctrlrun import store

    for n in range(5):
        refund(payment_id=f"txn_{n}", amount=100)
    stream = store.receipt_documents_since(dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc), chunk_size=2)
    assert iter(stream) is stream  # a generator, not a list
    assert sorted(d["effect_key"] for d in stream) == [f"refund:txn_{n}" for n in range(5)]


def test_an_observing_policy_prints_the_banner_and_observe_counts(use_policy, remote, agent, clock):
    """Real observe-mode calls: every one ran, and stats counts what enforcement would have done. The banner
    goes to stderr."""
    use_policy(OBSERVING_POLICY)
    refund = protected_refund(remote)

    @ctrlrun.protect("iam.grant_admin")
    def grant_admin(user: str) -> None: ...

    @ctrlrun.protect("db.drop_table")
    def drop_table(name: str) -> None: ...

    refund(payment_id="txn_1", amount=100)                    # allowed
    refund(payment_id="txn_1", amount=100)                    # would have been blocked: duplicate
    refund(payment_id="txn_2", amount=10**9)                  # would have been denied: rule[2]
    grant_admin(user="mallory")                               # would have been denied: decision
    drop_table(name="payments")                               # would have been denied: unknown_action
    refund(payment_id="txn_4", amount=500000)                 # would have needed approval
    make_ambiguous(refund, remote, "txn_3")                   # an ambiguous outcome
    refund(payment_id="txn_3", amount=100)                    # would have been blocked: ambiguous
    assert len(remote.calls) == 6 and len(receipts()) == 8  # (grant_admin and drop_table do nothing remote)
    lines, err = run_stats("--since", "1h")
    assert err == OBSERVE_BANNER + "\n"
    assert lines[0].endswith("(observe mode)") and FOOTNOTE_ENFORCE not in lines
    out, err = StringIO(), StringIO()
    call_command("stats", "--json", "--since", "1h", stdout=out, stderr=err)
    doc = json.loads(out.getvalue())
    assert err.getvalue() == OBSERVE_BANNER + "\n"
    assert (doc["mode"], doc["actions"], doc["would_have_been_denied"], doc["would_have_needed_approval"],
            doc["would_have_been_blocked"], doc["ambiguous_outcomes"]) == ("observe", 8, 3, 1, 2, 1)
    assert doc["denied_by_reason"] == {"decision": 1, "rule[2]": 1, "unknown_action": 1}
    assert doc["blocked_by_reason"] == {"ambiguous": 1, "duplicate": 1}
