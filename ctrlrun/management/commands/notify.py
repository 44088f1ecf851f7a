from __future__ import annotations

import math
import time
from argparse import ArgumentParser
from typing import Any

from django.db import InterfaceError, OperationalError, connections

from ... import conf, notify
from ...errors import StoreUnavailable
from ..base import CtrlrunCommand, Error, positive_int

#: After a pass the database refused, wait this long first, doubling up to --interval.
OUTAGE_FIRST_WAIT_SECONDS = 1.0


class Command(CtrlrunCommand):
    help = (
        "Send the approval-request mails that are due (docs/approvals.md#notifications): a first try that failed, "
        "or one never tried (CTRLRUN_NOTIFY_AT_ONCE = False), is tried again with backoff, up to "
        "CTRLRUN_NOTIFY_MAX_ATTEMPTS. One pass, or with --loop one every --interval seconds (Ctrl-C stops it); "
        "each pass that did something is logged with its time (logger ctrlrun.notify), an idle pass only with -v 2."
    )
    keeps_verbosity = True

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--limit", type=positive_int, metavar="N", help="send at most N mails per pass")
        parser.add_argument("--loop", action="store_true", help="keep going, one pass every --interval seconds; "
                                                                "survive database outages")
        parser.add_argument("--interval", type=float, default=30.0, metavar="SECONDS",
                            help="pause between passes with --loop (default 30)")

    def run(self, *, limit: int | None, loop: bool, interval: float, verbosity: int = 1, **_: Any) -> None:
        if not math.isfinite(interval) or interval <= 0:
            raise Error("--interval must be a positive number of seconds", returncode=2)
        config = notify.settings()  # a wrong setting: one line, before any pass
        if not loop:
            self.stdout.write(notify.run_once(limit, config=config).summary())
            return
        log = self.loop_logger("ctrlrun.notify", verbosity)
        log.info("sending due approval mails every %s s (Ctrl-C stops)", f"{interval:g}")
        wait = OUTAGE_FIRST_WAIT_SECONDS
        try:
            while True:
                try:
                    report = notify.run_once(limit, config=config)
                except (OperationalError, InterfaceError, StoreUnavailable) as exc:
                    pause = min(wait, interval)
                    wait = pause * 2
                    connections[conf.database_alias()].close()
                    log.warning("the store is unavailable (%s: %s); retrying in %s s", type(exc).__name__,
                                " ".join(str(exc).split()), f"{pause:g}")
                    time.sleep(pause)
                    continue
                wait = OUTAGE_FIRST_WAIT_SECONDS
                log.log(20 if report.worked else 10, "%s", report.summary())
                time.sleep(interval)
        except KeyboardInterrupt:
            self.stdout.write("stopped")
            self.stdout.flush()
