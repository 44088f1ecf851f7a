from __future__ import annotations

import datetime as dt
import logging
import math
import time
from argparse import ArgumentParser
from typing import Any

from django.db import Error as DjangoDatabaseError
from django.db import InterfaceError, OperationalError, connections

from ... import conf, reconcile
from ...canonical import evidence_time
from ...display import reveal
from ...errors import StoreUnavailable
from ..base import CtrlrunCommand, Error, positive_int, span

#: At most this many known actions are named in the error for an unknown --action.
KNOWN_SHOWN = 30

#: The first wait after a pass the database refused: long enough not to hammer a server that is
#: restarting, short enough that a blip (a failover, a dropped connection) costs about a second.
OUTAGE_FIRST_WAIT_SECONDS = 1.0
#: Each further failure in a row doubles the wait, so a long outage is not hammered; the wait is
#: capped at --interval, so the loop never waits longer after an outage than between healthy
#: passes, and a database that is back is noticed no later than the next scheduled pass.
OUTAGE_BACKOFF_FACTOR = 2.0


def _database_error(exc: BaseException) -> BaseException:
    """The driver's error under the store's ``StoreUnavailable`` (raised from it), else ``exc``."""
    while isinstance(exc, StoreUnavailable) and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _unreachable(exc: BaseException) -> bool:
    """Is this the database being away (worth waiting out), not a fault that a retry repeats?

    A missing table or a refused statement (ProgrammingError...), or a ``StoreUnavailable`` of
    ctrlrun's own making (a store that fails its integrity checks), is not an outage: the loop
    stops with the one-line error instead of retrying it forever. (SQLite reports a missing table
    as an OperationalError: that is retried, and logged on every pass.)
    """
    return isinstance(_database_error(exc), (OperationalError, InterfaceError))


