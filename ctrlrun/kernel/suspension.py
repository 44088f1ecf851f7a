"""The steps of ``Control.resume`` (spec A5): finish a suspended call, written once, driven sync and async.

1. take the continuation (one store phase: single use, atomic; ``EXECUTION_RESUMED {round: N}``),
   which hands back the suspended call as its record stashed it (action, decision, approval);
2. authority again, with the task check off (``evaluate_task=False``): the grants that let the
   principal act must still do so (not expired, not revoked), whatever task the resumer runs in;
   a refusal records the attempt ambiguous (the first leg may have acted) and raises
   ``AuthorityDenied``;
3. the executor runs for the same attempt under its lease, and its outcome is recorded exactly as
   a call's (``steps._Running.run``): committed, failed (``NotExecuted``), ambiguous, or suspended
   once more (round N + 1).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import AuthorityDenied
from ..states import Result
from .plans import plan_for
from .runtime import Runtime
from .steps import Phase, Steps, _delegations_and_now, _Running

__all__ = ["resume_steps"]


def resume_steps(control: Runtime, continuation: str | bytes, invoke: Callable[[Any], Any], *,
                 awaitable: bool) -> Steps:
    store = control.store
    call, attempt, _round = yield Phase(store.take_continuation, (continuation,))
    policy = control.loaded_policy
    if policy is None:
        policy = yield Phase(control.load)
    plan = plan_for(call.action.name, {})
    run = _Running(control, plan, policy, call.action, call.effect_key, invoke, awaitable, call.task, call.hop)
    if policy.authority is not None:
        now, delegations = yield Phase(_delegations_and_now, (store, call.action.principal.agent, call.hop))
        judged = policy.authority.evaluate(call.action, now=now, delegations=delegations, hop=call.hop,
                                           evaluate_task=False)
        if not judged.passed:
            error = f"{call.action.name}: authority refused the resume: {judged.reason}"
            yield from run.finish(call, attempt, Result.AMBIGUOUS, error, None, None, held=True, would_have=None)
            raise AuthorityDenied(error, reason=judged.reason, grant_id=judged.grant_id,
                                  delegation_id=judged.delegation_id, action_id=call.action.action_id)
    return (yield from run.run(call, attempt, control.lease, held=True))
