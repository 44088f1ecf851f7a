from __future__ import annotations

import math
import time
from argparse import ArgumentParser
from typing import Any

from ... import reconcile
from ..base import CtrlrunCommand, Error, positive_int


class Command(CtrlrunCommand):
    help = (
        "Deferred reconciliation: move effects whose worker's lease lapsed to AMBIGUOUS, then ask each "
        "AMBIGUOUS effect's reconcile hook and apply its answer. Effects without a hook are listed for a human."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--action", help="only effects of this action")
        parser.add_argument("--limit", type=positive_int, metavar="N", help="ask at most N hooks per pass")
        parser.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                            help="import this module first so its protected functions' hooks are known (repeatable)")
        parser.add_argument("--loop", action="store_true", help="keep going, one pass every --interval seconds")
        parser.add_argument("--interval", type=float, default=60.0, metavar="SECONDS",
                            help="pause between passes with --loop (default 60)")

    def run(self, *, action: str | None, limit: int | None, modules: list[str], loop: bool, interval: float,
            **_: Any) -> None:
        if not math.isfinite(interval) or interval <= 0:
            raise Error("--interval must be a positive number of seconds", returncode=2)
        reconcile.discover(modules)
        while True:
            report = reconcile.run_once(action=action, limit=limit)
            for effect in report.swept:
                self.stdout.write(f"{effect.effect_key}  swept  lease lapsed under {effect.action_id}; now ambiguous")
            for line in report.lines:
                self.stdout.write(f"{line.effect_key}  {line.outcome}  {line.detail}")
            self.stdout.write(report.summary())
            if not loop:
                return
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                self.stdout.write("stopped")
                return
