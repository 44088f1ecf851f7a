"""One protected call, written once: a generator that yields what it needs done and does no I/O.

Design
------
``call_steps`` is the whole pipeline of a protected call. It decides everything itself (the
principal, the policy's verdict, the effect key, what an outcome means) and, for every piece of
I/O, *yields an instruction* and receives its result (or has its exception thrown back in):

- ``Phase(fn, *args)``: one store operation - a short transaction or a read. The synchronous
  driver calls it in place; the asynchronous one runs it on ctrlrun's store threads, so the event
  loop never waits on the database;
- ``Run(...)``: the user's function, under its attempt's lease (the driver renews it meanwhile);
- ``Ask(hook, key)``: a reconcile hook (sync or async), answering a ``HookAnswer``;
- ``Pause(seconds)``: waiting for a person (``time.sleep`` or ``asyncio.sleep``).

So the sync and async paths cannot drift: they are the same steps, driven twice (``drive.py``).
A call cancelled while its async function runs has ``Abandoned`` thrown in at ``Run``: nothing is
recorded, the record stays held, its lease lapses, and the sweeper marks it ambiguous - exactly
what happens to a worker that dies mid-call.

The order of one call:

1. the principal (``context()``, or the programmatic entry's) - none: ``ActionDenied(no_principal)``,
   nothing recorded;
2. the Control's policy (loaded and stored on first use); with an identity provider, the
   principal is then the provider's (the resolution table in ``ctrlrun.identity``);
3. the arguments bound and canonicalised, the Action; a principal whose credential has expired is
   recorded (``principal_expired``) and refused with ``IdentityError``; then its resource and
   effect key (a template error is recorded and raised as ``EffectKeyError``);
4. the policy's verdict: deny - recorded, ``ActionDenied``; approve without a presented approval -
   a request through the Control's approval provider, then ``ApprovalRequired`` or (``wait=True``)
   pauses until a person answers; allow (or an approval presented) - take the key (one phase),
   run the function with no transaction open, record the outcome (one phase);
5. a refused reservation that meets an AMBIGUOUS record asks the reconcile hook first (the
   *blocking* trigger) and takes the key once more if the hook moved it; with
   ``reconcile_eagerly=True`` the hook is asked right after this call's own ambiguous outcome.
"""
from __future__ import annotations

import datetime as dt
import inspect
import logging
import weakref
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..policy.authority import matches, validate_pattern
from ..canonical import (
    Action,
    Principal,
    Template,
    canonical_arguments,
    canonical_bytes,
    evidence_text,
    evidence_time,
    sha256_hash,
)
from ..errors import (
    ActionDenied,
    ApprovalRequired,
    ApprovalTimeout,
    AuthorityDenied,
    BudgetRefused,
    EffectKeyError,
    IdentityError,
    InvalidArgument,
    NotExecuted,
    Suspended,
)
from .. import messages
from .. import upstream as upstream_pins
from ..identity import IdentityContext, answer_of, expired_message, wrapped
from ..preconditions import described_failure, fingerprint
from ..roles import required_roles
from ..states import Decision, Result
from ..policy.schema import POLICY_CHANGE_ACTION
from .context import current_origin, current_principal, presented_approval
from .runtime import Runtime

logger = logging.getLogger("ctrlrun")

__all__ = ["Plan", "Phase", "Record", "Run", "Ask", "Pause", "Consult", "Abandoned", "call_steps", "Steps"]


# --------------------------------------------------------------------------- instructions


@dataclass(frozen=True)
class Phase:
    """A store operation: ``fn(*args, **kwargs)`` inside the running Control's scope."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


class Record(Phase):
    """A phase that records what already happened (an outcome, a refusal, a denial, a hook's
    answer): it runs even after the caller cancelled, where any other phase is not started."""


@dataclass(frozen=True)
class Run:
    """The user's function, for one attempt: ``invoke(action)``; ``awaitable`` when it is ``async def``."""

    invoke: Callable[[Action], Any]
    action: Action
    awaitable: bool
    call: Any  # store.Call as reserved (None for an unkeyed call: no lease to renew)
    attempt: int
    lease: dt.timedelta
    #: The effect key whose ``idempotency_token()`` the function sees: the key even when it is not
    #: held (observe mode runs a call enforcement would refuse, and must not change what it sees).
    key: str | None = None


