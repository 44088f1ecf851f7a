"""``manage.py import_store`` / ``ctrlrun import`` (§F10): a store the reference ctrlrun wrote, brought into ours.

Read and verified first (every receipt under its own schema's keys, the chain from the genesis to its
head row), then written in one transaction, or not at all: docs/importing.md.
"""
from __future__ import annotations

import datetime as dt
import getpass
import json
from argparse import ArgumentParser
from typing import Any

from ... import reference_store
from ...display import reveal
from ...errors import InvalidArgument
from ..base import CtrlrunCommand, Error

SHOWN_BREAKS = 20


class Command(CtrlrunCommand):
    help = ("Import a store written by the reference ctrlrun (PyPI 'ctrlrun' up to 0.12.2): its receipts "
            "(schemas v1-v7) are verified against its chain first, then kept in this store's event chain, and "
            "its effect records become this store's, so a key it ran is still refused here. All or nothing; "
            "exit 1 when its chain does not verify.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("path", metavar="STATE_DB", help="the reference's SQLite store (its .ctrlrun/state.db)")
        parser.add_argument("--dry-run", action="store_true", help="read and verify it, say what would be imported, "
                            "write nothing")
        parser.add_argument("--by", metavar="NAME", help="who imports (recorded; default: this OS user)")
        parser.add_argument("--json", action="store_true", help="the report as JSON")

    def run(self, *, path: str, dry_run: bool, by: str | None, json: bool, **_: Any) -> None:
        try:
            report = reference_store.read(path)
        except reference_store.NotAReferenceStore as exc:
            raise Error(reveal(str(exc)), returncode=2) from None
        summary = report.summary()
        live = [e for e in report.effects if reference_store.lease_live(e, dt.datetime.now(dt.timezone.utc))]
        problem = None
        if report.breaks:
            problem = (f"its chain does not verify ({len(report.breaks)} break(s)): nothing was imported. Keep the "
                       "file as it is and compare it with a backup")
        elif summary["verified"] != summary["chained"]:  # every chained receipt re-hashed, or none is trusted
            problem = (f"only {summary['verified']} of {summary['chained']} chained receipts verify: nothing was "
                       "imported")
        elif live:
            problem = (f"{len(live)} effect(s) are executing in it with a live lease ({reveal(live[0].effect_key)}, "
                       "...): a reference worker may still be running; stop it, and import again once the leases "
                       "have run out")
        written = None
        if problem is None and not dry_run:
            source = {"path": str(report.path), "written_by": report.versions, "head_seq": report.head_seq,
                      "head_hash": report.head_hash, "checkpoint": summary["checkpoint"], "first_receipt": report.receipts[0].receipt_id
                      if report.receipts else None, "receipts": len(report.receipts),
                      "chained": summary["chained"], "unchained": report.unchained, "schemas": summary["schemas"]}
            from ...store import imports

            try:
                written = imports.write(report, source, by=by or f"cli:{getpass.getuser()}")
            except InvalidArgument as exc:
                raise Error(reveal(str(exc))) from None
        if json:
            summary.update(dry_run=dry_run, imported=written is not None, refused=problem)
            self.stdout.write(_json(summary))
        else:
            self._text(summary, dry_run, written)
        if problem:
            raise Error(problem)

    def _text(self, summary: dict[str, Any], dry_run: bool, written: Any) -> None:
        out = self.stdout.write
        out(f"reference store {reveal(summary['path'])}, written by ctrlrun "
            f"{', '.join(summary['written_by']) or '(version not recorded)'}")
        start = f"its prune checkpoint at seq {summary['checkpoint']['seq']}" if summary["checkpoint"] else "the genesis"
        out(f"receipts: {summary['receipts']}: {summary['verified']} of {summary['chained']} chained verified from "
            f"{start} to head seq {summary['head_seq']}" + (
                f"; {summary['unchained']} written before the chain existed (read, not verifiable)"
                if summary["unchained"] else ""))
        out("schemas: " + (", ".join(f"{k.rsplit('/', 1)[-1]} {n}" for k, n in summary["schemas"].items()) or "none"))
        out("effects: " + (", ".join(f"{n} {state}" for state, n in summary["effects"].items()) or "none"))
        for item in summary["breaks"][:SHOWN_BREAKS]:
            seq = f" at seq {item['seq']}" if item["seq"] is not None else ""
            out(f"  {item['name']}{seq}: {reveal(item['detail'])}")
        if len(summary["breaks"]) > SHOWN_BREAKS:
            out(f"  ... and {len(summary['breaks']) - SHOWN_BREAKS} more (--json lists them all)")
        left = summary["left_behind"]
        if any(left.values()):
            out(f"not imported: {left['pending_approvals']} open approval request(s), {left['live_delegations']} live "
                f"delegation(s), {left['budget_ledger_rows']} budget-ledger row(s) (docs/importing.md says why)")
        if summary["breaks"]:
            return
        if dry_run:
            out("dry run: nothing was written")
        elif written is not None:
            out(f"imported: {written.receipts} receipt(s) into the event chain, "
                f"{sum(written.effects.values())} effect record(s); STORE_IMPORTED recorded")
            out("next: 'anchor' the chain, and keep the reference file (read-only) as long as your retention needs")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
