"""``policy replay``'s pure half (ctrlrun.policy.replay) and the flow's vocabulary (ctrlrun.policy.change)."""
from __future__ import annotations

import json

from ctrlrun.policy import parse_policy
from ctrlrun.policy.change import governs_changes, marker_key
from ctrlrun.policy.replay import is_policy_reason, replay

CANDIDATE = parse_policy("""\
schema: ctrlrun.policy/v6
actions:
  ctrlrun.policy.change: {decision: approve}
  refund:
    rules:
      - when: {amount_lte: 5000}
        decision: allow
      - decision: deny
""", "new.yaml")


def receipt(ident: str, decision: str, reason: str, amount: int = 3000, **extra) -> dict:
    return {"schema": "ctrlrun.receipt/v7", "receipt_id": ident, "action": "refund", "arguments": {"amount": amount},
            "decision": decision, "decision_reason": reason, **extra}


def test_changed_decisions_are_listed_and_unchanged_ones_are_not():
    report = replay(CANDIDATE, [json.dumps(receipt("ctr_1", "deny", "rule[1]")), receipt("ctr_2", "allow", "rule[0]", 10)])
    assert report.lines() == ["ctr_1  refund  deny (rule[1])  ->  allow (rule[0])"]
    assert report.json() == {"changed": [{"receipt_id": "ctr_1", "action": "refund",
                                          "from": {"decision": "deny", "reason": "rule[1]"},
                                          "to": {"decision": "allow", "reason": "rule[0]"}}], "skipped": []}
    assert report.read == 2


def test_unreadable_and_unknown_receipts_are_skipped_by_name():
    report = replay(CANDIDATE, ["{", "[1]", receipt("ctr_3", "deny", "rule[1]", schema="ctrlrun.receipt/v99"),
                                {"schema": "ctrlrun.receipt/v7", "receipt_id": "ctr_4"}])
    assert report.lines() == [
        "no recorded decision changes under new.yaml",
        "skipped: receipt #1: its document is not JSON",
        "skipped: receipt #2: its document is not a JSON object",
        "skipped: ctr_3: unknown receipt schema 'ctrlrun.receipt/v99'",
        "skipped: ctr_4: no action, arguments or decision to replay",
    ]


def test_verdicts_that_were_not_the_policys_are_left_out():
    for reason in ("no_authority", "policy_unapproved", "effect_key_error", "budget_exhausted"):
        assert not is_policy_reason(reason)
        assert replay(CANDIDATE, [receipt("ctr_5", "deny", reason)]).changed == ()
    for reason in ("decision", "rule[0]", "rule[12]", "unknown_action", "no_matching_rule"):
        assert is_policy_reason(reason)
    assert not is_policy_reason("rule[x]")


def test_the_flow_vocabulary():
    assert marker_key("sha256:ab") == "policy:sha256:ab"
    assert governs_changes(CANDIDATE)
    assert not governs_changes(parse_policy("schema: ctrlrun.policy/v6\nactions:\n  refund: {decision: allow}\n"))
