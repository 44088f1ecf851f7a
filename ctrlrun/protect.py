"""The decorator, and the names a protected function's code uses: ``context``, ``with_approval``,
``idempotency_token``.

``protect`` validates everything it can when the function is decorated (templates, lease,
hook, signature), so a wiring mistake fails at import, not in production. A call of the
decorated function binds its arguments and hands the call's steps (``kernel.steps``) to a driver
(``kernel.drive``): the synchronous one for a plain function, the asynchronous one for an
``async def`` - the same steps either way. ``control=`` picks the ``Control`` the call runs
under; without it, the process-wide default built from settings.
"""
from __future__ import annotations

import datetime as dt
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .canonical import canonical_arguments
from .errors import InvalidArgument
from .kernel import drive
from .kernel.context import context, idempotency_token, with_approval
from .control import PROCESS_HOOKS
from .kernel.drive import call_hook
from .kernel.plans import check_placeholders, plan_for
from .kernel.steps import Plan, call_steps

__all__ = ["protect", "context", "with_approval", "idempotency_token", "hook_for", "registered_actions",
           "reset_runtime", "runtime", "call_hook", "plan_for"]

F = TypeVar("F", bound=Callable[..., Any])
#: The container types of canonical arguments (what a function could mutate in place).
_CONTAINERS = (dict, list)


# --------------------------------------------------------------------------- runtime


def runtime() -> Any:
    """The process-wide default ``Control`` (its policy loaded and stored on first use)."""
    from .control import default_control

    control = default_control()
    control.policy  # noqa: B018 - loads it: callers read runtime().policy
    return control


def reset_runtime() -> None:
    """Forget the loaded policy and what the store remembers of it (tests, or new settings)."""
    from django.apps import apps

    from .control import reset_default

    reset_default()
    if apps.ready:
        from . import store

        store.forget_known_policies()


# --------------------------------------------------------------------------- hooks


def hook_for(action: str) -> Callable[[str], Any] | None:
    """The reconcile hook registered by a protected function of that action, if any (the default
    Control's registry, ``control.PROCESS_HOOKS``)."""
    return PROCESS_HOOKS.get(action)


def registered_actions() -> list[str]:
    return sorted(PROCESS_HOOKS)


# --------------------------------------------------------------------------- decorator


def protect(
    name: str,
    *,
    effect: str | None = None,
    resource: str | None = None,
    lease: dt.timedelta | None = None,
    reconcile: Callable[[str], Any] | None = None,
    reconcile_eagerly: bool = False,
    wait: bool = False,
    task: str | None = None,
    scope: Callable[[Any], Any] | None = None,
    hop: str | None = None,
    control: Any = None,
) -> Callable[[F], F]:
    """Guard a function that acts on the world: the policy decides, the effect key dedupes.

    ``effect`` and ``resource`` are templates over the function's arguments
    (``"refund:{payment_id}"``) and override the policy entry's. ``reconcile`` is a function of
    the effect key (plain or ``async def``) answering ``"committed"``, ``"not_executed"`` or
    ``"unknown"``. With ``wait=True`` an ``approve`` decision waits until a person answers (or the
    request expires, ``ApprovalTimeout``), then runs the same action under that approval. The
    function may be ``async def``: the decorated function is then a coroutine function running
    the same steps without blocking the event loop. ``control`` is the ``ctrlrun.Control`` to
    run under (default: the process-wide one from settings). ``task`` is a template naming the job
    the call belongs to (``"run-{run_id}"``), which grants bound to tasks (policy v7) check; it is
    on the receipt, not in the action hash. ``scope`` is a function of the ``Action`` returning
    ``{"resources": [patterns]}``: the resources this call may touch now (e.g. the requesting user's
    own records); a resource outside them is refused ``out_of_scope`` before the key is taken.
    ``hop`` is a template naming the delegation (``Control.hop``) this call is made under
    (``"{hop_id}"``): then that delegation is the only grant that counts.
    """
    plan = plan_for(name, {"effect": effect, "resource": resource, "lease": lease, "reconcile": reconcile,
                           "reconcile_eagerly": reconcile_eagerly, "wait": wait, "task": task, "scope": scope, "hop": hop})
    if control is not None:
        from .control import Control

        if not isinstance(control, Control):
            raise InvalidArgument(f"protect({name!r}, control=...) must be a ctrlrun.Control, not "
                                  f"{type(control).__name__}")

    def decorate(fn: F) -> F:
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise InvalidArgument(f"protect({name!r}): {fn.__qualname__} is a generator; protect a plain function "
                                  f"(or an 'async def' that returns its result)")
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
        # The policy is checked only when it is already in memory (a Control given one): decorating
        # never reads the settings' policy file at import.
        check_placeholders(plan, signature, fn.__name__, getattr(control, "_policy", None))
        if reconcile is not None:
            (control.hooks if control is not None else PROCESS_HOOKS)[name] = reconcile
        guard = _Guard(plan, fn, signature, tuple(positional_only), control)
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await drive.run_async(guard.steps(args, kwargs, awaitable=True), guard.control)

            async_wrapper.__ctrlrun__ = guard  # type: ignore[attr-defined]
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return drive.run_sync(guard.steps(args, kwargs), guard.control)

        wrapper.__ctrlrun__ = guard  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


class _Guard:
    """One protected function: its plan, how to bind and invoke it, and its Control."""

    def __init__(self, plan: Plan, fn: Callable[..., Any], signature: inspect.Signature,
                 positional_only: tuple[str, ...], control: Any) -> None:
        self.plan, self.fn, self.signature, self.positional_only = plan, fn, signature, positional_only
        self._control = control

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def control(self) -> Any:
        if self._control is not None:
            return self._control
        from .control import default_control

        return default_control()

    def steps(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, awaitable: bool = False) -> Any:
        def bind() -> Any:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return bound.arguments

        return call_steps(self.control, self.plan, bind, self._invoke, awaitable=awaitable)

    def _invoke(self, action: Any) -> Any:
        arguments = action.arguments
        if any(type(value) in _CONTAINERS for value in arguments.values()):
            arguments = canonical_arguments(arguments)  # a fresh copy the function may mutate
        else:
            arguments = dict(arguments)  # scalars only: nothing inside the action to mutate
        positional = [arguments.pop(n) for n in self.positional_only]
        return self.fn(*positional, **arguments)
