"""Deferred reconciliation: sweep dead workers' records, then ask each AMBIGUOUS record's hook.

``run_once()`` is one pass and returns a :class:`Report`; the ``reconcile`` command wraps it in
an optional loop. Hooks are found without the process that made the call: importing a module
that decorates a function with ``protect(..., reconcile=hook)`` registers the hook under the
action's name. ``discover()`` imports, the way Django finds ``admin.py``, each installed app's
``tools`` module (``settings.CTRLRUN_TOOLS_MODULE``), then every module in
``settings.CTRLRUN_HOOK_MODULES``, then any module named on the command line.
"""
from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import conf, store
from .errors import InvalidArgument, PolicyError, StateConflict
from .protect import call_hook, hook_for, registered_actions

__all__ = ["Line", "Report", "discover", "ensure_discovered", "run_once", "ask", "ask_now", "is_known_action",
           "known_actions"]


@dataclass(frozen=True)
class Line:
    effect_key: str
    action: str
    outcome: str  # committed | failed | unknown | dropped | needs_human | error
    detail: str


@dataclass
class Report:
    swept: list[store.EffectView] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    #: Ambiguous records not asked in this pass: their hook gave no answer lately, and they wait in
    #: backoff until ``reconcile_after``.
    waiting: list[store.EffectView] = field(default_factory=list)
    #: The store's clock when the pass began.
    now: dt.datetime | None = None

    def count(self, outcome: str) -> int:
        return sum(1 for line in self.lines if line.outcome == outcome)

    def summary(self) -> str:
        return (
            f"swept {len(self.swept)} lapsed lease(s); asked {len(self.lines) - self.count('needs_human')} hook(s): "
            f"{self.count('committed')} committed, {self.count('failed')} failed, {self.count('unknown')} unknown, "
            f"{self.count('dropped')} dropped (the record moved meanwhile), {self.count('error')} error(s); "
            f"{self.count('needs_human')} need a human; {len(self.waiting)} waiting in backoff"
        )


def discover(modules: Iterable[str] = ()) -> list[str]:
    """Import the modules that register reconcile hooks (each app's tools module, ``CTRLRUN_HOOK_MODULES``,
    then ``modules``); return the named ones imported."""
    from .discovery import import_modules

    return import_modules("hook", [*conf.hook_modules(), *modules])


def run_once(*, action: str | None = None, limit: int | None = None, control: Any = None) -> Report:
    """One pass: lapsed leases to ambiguous, then each due ambiguous record's hook, once.

    Leases and backoffs are compared with the store's clock (the database's, on PostgreSQL). With
    ``control`` (a ``ctrlrun.Control``), the pass runs on that Control's database and clock and asks
    the hooks registered for its actions; without it, the default's.
    """
    with control.scope() if control is not None else contextlib.nullcontext():
        report = Report(swept=store.sweep_lapsed(action))
        report.now = store.now()
        # Listed before any hook is asked, so a record asked in this pass is not also listed as waiting.
        report.waiting = [e for e in store.list_effects("ambiguous")
                          if e.reconcile_after is not None and e.reconcile_after > report.now
                          and (action is None or e.action == action)]
        for effect in store.reconcile_candidates(action, limit):
            report.lines.append(ask(effect, control=control))
    return report


def ask(effect: store.EffectView, *, requested_by: str | None = None, trigger: str = "deferred",
        control: Any = None) -> Line:
    """Ask one ambiguous record's hook and apply the answer; one hook's failure stays its own.

    ``trigger`` is recorded in RECONCILIATION_STARTED: ``deferred`` for a reconcile pass,
    ``operator`` for a person's "ask the remote now" (with ``requested_by``)."""
    hook = control.hook_for(effect.action) if control is not None else hook_for(effect.action)
    if hook is None:
        return Line(effect.effect_key, effect.action, "needs_human",
                    f"no reconcile hook is registered for {effect.action} (import the module that protects it "
                    f"with --import MODULE), or resolve it by hand")
    answer = call_hook(hook, effect.effect_key)
    try:
        moved = store.record_reconciliation(effect.effect_key, effect.action_id, f"reconcile:{effect.action}",
                                            trigger, answer, attempt=effect.attempt, requested_by=requested_by)
    except Exception as exc:  # one record's trouble stays its own; the pass goes on
        return Line(effect.effect_key, effect.action, "error", f"{type(exc).__name__}: {exc}")
    if moved == "dropped":
        return Line(effect.effect_key, effect.action, "dropped",
                    f"the hook answered {answer.outcome}, but the record moved on meanwhile; the answer was not applied")
    if moved:
        return Line(effect.effect_key, effect.action, moved, f"the hook answered {answer.outcome}")
    if answer.reason:
        return Line(effect.effect_key, effect.action, "unknown",
                    f"the hook {answer.reason.replace('_', ' ')}: {answer.error}")
    return Line(effect.effect_key, effect.action, "unknown", "the hook answered unknown")


def ask_now(effect_key: str, *, requested_by: str | None = None) -> Line:
    """A person's "ask the remote now" (the console): sweep this record if its lease lapsed, then ask
    its hook, recorded as trigger ``operator``."""
    store.sweep_lapsed(effect_key=effect_key)
    effect = store.get_effect(effect_key)
    if effect is None or effect.state != "ambiguous":
        raise StateConflict("effect", effect_key, "ambiguous", effect.state if effect else "missing",
                            operation="reconcile")
    return ask(effect, requested_by=requested_by, trigger="operator")


def _policy_actions() -> tuple[list[str], str | None]:
    """The actions the policy names, and why there are none if it could not be read."""
    from .control import default_control

    try:
        return sorted(default_control().read_policy().actions), None
    except (PolicyError, InvalidArgument) as exc:
        return [], f"the policy could not be read ({' '.join(str(exc).split())[:200]})"


def is_known_action(action: str) -> bool:
    """Whether ``action`` is named by the policy, has a registered hook, or has an effect record."""
    if action in registered_actions() or action in _policy_actions()[0]:
        return True
    return store.action_recorded(action)


def known_actions() -> tuple[list[str], str | None]:
    """Every action the policy names, a hook is registered for, or an effect record holds (sorted),
    and a note when the policy could not be read."""
    named, note = _policy_actions()
    return sorted({*named, *registered_actions(), *store.recorded_actions()}), note


_discovered = False


def ensure_discovered() -> None:
    """Import the hook modules once per process (the console's web workers)."""
    global _discovered
    if not _discovered:
        discover()
        _discovered = True