@dataclass(frozen=True)
class Ask:
    """A reconcile hook, asked about ``effect_key``; the driver answers a ``HookAnswer``."""

    hook: Callable[[str], Any]
    effect_key: str


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Consult:
    """A user's callback about the call (a scope provider): ``fn(argument)``, plain or ``async def``;
    the driver sends back what it returns or throws in what it raised."""

    fn: Callable[[Any], Any]
    argument: Any


class Abandoned(BaseException):
    """Thrown in at ``Run`` when the caller went away mid-function (an async task cancelled): the
    attempt's outcome is unknown and nothing may be recorded for it here."""


Steps = Generator[Any, Any, Any]


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Plan:
    """One guarded action's wiring, fixed where it is declared (decorator or programmatic entry)."""

    name: str
    effect: Template | None = None
    resource: Template | None = None
    lease: dt.timedelta | None = None
    reconcile: Callable[[str], Any] | None = None
    reconcile_eagerly: bool = False
    wait: bool = False
    task: Template | None = None
    scope: Callable[[Action], Any] | None = None
    hop: Template | None = None
    #: The state the person approving sees (§8.6): fingerprinted when an ``approve`` call asks, and
    #: again before the approval is used.
    preconditions: Callable[[Action], Any] | None = None


_warned: set[tuple[str, str]] = set()
# Per Control, keyed weakly: an id() would outlive its Control and silence the next one at that address.
_warned_by_scope: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()


def _warn_once(kind: str, name: str, message: str, *args: Any, scope: Any = None) -> None:
    """Log ``message`` once per (kind, action) - and per Control when ``scope`` is one."""
    seen = _warned if scope is None else _warned_by_scope.setdefault(scope, set())
    if (kind, name) not in seen:
        seen.add((kind, name))
        logger.warning(message, *args)


def _choose(plan: Plan, what: str, mine: Template | None, policy: Template | None) -> Template | None:
    if mine is not None and policy is not None and mine.text != policy.text:
        _warn_once(what, plan.name, "%s: protect(%s=%r) overrides the policy's %r", plan.name, what,
                   mine.text, policy.text)
    return mine or policy


def _effect_key(plan: Plan, effect: Template | None, action: Action) -> str | None:
    if effect is None:
        if plan.reconcile is not None:
            _warn_once("unkeyed", plan.name, "%s has a reconcile hook but no effect key; the hook is never called",
                       plan.name)
        return None
    values: dict[str, Any] = dict(action.arguments)
    if "resource" in effect.names:
        if "resource" in action.arguments:
            raise EffectKeyError(
                f"{effect.text!r}: '{{resource}}' is ambiguous: the function also has an argument named "
                f"'resource'; rename one of them"
            )
        if action.resource is None:
            raise EffectKeyError(f"{effect.text!r}: '{{resource}}' is used but the action has no resource")
        values["resource"] = action.resource
    key = effect.render(values)
    if key.startswith("policy:") and plan.name != POLICY_CHANGE_ACTION:  # the flow's own key (plans.py refuses the name)
        raise EffectKeyError(f"{effect.text!r} renders {key!r}; effect keys starting 'policy:' are reserved")
    return key


def _task(template: Template, action: Action) -> str:
    """The call's task id (``protect(task=...)``), rendered from its arguments like an effect key."""
    return template.render(dict(action.arguments), error=EffectKeyError)


def _delegations_of(judged: Any) -> tuple[str, ...]:
    """The delegations a passing authority result rests on (nearest first), for the store to re-check."""
    if judged is None or not judged.passed:
        return ()
    return tuple(grant.id for grant in judged.chain if grant.id.startswith("dlg_"))


def _denial_message(name: str, reason: str) -> str:
    if reason == "unknown_action":
        return (f"{name} denied: unknown_action (the policy has no entry for {name!r}; add one "
                f"under 'actions:' to let it run)")
    return f"{name} denied: {reason}"


# --------------------------------------------------------------------------- the call


