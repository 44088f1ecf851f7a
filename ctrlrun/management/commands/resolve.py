from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any

from django.db import Error as DatabaseError

from ... import store
from ...display import is_blank, reveal
from ...errors import InvalidArgument, StateConflict
from ...states import EffectState, held_lapsed
from ..base import CtrlrunCommand, Error, default_person, positive_int


class Command(CtrlrunCommand):
    help = (
        "Say what happened to an AMBIGUOUS effect after checking the remote: --committed (it happened; "
        "a retry will be refused) or --failed (it did not; a retry may run), with the --reason you have (on a "
        "terminal it is asked for when not given; elsewhere none is recorded)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("effect_key", help="the effect key, e.g. refund:txn_9 ('effects --state ambiguous')")
        parser.add_argument("--committed", action="store_true", help="the remote did act")
        parser.add_argument("--failed", action="store_true", help="the remote did not act")
        parser.add_argument("--by", default=None, metavar="NAME",
                            help="who decided (default: the operating-system user)")
        parser.add_argument("--reason", default=None, metavar="TEXT",
                            help="what you checked, e.g. what the remote's dashboard shows; recorded with the "
                                 "resolution (not given: asked for on a terminal, else none is recorded)")
        parser.add_argument("--attempt", type=positive_int, default=None, metavar="N",
                            help="refuse unless the record is still at this attempt (guards against a stale view)")

    def run(self, *, effect_key: str, committed: bool, failed: bool, by: str | None, reason: str | None,
            attempt: int | None, **_: Any) -> None:
        if committed == failed:
            raise Error("say which it was: exactly one of --committed or --failed", returncode=2)
        if reason is not None and is_blank(reason):  # given, but saying nothing: a slip, not a choice
            raise Error("a given --reason must say something: say what you checked, e.g. what the remote's "
                        "dashboard shows, or leave --reason out", returncode=2)
        if reason is None:
            reason = self._ask_reason()
        outcome = "committed" if committed else "failed"
        person = by if by is not None else default_person()
        try:
            effect = store.resolve(effect_key, outcome, by=person, reason=reason, attempt=attempt)
        except (InvalidArgument, StateConflict) as exc:
            raise Error(reveal(f"{self.refusal(exc)}{self._next_step(effect_key, attempt)}", multiline=True)) from None
        self.stdout.write(f"{effect.effect_key} resolved {outcome} by {effect.resolved_by}")
        if outcome == "failed":
            self.stdout.write("a retry of this effect is now permitted")
        else:
            self.stdout.write("a retry of this effect will be refused as a duplicate")

    def _ask_reason(self) -> str | None:
        """On a terminal, ask what was checked (Enter: none); elsewhere (a script, a pipe) record none."""
        if not sys.stdin.isatty():
            return None
        self.stderr.write("What did you check (e.g. what the remote's dashboard shows)? Enter for no reason: ",
                          ending="")
        self.stderr.flush()
        try:
            answer = sys.stdin.readline()
        except KeyboardInterrupt:
            raise Error("stopped: nothing was resolved") from None
        return None if is_blank(answer) else answer.strip()

    def _next_step(self, effect_key: str, attempt: int | None) -> str:
        """After a refusal, what to run next, named as the user runs commands here (``ctrlrun effects``
        or ``python manage.py effects``), from the record as it is now."""
        try:
            effect = store.get_effect(effect_key)
            now = store.now()
        except (DatabaseError, InvalidArgument):
            return ""  # the refusal itself is what matters; the hint is a courtesy
        if effect is None:
            return f"; '{self.command_line('effects')}' lists the keys"
        if held_lapsed(effect.state, effect.lease_expires_at, now):
            return f". Run '{self.command_line('reconcile')}', then resolve it if it is still ambiguous"
        if attempt is not None and effect.state == EffectState.AMBIGUOUS and effect.attempt != attempt:
            return f" ('{self.command_line('effects')} --state ambiguous' shows it now)"
        return ""
