from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ... import report, store
from ...states import EffectState
from ..base import CtrlrunCommand

STATES = [s.value for s in EffectState if s is not EffectState.NEW]


class Command(CtrlrunCommand):
    help = ("List effect records (one per effect key): state, attempt, holder, last change, and what the shown "
            "attempt spent (committed) or holds (unfinished) of its grants' budgets.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--state", choices=STATES, help="only records in this state")

    def run(self, *, state: str | None, **_: Any) -> None:
        effects = store.list_effects(state)
        if not effects:
            self.stdout.write(f"no effects are {state}" if state else "no effects yet")
            return
        now = store.now()  # the store's clock, as leases and expiries are kept
        for effect in effects:
            charges = store.charges_of(effect.effect_key, effect.attempt)  # the shown attempt's budget charges
            self.stdout.write(report.effect_line(effect, now) + store.budgets.budget_line(charges))
