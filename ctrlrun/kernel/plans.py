"""One guarded action's wiring, checked once and fixed as a :class:`~ctrlrun.kernel.steps.Plan`:
``protect``'s options and ``Control.call``'s are the same (``OPTIONS``), and a template placeholder
that names no parameter of the decorated function is refused at decoration."""
from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Mapping
from typing import Any

from ..canonical import Template
from ..errors import InvalidArgument
from ..policy.schema import POLICY_CHANGE_ACTION
from .steps import Plan

__all__ = ["OPTIONS", "plan_for", "check_placeholders"]


def _template(value: Any, what: str, name: str) -> Template | None:
    if value is None:
        return None
    try:
        return Template.parse(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"protect({name!r}, {what}=...): {exc}") from None


#: The options of one guarded action (``protect``'s, and ``Control.call``'s), with their defaults.
OPTIONS: dict[str, Any] = {"effect": None, "resource": None, "lease": None, "reconcile": None,
                           "reconcile_eagerly": False, "wait": False, "task": None, "scope": None, "hop": None,
                           "preconditions": None}


def plan_for(name: str, options: Mapping[str, Any]) -> Plan:
    """Check one guarded action's wiring (``protect``'s options) and fix it as a ``Plan``."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise InvalidArgument(f"{name!r}: unknown option(s) {', '.join(unknown)}; the options are "
                              f"{', '.join(OPTIONS)}")
    chosen = {**OPTIONS, **options}
    effect, resource, lease, reconcile = chosen["effect"], chosen["resource"], chosen["lease"], chosen["reconcile"]
    reconcile_eagerly, wait = chosen["reconcile_eagerly"], chosen["wait"]
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgument("protect(name=...) must be a non-empty action name")
    if name == POLICY_CHANGE_ACTION:
        raise InvalidArgument(f"{name!r} is reserved for ctrlrun's approved-policy flow: it cannot be protected or "
                              f"called directly; propose a policy with 'ctrlrun policy propose --file NEW.yaml'")
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
    task_template = _template(chosen["task"], "task", name)
    scope = chosen["scope"]
    if scope is not None and not callable(scope):
        raise InvalidArgument(f"protect({name!r}, scope=...) must be callable (a function of the Action returning "
                              f"{{'resources': [patterns]}}), not {type(scope).__name__}")
    preconditions = chosen["preconditions"]
    if preconditions is not None and not callable(preconditions):
        raise InvalidArgument(f"protect({name!r}, preconditions=...) must be callable (a function of the Action "
                              f"returning the state the person approving sees, e.g. {{'balance': 900}}), not "
                              f"{type(preconditions).__name__}")
    return Plan(name, effect_template, resource_template, lease, reconcile, reconcile_eagerly, wait, task_template,
                scope, _template(chosen["hop"], "hop", name), preconditions)


def _unknown_placeholder(template: Template | None, parameters: Any, *, effect: bool) -> str | None:
    """The first placeholder of ``template`` that names no parameter (``{resource}`` of an effect key
    is the call's resource), else None."""
    for placeholder in template.names if template is not None else ():
        if placeholder not in parameters and not (effect and placeholder == "resource"):
            return placeholder
    return None


def check_placeholders(plan: Plan, signature: inspect.Signature, function: str, policy: Any = None) -> None:
    """Refuse, at decoration, a template placeholder that names none of the function's parameters
    (it could never render). A function taking ``**kwargs`` may be given any name: nothing is refused.
    ``policy`` (one already in memory, never read here) has its ``effect:`` checked too, when
    ``protect`` gives none of its own."""
    parameters = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    takes = f"({function} takes {', '.join(parameters) or 'no parameters'}); a placeholder names a parameter " \
            f"of the function"
    for what in ("effect", "resource", "task", "hop"):
        template = getattr(plan, what)
        missing = _unknown_placeholder(template, parameters, effect=what == "effect")
        if missing is not None:
            raise InvalidArgument(f"protect({plan.name!r}, {what}={template.text!r}): no parameter named "
                                  f"{missing!r} {takes}")
    entry = policy.entry(plan.name) if policy is not None and plan.effect is None else None
    missing = _unknown_placeholder(entry.effect if entry is not None else None, parameters, effect=True)
    if missing is not None:
        raise InvalidArgument(f"protect({plan.name!r}): the policy's effect {entry.effect.text!r} has no parameter "
                              f"named {missing!r} {takes}")


