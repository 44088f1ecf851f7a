"""The decorated function: a protected function's signature checked once, its calls bound and
handed to a driver (``drive.run_sync`` for a plain function, ``drive.run_async`` for an ``async def``).

``guarded(plan, ...)`` is what ``ctrlrun.protect`` and ``Control.protect`` return. It knows the
Control only through the ``Runtime`` protocol and a function that returns it at each call (for
``protect`` without ``control=``, ``default_control``: the default Control is found when a call is
made, so settings read later still count).
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from ..canonical import canonical_arguments
from ..errors import InvalidArgument
from . import drive
from .plans import check_placeholders
from .runtime import Runtime
from .steps import Plan, call_steps

__all__ = ["guarded"]

F = TypeVar("F", bound=Callable[..., Any])
#: The container types of canonical arguments (what a function could mutate in place).
_CONTAINERS = (dict, list)


def guarded(plan: Plan, *, runtime: Callable[[], Runtime], hooks: dict[str, Callable[[str], Any]],
            policy: Any) -> Callable[[F], F]:
    """The decorator for one planned action: ``runtime()`` is the Control each call runs under;
    ``hooks`` the registry its reconcile hook joins; ``policy`` the policy already in memory, if any
    (the templates' placeholders are checked against the function now)."""
    name, reconcile = plan.name, plan.reconcile

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
        check_placeholders(plan, signature, fn.__name__, policy)
        if reconcile is not None:
            hooks[name] = reconcile
        guard = _Guard(plan, fn, signature, tuple(positional_only), runtime)
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
                 positional_only: tuple[str, ...], runtime: Callable[[], Runtime]) -> None:
        self.plan, self.fn, self.signature, self.positional_only = plan, fn, signature, positional_only
        self._runtime = runtime

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def control(self) -> Runtime:
        return self._runtime()

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