def call_steps(control: Runtime, plan: Plan, bind: Callable[[], Mapping[str, Any]], invoke: Callable[[Action], Any],
               *, awaitable: bool = False, principal: Principal | None = None,
               headers: Mapping[str, str] | None = None) -> Steps:
    """The steps of one call of ``plan`` under ``control``; its value is the function's.

    ``bind()`` gives the call's arguments by name (defaults applied); ``invoke(action)`` runs the
    function on a fresh copy of the action's canonical arguments.
    """
    # A policy change names its proposer (the console's signed-in person, the command's --by): an
    # identity provider does not replace them, or the requester rule would have nobody to exclude.
    proposer = principal if plan.name == POLICY_CHANGE_ACTION else None
    principal = principal or current_principal()
    origin = current_origin()
    provider = control.identity if proposer is None else None
    if principal is None and provider is None:
        raise _no_principal(plan.name)
    policy = control.loaded_policy
    if policy is None:
        policy = yield Phase(control.load)
    if provider is not None:
        principal = yield from _identified(control, plan.name, policy, provider, principal, headers)
    store = control.store
    # Keys and the hash come from the same canonical values: Color.RED and "red" are one key.
    arguments = canonical_arguments(bind())
    entry = policy.entry(plan.name)
    effect = _choose(plan, "effect", plan.effect, entry.effect if entry else None)
    resource_tpl = _choose(plan, "resource", plan.resource, entry.resource if entry else None)
    resource = resource_tpl.render(arguments, error=InvalidArgument) if resource_tpl else None
    action = Action(plan.name, arguments, principal, resource=resource, environment=policy.environment)
    if principal.expires_at is not None and principal.expired((yield Phase(store.now))):
        yield Record(store.record_denial, (store.Call(action, Decision.DENY, "principal_expired", policy.hash, None,
                                                      policy_version=policy.version, origin=origin),
                                           {"reason": "principal_expired"}), {"with_policy": False})
        raise IdentityError(expired_message(plan.name, principal))
    if entry is not None and entry.upstream and not upstream_pins.is_verified(plan.name):
        # A pinned action (``upstream:``) runs only through the gateway, which checked the server.
        yield Record(store.record_denial, (store.Call(action, Decision.DENY, upstream_pins.UNVERIFIED, policy.hash,
                                                      None, policy_version=policy.version, origin=origin),
                                           {"reason": upstream_pins.UNVERIFIED}), {"with_policy": False})
        raise ActionDenied(f"{plan.name}: the policy pins its upstream server ('upstream:'), which only the MCP "
                           f"gateway can check; it is refused here (upstream_unverified)",
                           reason=upstream_pins.UNVERIFIED, action_id=action.action_id)
    effect_key, named, problem = None, {"task": None, "hop": None}, None
    try:
        effect_key = _effect_key(plan, effect, action)
    except EffectKeyError as exc:
        problem = exc, {"effect": effect.text if effect else None}
    for what, template in (("task", plan.task), ("hop", plan.hop)):
        if problem is None and template is not None:
            try:
                named[what] = _task(template, action)
            except EffectKeyError as exc:
                problem = exc, {what: template.text}
    if problem is not None:
        exc, template = problem
        call = store.Call(action, Decision.DENY, "effect_key_error", policy.hash, None,
                          policy_version=policy.version, origin=origin)
        if policy.observing:  # observe mode refuses nothing: it runs, with no key to take, and says why
            logger.warning("%s: %s; enforcing, this call would be denied (effect_key_error)", plan.name, exc)
            unkeyed = _Running(control, plan, policy, action, None, invoke, awaitable, origin=origin)
            return (yield from unkeyed.observe(call, presented_approval(), None, with_policy=False))
        yield Record(store.record_denial, (call, {"reason": "effect_key_error", **template, "error": str(exc)}),
                     {"with_policy": False})
        raise exc
    run = _Running(control, plan, policy, action, effect_key, invoke, awaitable, named["task"], named["hop"],
                   origin=origin)
    return (yield from run.decide_and_run(presented_approval()))


def _no_principal(name: str) -> ActionDenied:
    logger.warning("%s refused: no principal (wrap the call in ctrlrun.context(agent=...))", name)
    return ActionDenied(f"{name}: no principal is available; wrap the call in 'with ctrlrun.context(agent=...)' "
                        f"naming the agent that acts, or give the Control an identity provider that answers",
                        reason="no_principal")


