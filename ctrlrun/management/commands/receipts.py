from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from ... import report, store
from ..base import CtrlrunCommand, Error, positive_int


class Command(CtrlrunCommand):
    help = "List the receipts (one per protected call, refusals included), or verify their hash chain."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--last", type=positive_int, metavar="N", help="only the N most recent receipts")
        parser.add_argument("--json", action="store_true", help="print each receipt's JSON document, one per line")
        parser.add_argument("--verify-chain", action="store_true",
                            help="re-hash every receipt and check each link; exit 1 on any break")

    def run(self, *, last: int | None, json: bool, verify_chain: bool, **_: Any) -> None:
        if verify_chain:
            self._verify(as_json=json)
            return
        receipts = store.list_receipts(last)
        if not receipts:
            self.stdout.write("no receipts yet")
            return
        for receipt in receipts:
            self.stdout.write(receipt.document if json else report.receipt_line(receipt))

    def _verify(self, *, as_json: bool) -> None:
        result = store.verify()
        if as_json:
            self.stdout.write(json.dumps(result.as_dict(), ensure_ascii=False))
        else:
            for line in report.chain_lines(result):
                self.stdout.write(line)
        if not result.ok:
            raise Error(f"the receipt chain has {len(result.breaks)} break(s); see above")
