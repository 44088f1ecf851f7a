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
        parser.add_argument("--interval", type=float, default=None, metavar="SECONDS",
                            help="pause between passes without --once (default 5)")
        parser.add_argument("--release", metavar="APPROVAL_ID",
                            help="instead of resuming: move the run paused on this request from resuming back to "
                                 "pending, when its claim is older than CTRLRUN_RESUME_RELEASE_AFTER_SECONDS (its "
                                 "process died); needs --by")
        parser.add_argument("--by", metavar="NAME", help="with --release: who releases the run (recorded)")
        parser.add_argument("--reason", metavar="TEXT", help="with --release: why (recorded)")

    def run(self, *, once: bool, limit: int | None, modules: list[str], interval: float | None,
            release: str | None = None, by: str | None = None, reason: str | None = None, **_: Any) -> None:
        if release is not None:
            if once or limit is not None or modules or interval is not None:
                raise Error("--release is used alone (with --by and --reason), not with --once, --limit, --import "
                            "or --interval", returncode=2)
            return self._release(release, by, reason)
        if by is not None or reason is not None:
            raise Error("--by and --reason go with --release APPROVAL_ID", returncode=2)
        interval = 5.0 if interval is None else interval
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

    def _release(self, approval_id: str, by: str | None, reason: str | None) -> None:
        from ... import store
        from ...console import when_text

        if by is None or not by.strip():
            raise Error("--release needs --by NAME: who releases the run is recorded", returncode=2)
        paused = store.paused_run_for(approval_id)
        if paused is not None:  # what is known, before anything changes
            claimed = (f", claimed by {paused.claimed_by} at {when_text(paused.claimed_at)}"
                       if paused.claimed_at else "")
            self.stdout.write(reveal(f"{paused.approval_id}  {paused.status}  {paused.framework} run, "
                                     f"{paused.resume_with}{claimed}; answer {paused.answer or '-'}"))
            self.stdout.flush()
        released = resumption.release(approval_id, by=by, reason=reason)
        why = f": {released.release_reason}" if released.release_reason else ""
        self.stdout.write(reveal(f"released: the run paused on {released.approval_id} is pending again (by "
                                 f"{released.released_by}{why}); the next resume_runs pass resumes it", multiline=False))
        self.stdout.flush()
