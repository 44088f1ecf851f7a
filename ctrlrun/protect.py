"""The decorator and the steps of one protected call.

Design
------
``protect`` validates everything it can when the function is decorated (templates, lease,
hook, signature), so a wiring mistake fails at import, not in production. Each call then:

1. finds the principal (``context()``) - none means ``ActionDenied(no_principal)``, nothing
   recorded;
2. loads the runtime once per process (Django configured, policy read, policy row stored);
3. binds the arguments to names (defaults applied), canonicalises them, builds the Action and
   renders the effect key (a template error is recorded and raised as ``EffectKeyError``);
4. evaluates the policy (pure) and then, through ``store``:
   deny -> recorded, ``ActionDenied``; allow -> reserve the key (one transaction), run the
   function with no transaction open, record the outcome (one transaction).

A refused reservation that meets an AMBIGUOUS record asks the reconcile hook first (the
*blocking* trigger) and takes the key once more if the hook moved the record. With
``reconcile_eagerly=True`` the hook is asked right after this call's own ambiguous outcome.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from . import conf, heartbeat
from .canonical import (
    Action,
    Principal,
    Template,
    canonical_arguments,
    evidence_text,
    evidence_time,
    idempotency_token_for,
)
from .errors import ActionDenied, ApprovalRequired, ApprovalTimeout, EffectKeyError, InvalidArgument, NotExecuted
from .policy import Policy, load_policy
from .states import RECONCILE_ANSWERS, Decision, Result

logger = logging.getLogger("ctrlrun")

__all__ = ["protect", "context", "with_approval", "idempotency_token", "hook_for", "registered_actions", "reset_runtime",
           "call_hook"]

F = TypeVar("F", bound=Callable[..., Any])

_principal: ContextVar[Principal | None] = ContextVar("ctrlrun_principal", default=None)
_current_attempt: ContextVar[tuple[str, int] | None] = ContextVar("ctrlrun_attempt", default=None)
_approval: ContextVar[str | None] = ContextVar("ctrlrun_approval", default=None)


# --------------------------------------------------------------------------- context


@contextlib.contextmanager
def context(agent: str, user: str | None = None) -> Iterator[Principal]:
    """Name who acts for the protected calls inside the block (nested blocks override)."""
    principal = Principal(agent=agent, user=user)
    token = _principal.set(principal)
    try:
        yield principal
    finally:
        _principal.reset(token)


@contextlib.contextmanager
def with_approval(request_id: str) -> Iterator[str]:
    """Present a human's approval for the protected calls inside the block.

    The approval authorises exactly the action the human read (its hash), once.
    """
    if not isinstance(request_id, str) or not request_id.strip():
        raise InvalidArgument("with_approval() needs the approval request id (apr_...) a human answered")
    token = _approval.set(request_id.strip())
    try:
        yield request_id
    finally:
        _approval.reset(token)


def idempotency_token(per_attempt: bool = False) -> str:
    """A UUID for this call's effect key, to hand to the remote's idempotency header.

    It is the same for every attempt at one effect key (a deliberate departure from the
    reference): if a worker frozen past its lease wakes and calls the remote after a retry already
    did, a remote that dedupes on the token (Stripe, most payment and email APIs) treats the late
    call as a replay of the first. ``per_attempt=True`` gives the reference's value, which changes
    with each attempt (for a remote that keeps a failed request's answer under its key).
    """
    current = _current_attempt.get()
    if current is None:
        raise InvalidArgument(
            "idempotency_token() is defined only inside an executor running under an effect key: call it "
            "from the body of a protected function that has effect=..."
        )
    key, attempt = current
    return idempotency_token_for(key, attempt) if per_attempt else idempotency_token_for(key)


# --------------------------------------------------------------------------- runtime


@dataclass(frozen=True)
class Runtime:
    policy: Policy
    lease: dt.timedelta


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def runtime() -> Runtime:
    """The process-wide runtime, built on the first protected call and then kept."""
    global _runtime
    if _runtime is not None:
        return _runtime
    with _runtime_lock:
        if _runtime is None:
            from . import standalone

            # The policy first: a call in a folder with no (or a broken) policy creates nothing.
            standalone.configure_settings()
            policy = load_policy(conf.policy_path(), environment=conf.environment())
            standalone.ensure_ready()
            from . import store

            store.ensure_policy(policy.hash, policy.schema, policy.source, policy.text, policy.environment)
            _runtime = Runtime(policy=policy, lease=conf.lease())
    return _runtime


def reset_runtime() -> None:
    """Forget the loaded policy and what the store remembers of it (tests, or new settings)."""
    global _runtime
    _runtime = None
    from django.apps import apps

    if apps.ready:
        from . import store

        store.forget_known_policies()


# --------------------------------------------------------------------------- hooks

_hooks: dict[str, Callable[[str], Any]] = {}


def hook_for(action: str) -> Callable[[str], Any] | None:
    """The reconcile hook registered by a protected function of that action, if any."""
    return _hooks.get(action)


def registered_actions() -> list[str]:
    return sorted(_hooks)


def call_hook(hook: Callable[[str], Any], effect_key: str) -> Any:
    """Ask a hook; an Exception or an answer outside the three becomes a recorded 'unknown'."""
    from .store import HookAnswer

    started = time.monotonic()
    try:
        answer = hook(effect_key)
    except Exception as exc:
        logger.warning("reconcile hook for %s raised %s: %s", effect_key, type(exc).__name__, exc)
        return HookAnswer("unknown", "raised", evidence_text(f"{type(exc).__name__}: {exc}"),
                          time.monotonic() - started)
    if isinstance(answer, str) and answer in RECONCILE_ANSWERS:
        return HookAnswer(answer, duration=time.monotonic() - started)
    logger.warning("reconcile hook for %s returned %r, not one of %s", effect_key, answer, sorted(RECONCILE_ANSWERS))
    return HookAnswer("unknown", "invalid_return", evidence_text(repr(answer)), time.monotonic() - started)


# --------------------------------------------------------------------------- decorator


def _template(value: Any, what: str, name: str) -> Template | None:
    if value is None:
        return None
    try:
        return Template.parse(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"protect({name!r}, {what}=...): {exc}") from None


def protect(
    name: str,
    *,
    effect: str | None = None,
    resource: str | None = None,
    lease: dt.timedelta | None = None,
    reconcile: Callable[[str], Any] | None = None,
    reconcile_eagerly: bool = False,
    wait: bool = False,
) -> Callable[[F], F]:
    """Guard a function that acts on the world: the policy decides, the effect key dedupes.

    ``effect`` and ``resource`` are templates over the function's arguments
    (``"refund:{payment_id}"``) and override the policy entry's. ``reconcile`` is a function of
    the effect key answering ``"committed"``, ``"not_executed"`` or ``"unknown"``. With
    ``wait=True`` an ``approve`` decision blocks until a human answers (or the request expires,
    ``ApprovalTimeout``), then runs the same action under that approval.
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument("protect(name=...) must be a non-empty action name")
    effect_template = _template(effect, "effect", name)
    if effect_template is not None and effect_template.text.startswith("policy:"):
        raise InvalidArgument(f"protect({name!r}, effect=...): effect keys starting 'policy:' are reserved")
    resource_template = _template(resource, "resource", name)
    if lease is not None:
        if not isinstance(lease, dt.timedelta):
            raise InvalidArgument(f"protect({name!r}, lease=...): lease must be a timedelta, not {type(lease).__name__}")
        if lease <= dt.timedelta(0):
            raise InvalidArgument(f"protect({name!r}, lease=...): lease must be positive, got {lease}")
    if reconcile is not None and not callable(reconcile):
        raise InvalidArgument(
            f"protect({name!r}, reconcile=...): reconcile must be callable (a function of the effect key), "
            f"not {type(reconcile).__name__}"
        )
    if not isinstance(reconcile_eagerly, bool):
        raise InvalidArgument(f"protect({name!r}, reconcile_eagerly=...) must be True or False")
    if not isinstance(wait, bool):
        raise InvalidArgument(f"protect({name!r}, wait=...) must be True or False")
    if reconcile_eagerly and reconcile is None:
        raise InvalidArgument(f"protect({name!r}, reconcile_eagerly=True): there is no reconcile= hook to run eagerly")

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise InvalidArgument(
                f"protect({name!r}): a protected function must be synchronous for now, and "
                f"{fn.__qualname__} is an 'async def'. Protect a synchronous wrapper and run it with "
                f"asyncio.to_thread()"
            )
        if inspect.isgeneratorfunction(fn):
            raise InvalidArgument(f"protect({name!r}): {fn.__qualname__} is a generator; protect a plain function")
        signature = inspect.signature(fn)
        positional_only = []
        for parameter in signature.parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise InvalidArgument(
                    f"protect({name!r}): {fn.__qualname__} takes *{parameter.name}; a protected function needs "
                    f"named parameters, so every argument is visible to the policy"
                )
            if parameter.name == "data_scope":
                raise InvalidArgument(f"protect({name!r}): 'data_scope' is reserved and cannot be a parameter name")
            if parameter.kind is parameter.POSITIONAL_ONLY:
                positional_only.append(parameter.name)
        if reconcile is not None:
            _hooks[name] = reconcile
        guard = _Guard(name, fn, signature, tuple(positional_only), effect_template, resource_template, lease,
                       reconcile, reconcile_eagerly, wait)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return guard(args, kwargs)

        wrapper.__ctrlrun__ = guard  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


_warned: set[tuple[str, str]] = set()


def _warn_once(kind: str, name: str, message: str, *args: Any) -> None:
    if (kind, name) not in _warned:
        _warned.add((kind, name))
        logger.warning(message, *args)


@dataclass(frozen=True)
class _Guard:
    """One protected function: its wiring, and the steps of each call."""

    name: str
    fn: Callable[..., Any]
    signature: inspect.Signature
    positional_only: tuple[str, ...]
    effect: Template | None
    resource: Template | None
    lease: dt.timedelta | None
    reconcile: Callable[[str], Any] | None
    reconcile_eagerly: bool
    wait: bool

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        principal = _principal.get()
        if principal is None:
            logger.warning("%s refused: no principal (wrap the call in ctrlrun.context(agent=...))", self.name)
            raise ActionDenied(
                f"{self.name}: no principal is available; wrap the call in 'with ctrlrun.context(agent=...)' "
                f"naming the agent that acts",
                reason="no_principal",
            )
        rt = runtime()
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        # Keys and the hash come from the same canonical values: Color.RED and "red" are one key.
        arguments = canonical_arguments(bound.arguments)
        entry = rt.policy.entry(self.name)
        effect = self._choose("effect", self.effect, entry.effect if entry else None)
        resource_tpl = self._choose("resource", self.resource, entry.resource if entry else None)
        resource = resource_tpl.render(arguments, error=InvalidArgument) if resource_tpl else None
        action = Action(self.name, arguments, principal, resource=resource, environment=rt.policy.environment)
        from . import store

        try:
            effect_key = self._effect_key(effect, action)
        except EffectKeyError as exc:
            call = store.Call(action, Decision.DENY, "effect_key_error", rt.policy.hash, None)
            store.record_denial(call, {"reason": "effect_key_error", "effect": effect.text if effect else None,
                                       "error": str(exc)}, with_policy=False)
            raise
        return self._decide_and_run(rt, action, effect_key)

    def _decide_and_run(self, rt: Runtime, action: Action, effect_key: str | None) -> Any:
        from . import store

        presented = _approval.get()
        evaluation = rt.policy.evaluate(self.name, action.arguments)
        call = store.Call(action, evaluation.decision, evaluation.reason, rt.policy.hash, effect_key)
        if evaluation.decision is Decision.DENY:
            call = replace(call, approval_id=presented)
            store.record_denial(call, {"reason": evaluation.reason})
            raise ActionDenied(self._denial_message(evaluation.reason), reason=evaluation.reason,
                               action_id=action.action_id)
        if evaluation.decision is Decision.APPROVE and presented is None:
            request = store.request_approval(call, conf.approval_ttl())
            if self.wait:
                return self._wait_then_run(rt, action, effect_key, request)
            raise ApprovalRequired(
                f"{self.name} requires approval: run 'ctrlrun approve {request.approval_id}' (or "
                f"'python manage.py approve {request.approval_id}'), then retry inside "
                f"ctrlrun.with_approval('{request.approval_id}')",
                request_id=request.approval_id, action_id=action.action_id,
            )
        return self._run(call, rt, presented)

    def _wait_then_run(self, rt: Runtime, action: Action, effect_key: str | None, request: Any) -> Any:
        """``wait=True``: poll until a human answers or the request expires, then run under it."""
        from . import store

        poll = conf.approval_poll().total_seconds()
        current = request
        while current.status == "pending" and store.now() < current.expires_at:
            time.sleep(poll)
            current = store.get_approval(request.approval_id) or current
        if current.status in ("pending", "expired") or (current.status == "granted" and store.now() >= current.expires_at):
            store.expire_if_due(request.approval_id)
            raise ApprovalTimeout(
                f"approval request {request.approval_id} for {self.name} was not answered before it expired at "
                f"{evidence_time(current.expires_at)}; the call did not run. Ask again",
                request_id=request.approval_id,
            )
        with with_approval(request.approval_id):  # the same action, now under the human's answer
            return self._decide_and_run(rt, action, effect_key)

    def _choose(self, what: str, mine: Template | None, policy: Template | None) -> Template | None:
        if mine is not None and policy is not None and mine.text != policy.text:
            _warn_once(what, self.name, "%s: protect(%s=%r) overrides the policy's %r", self.name, what,
                       mine.text, policy.text)
        return mine or policy

    def _effect_key(self, effect: Template | None, action: Action) -> str | None:
        if effect is None:
            if self.reconcile is not None:
                _warn_once("unkeyed", self.name, "%s has a reconcile hook but no effect key; the hook is never called",
                           self.name)
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
        if key.startswith("policy:"):
            raise EffectKeyError(f"{effect.text!r} renders {key!r}; effect keys starting 'policy:' are reserved")
        return key

    def _denial_message(self, reason: str) -> str:
        if reason == "unknown_action":
            return (f"{self.name} denied: unknown_action (the policy has no entry for {self.name!r}; add one "
                    f"under 'actions:' to let it run)")
        return f"{self.name} denied: {reason}"

    def _invoke(self, action: Action) -> Any:
        arguments = canonical_arguments(action.arguments)  # a fresh copy the function may mutate
        positional = [arguments.pop(n) for n in self.positional_only]
        return self.fn(*positional, **arguments)

    def _run(self, call: Any, rt: Runtime, presented: str | None) -> Any:
        from . import store

        lease = self.lease or rt.lease
        key = call.effect_key
        if key is None:
            taken = store.begin_unkeyed(call, presented)
        else:
            taken = store.reserve(call, lease, opening=True, hold_ambiguous=self.reconcile is not None,
                                  presented=presented)
            if isinstance(taken, store.Refused) and not taken.final:
                assert self.reconcile is not None
                try:
                    answer = call_hook(self.reconcile, key)
                    store.record_reconciliation(key, call.action.action_id, f"reconcile:{self.name}", "blocking",
                                                answer, attempt=taken.attempt)
                except BaseException:
                    # The hook never answered, or its answer could not be recorded: the refusal the
                    # caller gets still leaves its receipt (if the store takes it).
                    _best_effort(store.record_refusal, taken)
                    raise
                taken = store.reserve(call, lease, opening=False, hold_ambiguous=False, presented=presented)
        if isinstance(taken, store.Refused):
            raise taken.error
        call, attempt = taken.call, taken.attempt

        token = _current_attempt.set((key, attempt)) if key is not None else None
        renewing = heartbeat.hold(call, attempt, lease) if key is not None else None
        try:
            try:
                value = self._invoke(call.action)
            finally:
                if renewing is not None:
                    heartbeat.release(renewing)  # the moment the function is done, renewal stops
        except NotExecuted as exc:
            self._finish(call, attempt, Result.FAILED, evidence_text(str(exc)), None, exc)
            raise
        except BaseException as exc:
            self._finish(call, attempt, Result.AMBIGUOUS, evidence_text(f"{type(exc).__name__}: {exc}"), None, exc)
            raise
        finally:
            if token is not None:
                _current_attempt.reset(token)
        if inspect.isawaitable(value):
            # A synchronous wrapper around an async function: nothing of its body has run yet, and
            # "committed" would be a lie. Close it unrun, record that it did not execute, refuse.
            close = getattr(value, "close", None)
            if close is not None:
                close()
            problem = (f"{self.name}: the protected function returned an awaitable ({type(value).__name__}), so its "
                       f"body never ran here; protect the async function itself, or run it to completion inside "
                       f"a synchronous one")
            self._finish(call, attempt, Result.FAILED, problem, None, None)
            raise InvalidArgument(problem)
        self._finish(call, attempt, Result.COMMITTED, None, value, None)
        return value

    def _finish(self, call: Any, attempt: int, result: Result, error: str | None, value: Any,
                exc: BaseException | None) -> None:
        """Record the outcome; raise the store's refusal where the caller must not see success."""
        from . import store

        key = call.effect_key
        eager = (result is Result.AMBIGUOUS and key is not None and self.reconcile_eagerly
                 and isinstance(exc, Exception))
        try:
            written = store.record_outcome(call, attempt, result, error=error, value=value, write_receipt=not eager)
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
                f"'ctrlrun reconcile' marks it ambiguous and asks the remote; do not retry blindly"
            ) from failure
        if not written.accepted:
            if result is not Result.AMBIGUOUS:
                raise written.refusal  # type: ignore[misc]
            return
        if eager:
            assert key is not None and self.reconcile is not None
            try:
                answer = call_hook(self.reconcile, key)
                store.record_reconciliation(key, call.action.action_id, f"reconcile:{self.name}", "eager", answer,
                                            attempt=attempt,
                                            receipt_for=call, receipt_attempt=attempt, receipt_error=error)
            except Exception:
                # The ambiguous outcome is recorded; only the hook's answer is not. The call still gets its
                # receipt, and the caller the function's own exception (raised by _run after this).
                logger.error("%s: the eager reconcile of %s could not be recorded; it stays ambiguous", self.name,
                             key, exc_info=True)
                _best_effort(store.write_ambiguous_receipt, call, attempt, error or "")
            except BaseException:
                _best_effort(store.write_ambiguous_receipt, call, attempt, error or "")
                raise


def _best_effort(write: Callable[..., Any], *args: Any) -> None:
    """Write evidence on a path that is already failing: a second failure is logged, never raised over
    the first."""
    try:
        write(*args)
    except Exception:
        logger.error("ctrlrun could not write the evidence of a failing call", exc_info=True)
