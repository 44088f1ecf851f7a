from __future__ import annotations

import json
import os
import socket
from argparse import ArgumentParser
from typing import Any

from ... import report, store
from ...display import json_text, reveal
from ..base import CtrlrunCommand, Error, default_person, positive_int


class Command(CtrlrunCommand):
    help = ("List the receipts (one per protected call, refusals included), or verify the evidence and record "
            "the result (the console's front page shows the last one).")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--last", type=positive_int, metavar="N", help="only the N most recent receipts")
        parser.add_argument("--control", metavar="ID",
                            help="only the receipts citing the control ID (the policy's controls: registry), "
                                 "matched exactly; combines with --last and --json")
        parser.add_argument("--json", action="store_true", help="print each receipt's JSON document, one per line "
                            "(with --verify-chain: the check's report as one JSON document)")
        parser.add_argument("--verify-chain", action="store_true",
                            help="a full check: re-hash every receipt and event, check each link, every signature "
                                 "and every signed row; record the result; exit 1 on any break")
        parser.add_argument("--incremental", action="store_true",
                            help="with --verify-chain: check only what was added since the last intact recorded "
                                 "check, from its position (fast on a large store; run it from cron), and record "
                                 "the result; with no intact check recorded, it checks everything")
        parser.add_argument("--quiet", action="store_true",
                            help="with --verify-chain: no progress lines on stderr during a long check")

    def run(self, *, last: int | None, json: bool, verify_chain: bool, incremental: bool, quiet: bool,
            control: str | None = None, **_: Any) -> None:
        if incremental and not verify_chain:
            raise Error("--incremental only goes with --verify-chain (ctrlrun receipts --verify-chain --incremental)")
        if verify_chain and control is not None:
            raise Error("--control lists receipts; it does not go with --verify-chain, which checks them all")
        if verify_chain:
            self._verify(as_json=json, incremental=incremental, quiet=quiet)
            return
        receipts = store.list_receipts(last, control=control)
        if not receipts:
            self.stdout.write("no receipts yet" if control is None else f"no receipts cite '{reveal(control)}'")
            return
        for receipt in receipts:
            self.stdout.write(json_text(receipt.document) if json else report.receipt_line(receipt))

    def _progress(self, text: str) -> None:
        self.stderr.write(f"checking: {text}")
        self.stderr.flush()

    def _verify(self, *, as_json: bool, incremental: bool, quiet: bool) -> None:
        argv = "receipts --verify-chain" + (" --incremental" if incremental else "")
        result, unrecorded = store.run_check(
            incremental=incremental, progress=None if quiet else self._progress,
            ran_by=f"{argv} by {default_person()}@{socket.gethostname()} (pid {os.getpid()})")
        if as_json:
            self.stdout.write(json.dumps(result.as_dict(), ensure_ascii=False))
        else:
            for line in report.chain_lines(result):
                self.stdout.write(line)
        if unrecorded is not None:
            raise Error(f"the check ran ({'intact' if result.ok else 'broken'}), but its result could not be "
                        f"recorded: {unrecorded}")
        if not result.ok:
            raise Error(f"the receipt chain has {len(result.breaks)} break(s); see above")
