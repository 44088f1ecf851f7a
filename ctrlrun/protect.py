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
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import InvalidArgument
from .kernel.context import context, idempotency_token, with_approval
from .control import PROCESS_HOOKS, Control, default_control, reset_default
from .kernel.drive import call_hook
from .kernel.decorator import guarded
from .kernel.plans import plan_for

__all__ = ["protect", "context", "with_approval", "idempotency_token", "hook_for", "registered_actions",
           "reset_runtime", "runtime", "call_hook", "plan_for"]

F = TypeVar("F", bound=Callable[..., Any])


# --------------------------------------------------------------------------- runtime


def runtime() -> Any:
    """The process-wide default ``Control`` (its policy loaded and stored on first use)."""
    control = default_control()
    control.policy  # noqa: B018 - loads it: callers read runtime().policy
    return control


def reset_runtime() -> None:
    """Forget the loaded policy and what the store remembers of it (tests, or new settings)."""
    from django.apps import apps

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
    preconditions: Callable[[Any], Any] | None = None,
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
    (``"{hop_id}"``): then that delegation is the only grant that counts. ``preconditions`` is a
    function of the ``Action`` (plain or ``async def``) returning the state the person approving
    sees (``{"balance": 900}``): its fingerprint is stored on the request and must be the same when
    the approval is used (§8.6; only ``approve`` calls read it).
    """
    plan = plan_for(name, {"effect": effect, "resource": resource, "lease": lease, "reconcile": reconcile,
                           "reconcile_eagerly": reconcile_eagerly, "wait": wait, "task": task, "scope": scope,
                           "hop": hop, "preconditions": preconditions})
    if control is None:
        return guarded(plan, runtime=default_control, hooks=PROCESS_HOOKS, policy=None)
    if not isinstance(control, Control):
        raise InvalidArgument(f"protect({name!r}, control=...) must be a ctrlrun.Control, not "
                              f"{type(control).__name__}")
    return guarded(plan, runtime=lambda: control, hooks=control.hooks, policy=control.given_policy)