def _identified(control: Runtime, name: str, policy: Any, provider: Any, asserted: Principal | None,
                headers: Mapping[str, str] | None) -> Steps:
    """The principal under an identity provider (the resolution table in ``ctrlrun.identity``)."""
    asked = IdentityContext(action=name, environment=policy.environment, headers=headers or {},
                            agent=asserted.agent if asserted else None, user=asserted.user if asserted else None)
    try:
        answer = answer_of(provider, name, (yield Consult(provider.resolve, asked)))
    except IdentityError:
        raise
    except Exception as exc:  # noqa: BLE001 - a provider's failure refuses the call, never falls back
        raise wrapped(provider, name, exc) from exc
    if answer is None:
        if policy.authority is not None or asserted is None:  # a grant is only worth a resolved identity
            raise _no_principal(name)
        return asserted
    if asserted is not None and (asserted.agent, asserted.user) != (answer.agent, answer.user):
        _warn_once("identity", "", "%s: the identity provider says %r/%r and ctrlrun.context() says %r/%r; the "
                   "provider's principal acts", name, answer.agent, answer.user, asserted.agent, asserted.user,
                   scope=control)
    return answer


@dataclass(frozen=True)
class _Running:
    """The parts of one call fixed once its action is known."""

    control: Runtime
    plan: Plan
    policy: Any
    action: Action
    effect_key: str | None
    invoke: Callable[[Action], Any]
    awaitable: bool
    task: str | None = None
    hop: str | None = None
    #: Where the call came from (``context.call_origin``), for its ACTION_PROPOSED event.
    origin: Mapping[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.plan.name

    def judge_authority(self) -> Steps:
        """Authority (policy v3), before the policy: the grant that lets this principal propose the
        call, or an ``AuthorityDenied`` (recorded; in observe mode the call runs, said denied)."""
        authority = self.policy.authority
        if authority.delegates or self.hop is not None:  # the delegations and the store's time: one phase
            now, delegations = yield Phase(_delegations_and_now, (self.control.store, self.action.principal.agent,
                                                                  self.hop))
            return authority.evaluate(self.action, now=now, task=self.task, delegations=delegations, hop=self.hop)
        now = (yield Phase(self.control.store.now)) if authority.has_expiry else None
        return authority.evaluate(self.action, now=now, task=self.task)

    @property
    def max_attempts(self) -> int | None:
        """The policy's attempt ceiling for this action (v5), when it can apply (a keyed call)."""
        entry = self.policy.entry(self.name)
        ceiling = entry.max_attempts if entry is not None else None
        if ceiling is not None and self.effect_key is None:
            _warn_once("ceiling", self.name, "%s has max_attempts %s but no effect key, so attempts cannot be "
                       "counted and the ceiling never applies", self.name, ceiling, scope=self.control)
            return None
        return ceiling

    def decide_and_run(self, presented: str | None) -> Steps:
        store = self.control.store
        judged, charges = None, ()
        yield from approved.gate(self, presented)  # require_approved_policy (§D7), before authority
        if self.policy.authority is not None:
            judged = yield from self.judge_authority()
            if not judged.passed:
                return (yield from self.refuse_authority(judged, presented))
        evaluation = self.policy.evaluate(self.name, self.action.arguments)
        call = store.Call(self.action, evaluation.decision, evaluation.reason, self.policy.hash, self.effect_key,
                          controls=evaluation.controls, policy_version=self.policy.version,
                          authority=judged.event_data() if judged is not None else None, task=self.task,
                          hop=self.hop,
                          delegations=_delegations_of(judged), origin=self.origin)
        if evaluation.decision is Decision.APPROVE:
            entry = self.policy.entry(self.name)
            call = replace(call, required_roles=required_roles(self.policy, evaluation.controls),
                           approvals_required=entry.approvals_required if entry is not None else 1)
        ceiling = self.max_attempts
        unmeasured = None
        if judged is not None and evaluation.decision is not Decision.DENY:
            charges, problem = self.charges(judged)
            if problem is not None:
                unmeasured, error = problem
                if not self.policy.observing:
                    yield Record(store.record_denial, (replace(call, approval_id=presented),
                                                       {"reason": unmeasured, "error": error}))
                    raise BudgetRefused(f"{self.name}: {error}", reason=unmeasured)
            call = replace(call, budget_charges=charges)
        if self.policy.observing:
            return (yield from self.observe(call, presented, ceiling, unmeasured=unmeasured))
        if evaluation.decision is Decision.DENY:
            yield Record(store.record_denial, (replace(call, approval_id=presented), {"reason": evaluation.reason}))
            raise ActionDenied(_denial_message(self.name, evaluation.reason), reason=evaluation.reason,
                               action_id=self.action.action_id)
        if evaluation.decision is Decision.APPROVE and presented is None:
            if ceiling is not None:  # the ceiling's fast path: nobody is asked about a call that cannot run
                refused = yield Phase(store.check_ceiling, (call, ceiling))
                if refused is not None:
                    raise refused.error
            if call.approvals_required > 1 and not self.control.verifies_approvers():
                yield Record(store.record_denial, (call, {"reason": "approvals_unverifiable"}))
                raise ActionDenied(
                    f"{self.name} denied: approvals_unverifiable (it needs {call.approvals_required} verified "
                    f"approvers, and nothing here verifies who answers: install ctrlrun's console (the Django "
                    f"admin) or give the Control an approver_identity)",
                    reason="approvals_unverifiable", action_id=self.action.action_id)
            if self.plan.preconditions is not None:  # the state the person will see, fingerprinted
                digest, problem = yield from self.read_preconditions()
                if problem is not None:
                    reason = "precondition_unavailable"
                    yield Record(store.record_denial, (call, {"reason": reason, "error": problem}))
                    raise ActionDenied(f"{self.name} denied: {reason}: {problem}; no approval was requested",
                                       reason=reason, action_id=self.action.action_id)
                call = replace(call, precondition_at_request=digest)
            request = yield Phase(self.control.request_approval, (call,))
            if self.plan.wait:
                return (yield from self.wait_then_run(request))
            raise ApprovalRequired(
                messages.approval_required(self.name, request.approval_id),
                request_id=request.approval_id, action_id=self.action.action_id,
            )
        return (yield from self.take_and_run(call, presented, ceiling))

    def refuse_authority(self, judged: Any, presented: str | None) -> Steps:
        store = self.control.store
        call = store.Call(self.action, Decision.DENY, judged.reason, self.policy.hash, self.effect_key,
                          policy_version=self.policy.version, authority=judged.event_data(), task=self.task,
                          hop=self.hop, origin=self.origin)
        if self.policy.observing:
            return (yield from self.observe(call, presented, None, with_policy=False))
        yield Record(store.record_denial, (replace(call, approval_id=presented), {"reason": judged.reason}),
                     {"with_policy": False})
        kind = "delegation" if judged.delegation_id else "grant"
        about = f" ({kind} {judged.grant_id!r})" if judged.grant_id else ""
        if judged.reason == "authority_hop":
            dimension = (judged.details or {}).get("dimension")
            about += (f": the hop does not cover this call ({dimension})" if dimension else
                      ": no such hop") + f"; see 'ctrlrun inspect --hop {self.hop}'"
        raise AuthorityDenied(f"{self.name} denied: {judged.reason}{about}", reason=judged.reason,
                              grant_id=judged.grant_id, delegation_id=judged.delegation_id,
                              action_id=self.action.action_id)

    def charges(self, judged: Any) -> tuple[tuple[Any, ...], tuple[str, str] | None]:
        """What this call charges the deciding grant's budgets, or why it cannot be charged."""
        costs = self.policy.authority.charges(judged, self.action.arguments)
        if not costs:
            return (), None
        if self.effect_key is None:
            return (), ("budget_unkeyed", f"grant {judged.grant_id!r} has budgets, and a budget is charged to an "
                                          f"effect key, but this action has none: give it one (effect=...)")
        for _grant_id, _budget, cost in costs:
            if isinstance(cost, str):
                return (), ("budget_unmeasurable", cost)
        Charge = self.control.store.Charge
        return tuple(Charge(grant_id, budget.metric, cost, budget.limit, budget.window_seconds)
                     for grant_id, budget, cost in costs), None

    def wait_then_run(self, request: Any) -> Steps:
        """``wait=True``: pause until a person answers or the request expires, then run under it."""
        current, now = request, None
        while True:
            current, now = yield Phase(self.control.approval_state, (request.approval_id, current))
            if current.status != "pending" or now >= current.expires_at:
                break
            yield Pause(self.control.poll_interval)
        if current.status in ("pending", "expired") or (current.status == "granted" and now >= current.expires_at):
            yield Record(self.control.store.expire_if_due, (request.approval_id,))
            raise ApprovalTimeout(
                f"approval request {request.approval_id} for {self.name} was not answered before it expired at "
                f"{evidence_time(current.expires_at)}; the call did not run. Ask again",
                request_id=request.approval_id,
            )
        # The same action, now under the person's answer (a denial is refused by the store, recorded).
        return (yield from self.decide_and_run(request.approval_id))

    def scoped(self, call: Any) -> Steps:
        """Ask the scope provider (``protect(scope=...)``) before the key is taken: the call stamped
        with the hash of its answer, and why the resource is outside it (reason, sentence), or None."""
        provider = self.plan.scope
        if provider is None:
            return call, None
        try:
            answer = yield Consult(provider, self.action)
        except Exception as exc:
            return call, ("scope_unavailable", f"the scope provider raised {type(exc).__name__}: {exc}")
        patterns = answer.get("resources") if isinstance(answer, Mapping) else None
        if not isinstance(patterns, (list, tuple)) or not all(
                isinstance(p, str) and validate_pattern(p, ":") is None for p in patterns):
            return call, ("scope_unavailable", f"the scope provider must return {{'resources': [patterns]}}, got "
                                               f"{evidence_text(repr(answer))[:200]}")
        try:
            digest = sha256_hash(canonical_bytes({"schema": "ctrlrun.scope/v1", "scope": canonical_arguments(
                dict(answer))}))
        except InvalidArgument as exc:
            return call, ("scope_unavailable", f"the scope provider's answer has no canonical form: {exc}")
        call = replace(call, scope_hash=digest)
        resource = self.action.resource
        if resource is None or not any(matches(pattern, resource, ":") for pattern in patterns):
            return call, ("out_of_scope", f"{self.name}: resource {resource!r} is outside this call's scope "
                                          f"({', '.join(patterns) or 'no resources'})")
        return call, None

    def read_preconditions(self) -> Steps:
        """Ask ``protect(preconditions=...)`` for the state now: (its fingerprint, None), or (None,
        why it cannot be had: the function raised, or its answer has no fingerprint)."""
        try:
            state = yield Consult(self.plan.preconditions, self.action)
        except Exception as exc:  # the user's function: whatever it raised is the answer "unavailable"
            return None, described_failure(exc)
        try:
            return fingerprint(state), None
        except InvalidArgument as exc:
            return None, str(exc)

    def rechecked(self, call: Any, presented: str | None) -> Steps:
        """An ``approve`` call presenting an approval: the state read again just before the take, for
        the store to compare with the request's fingerprint in the take's transaction."""
        if presented is None or call.decision is not Decision.APPROVE or self.plan.preconditions is None:
            return call
        digest, problem = yield from self.read_preconditions()
        return replace(call, precondition_at_recheck=digest, precondition_problem=problem)

    def take_and_run(self, call: Any, presented: str | None, ceiling: int | None) -> Steps:
        store, plan = self.control.store, self.plan
        lease = plan.lease or self.control.lease
        call, problem = yield from self.scoped(call)
        if problem is not None:
            reason, error = problem
            yield Record(store.record_denial, (replace(call, approval_id=presented), {"reason": reason, "error": error}))
            raise ActionDenied(f"{self.name} denied: {reason}: {error}", reason=reason, action_id=self.action.action_id)
        call = yield from self.rechecked(call, presented)
        key = call.effect_key
        if key is None:
            taken = yield Phase(store.begin_unkeyed, (call, presented))
        else:
            taken = yield Phase(store.reserve, (call, lease), {
                "opening": True, "hold_ambiguous": plan.reconcile is not None, "presented": presented,
                "max_attempts": ceiling})
            if isinstance(taken, store.Refused) and not taken.final:
                assert plan.reconcile is not None
                try:
                    answer = yield Ask(plan.reconcile, key)
                    yield Record(store.record_reconciliation, (key, call.action.action_id, f"reconcile:{self.name}",
                                                              "blocking", answer), {"attempt": taken.attempt})
                except BaseException:
                    # The hook never answered, or its answer could not be recorded: the refusal the
                    # caller gets still leaves its receipt (if the store takes it).
                    yield from _best_effort(Record(store.record_refusal, (taken,)))
                    raise
                call = yield from self.rechecked(call, presented)
                taken = yield Phase(store.reserve, (call, lease), {
                    "opening": False, "hold_ambiguous": False, "presented": presented,
                    "max_attempts": ceiling})
        if isinstance(taken, store.Refused):
            raise taken.error
        return (yield from self.run(taken.call, taken.attempt, lease, held=key is not None))

    def observe(self, call: Any, presented: str | None, ceiling: int | None, *, with_policy: bool = True,
                unmeasured: str | None = None) -> Steps:
        """Observe mode (§B3): the function runs whatever enforcement would say; the receipt says
        ``observed``, what really happened (``execution``) and what would have been done
        (``would_have``). The reason is the earliest decision point that would have refused the
        call: policy, attempt ceiling, approval gate, approval, reservation. Nobody is asked."""
        store = self.control.store
        lease = self.plan.lease or self.control.lease
        call, out_of_scope = yield from self.scoped(call)
        call = yield from self.rechecked(call, presented)
        found = {"budget_problem": unmeasured, "scope_problem": out_of_scope[0] if out_of_scope else None}
        seen = yield Phase(store.observe_begin, (call, lease), {"presented": presented, "max_attempts": ceiling,
                                                                "with_policy": with_policy, **found})
        would_have = seen.would_have(presented is not None, **found)
        return (yield from self.run(seen.call, seen.attempt, lease, held=seen.held, would_have=would_have))

    def run(self, call: Any, attempt: int, lease: dt.timedelta, *, held: bool,
            would_have: dict[str, Any] | None = None) -> Steps:
        """Run the function for ``attempt`` (holding the effect key when ``held``) and record how it ended."""
        try:
            value = yield Run(self.invoke, call.action, self.awaitable, call if held else None, attempt, lease,
                              call.effect_key)
        except Abandoned:
            if not held:  # no record, no lease, no sweeper: its outcome is recorded here
                yield from self.finish(call, attempt, Result.AMBIGUOUS, CANCELLED_WHILE_RUNNING, None, None,
                                       held=held, would_have=would_have)
            raise  # keyed: held; its lease lapses and the sweeper marks it ambiguous, as for a worker that died
        except NotExecuted as exc:
            yield from self.finish(call, attempt, Result.FAILED, evidence_text(str(exc)), None, exc, held=held,
                                   would_have=would_have)
            raise
        except Suspended as exc:
            if not held or would_have is not None or not isinstance(exc.continuation, (str, bytes)) \
                    or not exc.continuation:
                problem = (f"{self.name}: Suspended needs a held effect key and a non-empty str or bytes "
                           f"continuation; the call is recorded ambiguous")
                yield from self.finish(call, attempt, Result.AMBIGUOUS, problem, None, exc, held=held,
                                       would_have=would_have)
                raise InvalidArgument(problem) from exc
            # Held: no outcome, no receipt; the key stays executing until a resume or its lapse (spec A5).
            exc.round = yield Record(self.control.store.hold_continuation, (
                call, attempt, exc.continuation, self.control.suspend_timeout))
            exc.effect_key = call.effect_key
            raise
        except BaseException as exc:
            yield from self.finish(call, attempt, Result.AMBIGUOUS, evidence_text(f"{type(exc).__name__}: {exc}"),
                                   None, exc, held=held, would_have=would_have)
            raise
        unrun = _not_a_result(value)
        if unrun is not None:
            result, problem = unrun
            problem = f"{self.name}: {problem}"
            yield from self.finish(call, attempt, result, problem, None, None, held=held, would_have=would_have)
            raise InvalidArgument(problem)
        yield from self.finish(call, attempt, Result.COMMITTED, None, value, None, held=held, would_have=would_have)
        return value

    def finish(self, call: Any, attempt: int, result: Result, error: str | None, value: Any,
               exc: BaseException | None, *, held: bool, would_have: dict[str, Any] | None) -> Steps:
        """Record the outcome; raise the store's refusal where the caller must not see success."""
        store, plan = self.control.store, self.plan
        key = call.effect_key
        eager = (result is Result.AMBIGUOUS and key is not None and held and plan.reconcile_eagerly
                 and isinstance(exc, Exception))
        try:
            written = yield Record(store.record_outcome, (call, attempt, result), {
                "error": error, "value": value, "write_receipt": not eager, "would_have": would_have,
                "held": held})
        except Exception as failure:  # the database, or anything else: the outcome is not recorded
            if result is Result.AMBIGUOUS:
                logger.error("%s: the ambiguous outcome of %s could not be recorded; %s", self.name, key or "the call",
                             "the lease will lapse and the sweeper will mark it (and write its receipt)" if key else
                             "its opening events are recorded, its receipt is not", exc_info=True)
                return  # the caller gets the function's own exception
            # Never report success (or a clean failure) that was not recorded.
            raise store.StoreUnavailable(
                f"{self.name} ran, but its outcome could not be recorded ({failure.__cause__ or failure}). Treat it as "
                f"ambiguous: {'effect ' + repr(key) + ' stays held until its lease lapses, then ' if key else ''}"
                f"{messages.command('reconcile')} marks it ambiguous and asks the remote; do not retry blindly"
            ) from failure
        if not written.accepted:
            # (Observe mode refuses nothing: the caller gets what its function gave, as without ctrlrun;
            # the receipt says the outcome could not be recorded on the row.)
            if result is not Result.AMBIGUOUS and would_have is None:
                raise written.refusal  # type: ignore[misc]
            return
        if eager:
            assert key is not None and plan.reconcile is not None
            try:
                answer = yield Ask(plan.reconcile, key)
                yield Record(store.record_reconciliation, (key, call.action.action_id, f"reconcile:{self.name}",
                                                          "eager", answer),
                            {"attempt": attempt, "receipt_for": call, "receipt_attempt": attempt,
                             "receipt_error": error, "receipt_would_have": would_have})
            except Exception:
                # The ambiguous outcome is recorded; only the hook's answer is not. The call still gets its
                # receipt, and the caller the function's own exception.
                logger.error("%s: the eager reconcile of %s could not be recorded; it stays ambiguous", self.name,
                             key, exc_info=True)
                yield from _best_effort(Record(store.write_ambiguous_receipt, (call, attempt, error or "", would_have)))
            except BaseException:
                yield from _best_effort(Record(store.write_ambiguous_receipt, (call, attempt, error or "", would_have)))
                raise


#: What an attempt whose async function was cut off by a cancellation left unknown.
CANCELLED_WHILE_RUNNING = "cancelled while the function ran: part of it may have happened"


def _not_a_result(value: Any) -> tuple[Result, str] | None:
    """A returned value that is not the function's result but a promise of it - (how to record it,
    why), else None. Nothing of an unstarted coroutine or generator has run (``failed``); a started
    one, or another awaitable (a Task, a Future), may be running now (``ambiguous``)."""
    if inspect.iscoroutine(value):
        started = inspect.getcoroutinestate(value) != inspect.CORO_CREATED
    elif inspect.isgenerator(value):
        started = inspect.getgeneratorstate(value) != inspect.GEN_CREATED
    elif inspect.isasyncgen(value):  # (inspect.getasyncgenstate is 3.12's): a fresh one is at offset 0
        started = value.ag_running or value.ag_frame is None or value.ag_frame.f_lasti > 0
    elif inspect.isawaitable(value):
        started = True
    else:
        return None
    if not started and not inspect.isasyncgen(value):
        value.close()  # closed unrun: nothing of its body will ever run
    kind = "an awaitable" if inspect.isawaitable(value) else "a generator"
    advice = ("protect the async function itself, or run it to completion inside a synchronous one"
              if inspect.isawaitable(value) else "return the result, not a generator of it")
    if started:
        return Result.AMBIGUOUS, (f"the protected function returned {kind} ({type(value).__name__}) that may be "
                                  f"running now, not a result; {advice}")
    return Result.FAILED, (f"the protected function returned {kind} ({type(value).__name__}), so its body never "
                           f"ran here; {advice}")


def _delegations_and_now(store: Any, agent: str, hop: str | None) -> tuple[dt.datetime, list[Any]]:
    """The store's time and the delegations that can apply to this call (its agent's, the hop it
    presents, and their ancestors: one indexed read), for authority to walk."""
    return store.now(), store.delegations_for(agent, hop)


def _best_effort(phase: Phase) -> Steps:
    """Write evidence on a path that is already failing: a second failure is logged, never raised over
    the first."""
    try:
        yield phase
    except Exception:
        logger.error("ctrlrun could not write the evidence of a failing call", exc_info=True)


from . import approved  # noqa: E402 - the gate is written as steps over this module's instructions
