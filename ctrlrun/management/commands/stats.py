from __future__ import annotations

import argparse
import datetime as dt
from argparse import ArgumentParser
from typing import Any

from ... import stats, store
from ...display import dumps, reveal
from ..base import CtrlrunCommand, Error

#: The window when --since is not given.
DEFAULT_SINCE = "24h"


class _Since:
    """``--since`` as written; read against the store's clock when the command runs (so a span
    means 'back from the store's now', and a bad value is a usage error before anything is read)."""

    def __init__(self, text: str) -> None:
        stats.parse_since(text, dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))  # the form alone
        self.text = text

    def at(self, now: dt.datetime) -> dt.datetime:
        return stats.parse_since(self.text, now)


def since_argument(text: str) -> _Since:
    """An argparse type for ``--since``: a usage error (exit 2) saying which forms are accepted."""
    try:
        return _Since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(reveal(str(exc))) from None


class Command(CtrlrunCommand):
    help = ("Count what the receipts of a time window say: actions, denials by reason, ambiguous outcomes; "
            "in observe mode what enforcement would have denied, sent for approval or blocked. Loads the policy "
            "for its mode (and says OBSERVE MODE on stderr when observing). Calls waiting for a human are not "
            "counted: they have no receipt yet.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--since", type=since_argument, default=DEFAULT_SINCE, metavar="WHEN",
                            help="count receipts finished at or after WHEN: an ISO-8601 time with an offset "
                                 "(2026-11-29T12:00:00Z, 2026-11-29T13:00:00+01:00), or a span back from now, "
                                 "<n>m, <n>h or <n>d (90m, 12h, 7d); no weeks, months or bare numbers "
                                 f"(default: {DEFAULT_SINCE})")
        parser.add_argument("--json", action="store_true",
                            help="print the ctrlrun.stats/v1 document (one JSON object) instead of the table")

    def run(self, *, since: _Since | str, json: bool, **_: Any) -> None:
        try:
            if isinstance(since, str):  # call_command(..., since="2h") skips argparse's type
                since = _Since(since)
            policy = self.load_policy()
            self.warn_if_observing(policy)
            start = since.at(store.now())
        except ValueError as exc:  # a usage error, as argparse reports one
            raise Error(f"argument --since: {reveal(str(exc))}", returncode=2) from None
        document = stats.compute(store.receipt_documents_since(start), mode=policy.mode,
                                 since=start, ledger_rows=store.ledger_rows())
        if json:
            self.stdout.write(dumps(document))
            return
        for line in stats.lines(document):
            self.stdout.write(reveal(line))
