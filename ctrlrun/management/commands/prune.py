"""``manage.py prune`` / ``ctrlrun prune`` (§F2): retention that keeps the chain verifiable (docs/retention.md)."""
from __future__ import annotations

import json
import math
import time
from argparse import ArgumentParser
from typing import Any

from ... import retention
from ...errors import CTRLRunError
from ..base import CtrlrunCommand, Error


class Command(CtrlrunCommand):
    help = ("Delete the receipts genesis..--through (older than --older-than), leaving a signed checkpoint the "
            "chain verifies from; refused over a live hold. The only command that removes evidence.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--through", type=int, metavar="SEQ", help="the last receipt seq to delete")
        parser.add_argument("--older-than", required=True, metavar="DURATION",
                            help="only receipts older than this: <n>d, <n>h, <n>m or <n>s (e.g. 90d)")
        parser.add_argument("--provider", metavar="MODULE:ATTR",
                            help="anchor the checkpoint through this provider before anything is deleted "
                                 "(default: the file provider when CTRLRUN_ANCHOR_FILE is set)")
        parser.add_argument("--by", required=True, metavar="WHO", help="who prunes (recorded)")
        parser.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded)")
        parser.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
        parser.add_argument("--json", action="store_true", help="the result as one JSON document")
        parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
        parser.add_argument("--loop", action="store_true",
                            help="keep going: every --interval seconds, prune what is older than --older-than")
        parser.add_argument("--interval", type=float, default=3600.0, metavar="SECONDS",
                            help="pause between passes with --loop (default 3600)")

    def run(self, *, through: int | None, older_than: str, provider: str | None, by: str, reason: str,
            dry_run: bool, json: bool, quiet: bool, loop: bool, interval: float, **_: Any) -> None:
        try:
            age = retention.parse_duration(older_than)
        except CTRLRunError as exc:
            raise Error(str(exc), returncode=2) from None
        if not math.isfinite(interval) or interval <= 0:
            raise Error("--interval must be a positive number of seconds", returncode=2)
        if loop == (through is not None):
            raise Error("give --through SEQ for one prune, or --loop (which prunes what is older than "
                        "--older-than on every pass)", returncode=2)
        from ...anchor import load_provider

        anchor = load_provider(provider)
        if not loop:
            self._one(through, age, by, reason, anchor, dry_run, json, quiet)
            return
        try:
            while True:
                found = retention.oldest_through(age)
                if found is not None:
                    try:
                        self._one(found, age, by, reason, anchor, dry_run, json, quiet)
                    except CTRLRunError as exc:
                        self.stderr.write(f"prune: {exc}")
                self.stdout.flush()
                time.sleep(interval)
        except KeyboardInterrupt:
            self.stdout.write("stopped")

    def _one(self, through: int, age: Any, by: str, reason: str, anchor: Any, dry_run: bool, as_json: bool,
             quiet: bool) -> None:
        def progress(text: str) -> None:
            if not quiet:
                self.stderr.write(f"pruning: {text}")
                self.stderr.flush()

        result = retention.prune(through=through, older_than=age, by=by, reason=reason, anchor=anchor,
                                 dry_run=dry_run, progress=progress)
        if as_json:
            self.stdout.write(json.dumps(result.as_dict()))
            return
        cp = result.checkpoint or {}
        verb = "would prune" if dry_run else "pruned"
        self.stdout.write(f"{verb} through seq {result.through}")
        self.stdout.write(f"receipts deleted {result.receipts_deleted}")
        self.stdout.write(f"ledger rows deleted {result.ledger_rows_deleted}")
        if cp:
            self.stdout.write(f"checkpoint seq {cp['seq']} ({cp['schema']})")
        if result.anchored:
            self.stdout.write("the checkpoint was anchored before anything was deleted")
        if result.stopped_by:
            self.stdout.write(f"stopped short: a hold was placed while pruning: {result.stopped_by}")
