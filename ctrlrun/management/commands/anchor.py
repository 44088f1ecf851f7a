"""``manage.py anchor`` / ``ctrlrun anchor`` (§F1): the chain head recorded outside the store."""
from __future__ import annotations

import json
from argparse import ArgumentParser
from typing import Any

from ... import anchor as anchoring
from ..base import CtrlrunCommand, Error


class Command(CtrlrunCommand):
    help = ("Record the receipt chain's head (seq, hash) through an anchor provider outside the store, or "
            "--verify the store against every anchor (exit 1 when the store was rewound or an anchor edited).")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--provider", metavar="MODULE:ATTR",
                            help="the provider (default: the file provider at CTRLRUN_ANCHOR_FILE)")
        parser.add_argument("--verify", action="store_true",
                            help="check the store against every anchor; exit 1 on a break")
        parser.add_argument("--kind", default="interval", choices=anchoring.KINDS,
                            help="interval (default) or checkpoint")
        parser.add_argument("--json", action="store_true", help="the anchor, or the report, as JSON")

    def run(self, *, provider: str | None, verify: bool, kind: str, json: bool, **_: Any) -> None:
        found = anchoring.load_provider(provider)
        if found is None:
            raise Error("no anchor provider: give --provider MODULE:ATTR, or set CTRLRUN_ANCHOR_FILE to a file "
                        "on another volume", returncode=2)
        if not verify:
            made = anchoring.make_anchor(found, kind=kind)
            if json:
                self.stdout.write(_json(made.as_dict()))
                return
            self.stdout.write(f"anchored seq {made.seq} ({made.kind}) at {made.at}")
            self.stdout.write(f"hash {made.hash}")
            self.stdout.write(f"token {made.token}")
            return
        report = anchoring.verify_anchors(found)
        if json:
            self.stdout.write(_json(report.as_dict()))
        else:
            if report.unavailable:
                self.stdout.write(f"anchor_unavailable: {report.reason}")
            self.stdout.write(f"anchors: {report.checked} checked against this chain")
            self.stdout.write(f"{report.superseded} superseded by an anchored checkpoint")
            if report.ok:
                self.stdout.write("every anchor reproduces")
            for b in report.breaks:
                self.stdout.write(f"{b['name']} at seq {b['seq']}: {b['detail']}")
        if not report.ok:
            raise Error(f"{len(report.breaks)} anchor break(s); see above")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
