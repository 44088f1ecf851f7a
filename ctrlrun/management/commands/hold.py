"""``manage.py hold`` / ``ctrlrun hold`` (§F3): legal holds on receipt ranges (docs/retention.md)."""
from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from ...canonical import evidence_time
from ...display import reveal
from ...store import retention
from ..base import CtrlrunCommand


def _range(row: Any) -> str:
    return f"{row.from_seq}..{row.to_seq if row.to_seq is not None else 'end'}"


class Command(CtrlrunCommand):
    help = "Place, release or list legal holds: a held receipt range is never pruned."

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="verb", required=True)
        place = sub.add_parser("place", help="hold a range of receipt seqs")
        place.add_argument("--id", required=True, dest="hold_id", metavar="NAME")
        place.add_argument("--from-seq", required=True, type=int, metavar="A")
        place.add_argument("--to-seq", type=int, metavar="B", help="omit: to the end of the chain")
        place.add_argument("--reason", required=True)
        place.add_argument("--by", required=True, metavar="WHO")
        release = sub.add_parser("release", help="release a live hold")
        release.add_argument("--id", required=True, dest="hold_id", metavar="NAME")
        release.add_argument("--by", required=True, metavar="WHO")
        listing = sub.add_parser("list", help="every hold, live or released")
        listing.add_argument("--json", action="store_true")

    def run(self, *, verb: str, **options: Any) -> None:
        if verb == "place":
            row, pruned = retention.place_hold(options["hold_id"], options["from_seq"], options.get("to_seq"),
                                               options["reason"], options["by"])
            self.stdout.write(f"held {_range(row)}: {reveal(row.reason)}")
            if pruned >= row.from_seq:
                self.stdout.write(f"note: receipts through seq {pruned} were pruned before this hold")
            return
        if verb == "release":
            row = retention.release_hold(options["hold_id"], options["by"])
            self.stdout.write(f"released {reveal(row.hold_id)}")
            return
        rows = retention.list_holds()
        if options.get("json"):
            self.stdout.write(json.dumps([{
                "hold_id": r.hold_id, "from_seq": r.from_seq, "to_seq": r.to_seq, "reason": r.reason,
                "placed_by": r.placed_by, "placed_at": evidence_time(r.placed_at),
                "released_at": evidence_time(r.released_at) if r.released_at else None,
                "released_by": r.released_by, "signature_ok": retention.hold_ok(r)} for r in rows]))
            return
        if not rows:
            self.stdout.write("no holds")
        for r in rows:
            state = "live" if r.released_at is None else f"released by {reveal(r.released_by)}"
            if not retention.hold_ok(r):
                state += " (NOT SIGNED BY CTRLRUN: treated as live)"
            self.stdout.write(f"{reveal(r.hold_id)}  {_range(r)}  {state}  {reveal(r.reason)}")