def _one_line(exc: BaseException) -> str:
    """What went wrong, as one log line (a driver's message may span several)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


class Command(CtrlrunCommand):
    help = (
        "Deferred reconciliation: move effects whose worker's lease lapsed to AMBIGUOUS, then ask each "
        "AMBIGUOUS effect's reconcile hook and apply its answer. Effects without a hook are listed for a human. "
        "With --loop, a database outage is logged and waited out (backoff up to --interval), not fatal; each "
        "pass that did something is logged with its time (logger ctrlrun.reconcile), an idle pass only with -v 2."
    )
    keeps_verbosity = True

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--action", metavar="NAME",
                            help="only effects of this action (one the policy names, a hook is registered for, "
                                 "or a record holds)")
        parser.add_argument("--limit", type=positive_int, metavar="N", help="ask at most N hooks per pass")
        parser.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                            help="import this module first so its protected functions' hooks are known (repeatable)")
        parser.add_argument("--loop", action="store_true",
                            help="keep going, one pass every --interval seconds; survive database outages")
        parser.add_argument("--interval", type=float, default=60.0, metavar="SECONDS",
                            help="pause between passes with --loop (default 60)")

    def run(self, *, action: str | None, limit: int | None, modules: list[str], loop: bool, interval: float,
            verbosity: int = 1, **_: Any) -> None:
        if not math.isfinite(interval) or interval <= 0:
            raise Error("--interval must be a positive number of seconds", returncode=2)
        reconcile.discover(modules)
        if action is not None:
            self._check_action(action)
        if not loop:  # one pass: an outage is the one-line error every command gives
            self._print(reconcile.run_once(action=action, limit=limit), action)
            return
        self.log = self.loop_logger("ctrlrun.reconcile", verbosity)
        self.told: set[str] = set()  # the effects already logged as needing a human
        try:
            self._loop(action, limit, interval)
        except KeyboardInterrupt:  # Ctrl-C, in a pass or a wait: an interrupted step rolled back
            self.stdout.write("stopped")
            self.stdout.flush()

    def _loop(self, action: str | None, limit: int | None, interval: float) -> None:
        failures = 0
        wait = OUTAGE_FIRST_WAIT_SECONDS
        while True:
            try:
                report = reconcile.run_once(action=action, limit=limit)
            except (OperationalError, InterfaceError, StoreUnavailable) as exc:
                if not _unreachable(exc):
                    raise
                failures += 1
                pause = min(wait, interval)
                wait = pause * OUTAGE_BACKOFF_FACTOR
                self._reconnect()
                at = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=pause)).strftime("%H:%M:%S")
                self.log.warning("the store is unavailable (%s); retrying in %s s, at %s UTC (failed pass "
                                 "%d in a row)", _one_line(_database_error(exc)), f"{pause:g}", at, failures)
                time.sleep(pause)
                continue
            if failures:
                self.log.warning("the store is reachable again after %d failed pass(es); resuming every "
                                 "%s s", failures, f"{interval:g}")
                failures, wait = 0, OUTAGE_FIRST_WAIT_SECONDS
            self._log(report, action)
            time.sleep(interval)

    def _log(self, report: reconcile.Report, action: str | None) -> None:
        """One loop pass, logged: what it did at INFO (an effect needing a human only the first time it
        is seen), and its summary at INFO when it did something, else (an idle pass) at DEBUG."""
        worked = bool(report.swept)
        for effect in report.swept:
            self.log.info("%s  swept  lease lapsed under %s; now ambiguous", reveal(effect.effect_key), effect.action_id)
        for line in report.lines:
            repeat = line.outcome == "needs_human" and line.effect_key in self.told
            if line.outcome == "needs_human":
                self.told.add(line.effect_key)
            worked = worked or not repeat
            self.log.log(logging.DEBUG if repeat else logging.INFO, "%s  %s  %s", reveal(line.effect_key), line.outcome,
                         reveal(line.detail))
        # Resolved meanwhile (by a person, or a hook): if it turns ambiguous again, it is news again.
        self.told &= {line.effect_key for line in report.lines if line.outcome == "needs_human"}
        for effect in report.waiting:
            self.log.debug("%s  backoff  asked again from %s", reveal(effect.effect_key),
                           evidence_time(effect.reconcile_after) if effect.reconcile_after else "-")
        if worked:
            self.log.info("%s", report.summary())
        else:
            self.log.debug("idle pass%s: %s", f" for {reveal(action)}" if action else "", report.summary())

    @staticmethod
    def _reconnect() -> None:
        """Drop the broken connection, so that the next pass opens a new one.

        Django closes a dead connection only at the end of a web request; a long-running command
        would otherwise reuse it, and fail, after the database is back.
        """
        try:
            connections[conf.database_alias()].close()
        except DjangoDatabaseError:
            pass  # closing a dead connection may fail too; Django has forgotten it either way

    def _check_action(self, action: str) -> None:
        """--action must name something: a typo would otherwise be a quiet pass that did nothing."""
        if reconcile.is_known_action(action):
            return
        known, note = reconcile.known_actions()
        shown = ", ".join(reveal(name) for name in known[:KNOWN_SHOWN])
        if len(known) > KNOWN_SHOWN:
            shown += f" and {len(known) - KNOWN_SHOWN} more"
        listing = f"the known actions are {shown}" if known else "no action is known yet"
        raise Error(
            f"no action {reveal(repr(action))} is known here: the policy does not name it, no reconcile hook is "
            f"registered for it (--import MODULE), and no effect record holds it; {listing}"
            + (f"; {note}" if note else ""), returncode=2,
        )

    def _print(self, report: reconcile.Report, action: str | None = None) -> None:
        for effect in report.swept:
            self.stdout.write(f"{effect.effect_key}  swept  lease lapsed under {effect.action_id}; now ambiguous")
        for line in report.lines:
            self.stdout.write(f"{line.effect_key}  {line.outcome}  {line.detail}")
        for effect in report.waiting:
            due = effect.reconcile_after
            assert due is not None and report.now is not None
            times = f"{effect.reconcile_failures} time{'s' if effect.reconcile_failures != 1 else ''}"
            self.stdout.write(f"{effect.effect_key}  backoff  the hook gave no answer ({times}); asked again from "
                              f"{evidence_time(due)} (in {span(due - report.now)})")
        if action is not None and not (report.swept or report.lines or report.waiting):
            self.stdout.write(f"nothing to reconcile for {reveal(action)}: no lapsed lease, no ambiguous effect")
        self.stdout.write(report.summary())
        self.stdout.flush()  # a loop's lines go to a log reader now, not when a buffer fills
