from __future__ import annotations

import logging
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
        "--interval seconds until Ctrl-C, each pass that did something logged with its time (logger "
        "ctrlrun.resume_runs), an idle pass only with -v 2."
    )
    keeps_verbosity = True

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
            release: str | None = None, by: str | None = None, reason: str | None = None, verbosity: int = 1,
            **_: Any) -> None:
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
        log = self.loop_logger("ctrlrun.resume_runs", verbosity)
        told: set[str] = set()  # the runs already logged as left pending (their resumer is not here)
        try:
            while True:
                self._log(resumption.resume_ready(limit), log, told)
                time.sleep(interval)
        except KeyboardInterrupt:
            self.stdout.write("stopped")
            self.stdout.flush()

    def _pass(self, limit: int | None) -> list[resumption.Outcome]:
        outcomes = resumption.resume_ready(limit)
        for outcome in outcomes:
            self.stdout.write(reveal(outcome.line()))
        self.stdout.write(f"resume_runs: {_summary(outcomes)}")
        self.stdout.flush()
        return outcomes

    @staticmethod
    def _log(outcomes: list[resumption.Outcome], log: logging.Logger, told: set[str]) -> None:
        """One loop pass, logged: each outcome at INFO (a failure at WARNING; a run left pending for want of
        its resumer only the first time), the summary at INFO when the pass did something, else at DEBUG."""
        worked = False
        for outcome in outcomes:
            repeat = outcome.status == "skipped" and outcome.approval_id in told
            if outcome.status == "skipped":
                told.add(outcome.approval_id)
            worked = worked or not repeat
            level = logging.DEBUG if repeat else logging.WARNING if outcome.status == "failed" else logging.INFO
            log.log(level, "%s", reveal(outcome.line()))
        told &= {o.approval_id for o in outcomes if o.status == "skipped"}
        if worked:
            log.info("resume_runs: %s", _summary(outcomes))
        else:
            log.debug("idle pass: resume_runs: %s", _summary(outcomes))

    def _release(self, approval_id: str, by: str | None, reason: str | None) -> None:
        from ... import store
        from ...times import when_text

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


def _summary(outcomes: list[resumption.Outcome]) -> str:
    counts = {status: sum(o.status == status for o in outcomes) for status in ("resumed", "failed", "skipped", "taken")}
    return ", ".join(f"{n} {status}" for status, n in counts.items() if n) or "nothing to resume"
