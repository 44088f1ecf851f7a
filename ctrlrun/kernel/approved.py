"""``require_approved_policy`` (§D7): the gate every call of a Control that requires it meets first,
before authority and the policy.

A call is refused ``policy_unapproved`` (its ``ACTION_DENIED`` and ``denied`` receipt written first)
unless (a) the policy in force declares ``ctrlrun.policy.change`` with every verdict ``approve`` and
(b) a COMMITTED, signed effect record ``policy:<its hash>`` exists. The reserved action itself meets
(a) only: it is how (b) comes to hold. A yes is remembered by the Control (per database and hash);
a no is read again at the next decision, so an approval counts from the next call on. Observe mode
skips the gate (it refuses nothing). Written as steps, like the rest of a call: one ``Phase`` reads.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..errors import ActionDenied
from ..policy.change import POLICY_CHANGE_ACTION, REASON, governs_changes, marker_key, unapproved_message
from ..states import Decision
from .steps import Record, Steps, Phase

__all__ = ["gate", "marker_committed"]


def marker_committed(store: Any, policy_hash: str) -> bool:
    """Whether the policy's marker effect is COMMITTED and carries ctrlrun's signature (a store read)."""
    effect = store.get_effect(marker_key(policy_hash))
    return effect is not None and effect.state == "committed" and effect.signature_ok


def gate(run: Any, presented: str | None) -> Steps:
    """The gate for one call (``run`` is the kernel's ``_Running``): returns when the call may go on,
    else records the refusal and raises ``ActionDenied(reason="policy_unapproved")``."""
    control, policy = run.control, run.policy
    if policy.observing or not getattr(control, "require_approved_policy", False):
        return
    governs = governs_changes(policy)
    if governs and (run.name == POLICY_CHANGE_ACTION or control.policy_known_approved(policy.hash)):
        return
    if governs and (yield Phase(marker_committed, (control.store, policy.hash))):
        control.note_policy_approved(policy.hash)
        return
    store = control.store
    call = store.Call(run.action, Decision.DENY, REASON, policy.hash, run.effect_key,
                      policy_version=policy.version, task=run.task, hop=run.hop, origin=run.origin)
    yield Record(store.record_denial, (replace(call, approval_id=presented), {"reason": REASON}),
                 {"with_policy": False})
    raise ActionDenied(unapproved_message(run.name, policy, governs=governs, command=control.policy_command),
                       reason=REASON, action_id=run.action.action_id)
