"""The approved-policy flow's vocabulary (§D7), pure: the reserved action, its marker effect key,
its arguments, and whether a policy can approve changes at all.

A policy decides nothing under ``require_approved_policy`` until two things hold:

(a) it declares ``ctrlrun.policy.change`` and every verdict of that entry is ``approve``
    (``Policy.approving_actions()``): a policy that could *allow* its own successor unreviewed, or
    that cannot take one at all, is not a governed policy;
(b) a COMMITTED effect keyed ``policy:<its hash>`` exists: somebody proposed exactly this policy
    (``ctrlrun policy propose``), a person approved the request, and the proposal ran.

The proposal is an ordinary protected action, decided by the policy in force, so the file that
becomes the policy is approved under the rules of the one before it. No Django here.
"""
from __future__ import annotations

from typing import Any

from .model import Policy
from .schema import POLICY_CHANGE_ACTION, RESERVED_EFFECT_PREFIX

__all__ = ["POLICY_CHANGE_ACTION", "REASON", "RESOURCE", "marker_key", "change_arguments", "governs_changes",
           "executor_result", "unapproved_message"]

#: ``ActionDenied.reason`` (and ``ACTION_DENIED.data.reason``) of a call refused by the gate.
REASON = "policy_unapproved"
#: The resource of every proposal.
RESOURCE = "policy"


def marker_key(policy_hash: str) -> str:
    """The effect key whose COMMITTED record says ``policy_hash`` was approved."""
    return f"{RESERVED_EFFECT_PREFIX}{policy_hash}"


def change_arguments(current: str, candidate: str) -> dict[str, Any]:
    """A proposal's arguments: the hash in force and the candidate's."""
    return {"from": current, "to": candidate}


def executor_result(candidate: str) -> dict[str, Any]:
    """What a proposal's executor returns (and its receipt keeps): the approved hash."""
    return {"approved": candidate}


def governs_changes(policy: Policy) -> bool:
    """Condition (a): the policy declares the reserved action and every verdict of it is ``approve``."""
    return POLICY_CHANGE_ACTION in policy.approving_actions()


def unapproved_message(name: str, policy: Policy, *, governs: bool, command: str) -> str:
    """The refusal's sentence, telling the operator what to do."""
    if not governs:
        return (f"{name} denied: policy_unapproved (ctrlrun requires an approved policy, and {policy.source} "
                f"cannot be approved: it must declare {POLICY_CHANGE_ACTION!r} with every rule deciding "
                f"'approve' (schema ctrlrun.policy/v6 or later), so that each change of it is approved by a person)")
    return (f"{name} denied: policy_unapproved (ctrlrun requires an approved policy, and nobody approved "
            f"{policy.source} ({policy.hash}): propose it with '{command} propose --file {policy.source}', have "
            f"the request approved, then run the same command again with --approval)")
