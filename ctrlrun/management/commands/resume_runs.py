from __future__ import annotations

import math
import time
from argparse import ArgumentParser
from typing import Any

from ... import resumption
from ...display import reveal
from ..base import CtrlrunCommand, Error, positive_int


class Command(CtrlrunCommand):
    help = (
        "Resume agent runs paused on a ctrlrun approval (ctrlrun.resumption) once a person answered: each "
        "pending paused run whose request is granted, denied or expired is claimed by this process (never by "
        "two) and its registered resumer runs, once; the run is then marked resumed or failed. A run whose "
        "resumer is not registered here (--import MODULE) is left pending. Without --once, a pass every "
        "--interval seconds until Ctrl-C."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--once", action="store_true", help="one pass, then exit (1 if a run failed or was "
                                                                "left pending for want of its resumer)")
        parser.add_argument("--limit", type=positive_int, metavar="N", help="resume at most N runs per pass")
        parser.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                            help="import this module first so its @resumer functions are registered (repeatable)")
        parser.add_argument("--interval", type=float, default=5.0, metavar="SECONDS",
                            help="pause between passes without --once (default 5)")

    def run(self, *, once: bool, limit: int | None, modules: list[str], interval: float, **_: Any) -> None:
        if not math.isfinite(interval) or interval <= 0:
            raise Error("--interval must be a positive number of seconds", returncode=2)
        resumption.discover(modules)
        if once:
            outcomes = self._pass(limit)
            bad = [o for o in outcomes if o.status in ("failed", "skipped")]
            if bad:
                raise Error(f"{len(bad)} paused run(s) not resumed: "
                            + "; ".join(f"{o.approval_id} {o.status}" for o in bad))
            return
        try:
            while True:
                self._pass(limit)
                time.sleep(interval)
        except KeyboardInterrupt:
            self.stdout.write("stopped")
            self.stdout.flush()

    def _pass(self, limit: int | None) -> list[resumption.Outcome]:
        outcomes = resumption.resume_ready(limit)
        for outcome in outcomes:
            self.stdout.write(reveal(outcome.line()))
        counts = {status: sum(o.status == status for o in outcomes) for status in ("resumed", "failed", "skipped", "taken")}
        summary = ", ".join(f"{n} {status}" for status, n in counts.items() if n) or "nothing to resume"
        self.stdout.write(f"resume_runs: {summary}")
        self.stdout.flush()
        return outcomes
