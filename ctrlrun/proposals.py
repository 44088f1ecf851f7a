"""Proposing a policy, and replaying history under one (§D7): the approved-policy flow's two doors.

``propose`` runs the reserved action ``ctrlrun.policy.change`` as an ordinary protected call under
the Control's policy in force: arguments ``{from: <hash in force>, to: <candidate's hash>}``, resource
``policy``, effect key ``policy:<to>``, and an executor that only returns ``{"approved": <to>}``.
The candidate file is **not** installed: once the call is COMMITTED, whoever deploys the file finds
it approved (``require_approved_policy``). Its text is stored once by its hash (``store.policies``,
signed), so the console can show what a pending proposal would change.

The candidate's hash is computed as the Control would compute it once installed: the same
environment override (``Control(environment=)`` or ``CTRLRUN_ENVIRONMENT``) and the same standalone
authority file, so the approved hash is the one the installed file will have.

``replay`` decides the last N receipts' actions again under a candidate and writes nothing.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from .canonical import Principal, Template
from .errors import InvalidArgument
from .kernel import drive
from .kernel.context import current_principal, with_approval
from .kernel.steps import Plan, call_steps
from .policy import Policy
from .policy.change import POLICY_CHANGE_ACTION, RESOURCE, change_arguments, executor_result
from .policy.replay import Replay, replay as replay_receipts

__all__ = ["candidate_policy", "propose", "replay", "PLAN"]

#: The flow's own wiring: built here, never by ``protect``/``plan_for`` (which refuse the name).
PLAN = Plan(POLICY_CHANGE_ACTION, effect=Template.parse("policy:{to}"), resource=Template.parse(RESOURCE))


def candidate_policy(control: Any, candidate: Policy | str | Path, *, source: str | None = None) -> Policy:
    """The candidate as ``control`` would read it once installed (``Control.read_candidate``)."""
    return control.read_candidate(candidate, source=source)


def propose(control: Any, candidate: Policy | str | Path, *, approval: str | None = None,
            principal: Principal | str | None = None, source: str | None = None) -> dict[str, Any]:
    """Propose ``candidate`` under ``control``'s policy in force; see the module's docstring.

    ``principal`` is the proposer (default: ``ctrlrun.context()``); none at all is refused, since a
    change has a proposer. ``approval`` presents a granted request (``apr_...``). Raises what any
    protected call raises: ``ApprovalRequired`` (the request to answer), ``ActionDenied``,
    ``DuplicateEffect`` (this candidate was approved already)."""
    current = control.read_policy()
    if current.observing:
        raise InvalidArgument(f"{current.source} is in observe mode, where nothing is refused and so nothing can be "
                              f"approved: a policy change needs 'mode: enforce' in the policy in force")
    if isinstance(principal, str):
        principal = Principal(agent=principal)
    principal = principal or current_principal()
    if principal is None:
        raise InvalidArgument("a policy change has a proposer, and none was given: pass principal=, or wrap the "
                              "call in ctrlrun.context(agent=..., user=...)")
    proposed = candidate_policy(control, candidate, source=source)
    # Stored first (signed, once by hash): the console shows a pending proposal's text and its diff.
    control.read(control.store.ensure_policy, proposed.hash, proposed.schema, f"candidate {proposed.source}",
                 proposed.text, proposed.environment)
    arguments = change_arguments(current.hash, proposed.hash)
    result = executor_result(proposed.hash)
    steps = call_steps(control, PLAN, lambda: arguments, lambda action: dict(result), principal=principal)
    with with_approval(approval) if approval is not None else contextlib.nullcontext():
        return drive.run_sync(steps, control)


def replay(control: Any, candidate: Policy | str | Path, *, last: int = 100, source: str | None = None) -> Replay:
    """The last ``last`` receipts' actions decided again under ``candidate`` (policy axis only).
    Writes nothing: not the candidate, not the policy in force, no evidence."""
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise InvalidArgument(f"replay needs at least one receipt to read (--last 1 or more), got {last!r}")
    proposed = candidate_policy(control, candidate, source=source)
    with control.scope():
        documents = [receipt.document for receipt in control.store.list_receipts(last=last)]
    return replay_receipts(proposed, documents, name=str(candidate) if source is None and not isinstance(
        candidate, Policy) else proposed.source)
