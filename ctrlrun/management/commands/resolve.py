from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ... import store
from ..base import CtrlrunCommand, Error, default_person, positive_int


class Command(CtrlrunCommand):
    help = (
        "Say what happened to an AMBIGUOUS effect after checking the remote: --committed (it happened; "
        "a retry will be refused) or --failed (it did not; a retry may run)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("effect_key", help="the effect key, e.g. refund:txn_9 ('effects --state ambiguous')")
        parser.add_argument("--committed", action="store_true", help="the remote did act")
        parser.add_argument("--failed", action="store_true", help="the remote did not act")
        parser.add_argument("--by", default=None, metavar="NAME",
                            help="who decided (default: the operating-system user)")
        parser.add_argument("--reason", default=None, metavar="TEXT", help="why, e.g. what the remote showed")
        parser.add_argument("--attempt", type=positive_int, default=None, metavar="N",
                            help="refuse unless the record is still at this attempt (guards against a stale view)")

    def run(self, *, effect_key: str, committed: bool, failed: bool, by: str | None, reason: str | None,
            attempt: int | None, **_: Any) -> None:
        if committed == failed:
            raise Error("say which it was: exactly one of --committed or --failed", returncode=2)
        outcome = "committed" if committed else "failed"
        person = by if by is not None else default_person()
        effect = store.resolve(effect_key, outcome, by=person, reason=reason, attempt=attempt)
        self.stdout.write(f"{effect.effect_key} resolved {outcome} by {effect.resolved_by}")
        if outcome == "failed":
            self.stdout.write("a retry of this effect is now permitted")
        else:
            self.stdout.write("a retry of this effect will be refused as a duplicate")
