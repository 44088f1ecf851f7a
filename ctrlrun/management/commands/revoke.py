from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ... import store
from ...canonical import evidence_time
from ..base import CtrlrunCommand, Error
from .delegate import principal


class Command(CtrlrunCommand):
    help = ("Revoke a delegation: it, and every delegation beneath it, is denied from the next evaluation. "
            "Idempotent; there is no unrevoke. Give one id, or select with --created-by and/or --under.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("delegation_id", nargs="?", default=None, help="the dlg_... id to revoke")
        parser.add_argument("--by", default="cli:local", metavar="WHO",
                            help="who revokes, kept on the row and the DELEGATION_REVOKED event (default cli:local)")
        parser.add_argument("--created-by", default=None, metavar="AGENT[/USER]",
                            help="revoke every delegation this principal created (without /USER: any user)")
        parser.add_argument("--under", default=None, metavar="ID",
                            help="revoke every delegation beneath this grant or delegation")

    def run(self, *, delegation_id: str | None, by: str, created_by: str | None, under: str | None,
            **_: Any) -> None:
        from ...control import default_control

        if not by.strip():
            raise Error("--by must name who revokes")
        if delegation_id is None and created_by is None and under is None:
            self.usage("give a delegation id, or --created-by / --under to select delegations")
        if delegation_id is not None and (created_by is not None or under is not None):
            self.usage("give a delegation id or a selector (--created-by, --under), not both")
        control = default_control()
        if delegation_id is not None:
            done = control.revoke(delegation_id, by=by)
            self.report(done, by)
            return
        control.policy  # noqa: B018 - the store is ready
        rows = store.list_delegations()
        if under is not None:
            rows = store.delegations_beneath(under, rows)
        if created_by is not None:
            who = principal(created_by, "--created-by")
            rows = [row for row in rows if row.created_by_agent == who.agent
                    and (who.user is None or row.created_by_user == who.user)]
        selector = " ".join(part for part in (f"--created-by {created_by}" if created_by else "",
                                              f"--under {under}" if under else "") if part)
        if not rows:
            raise Error(f"no delegation matched {selector}")
        changed = already = 0
        for row in rows:
            done = control.revoke(row.id, by=by)
            if done.changed:
                changed += 1
                self.stdout.write(f"revoked {row.id} by {by}")
            else:
                already += 1
        self.stdout.write(f"revoked {changed} of {len(rows)} matching {selector}; {already} already revoked")
        if changed:
            self.stdout.write("every delegation beneath them is denied from the next evaluation")

    def report(self, done: Any, by: str) -> None:
        row = done.delegation
        if done.changed:
            self.stdout.write(f"revoked {row.id} by {by}")
            self.stdout.write("every delegation beneath it is denied from the next evaluation")
        else:
            self.stdout.write(f"{row.id} was already revoked at {evidence_time(row.revoked_at)} by {row.revoked_by}")

    def usage(self, message: str) -> None:
        """A command line without what it needs: one ``Error:`` line, exit 2."""
        raise Error(f"{message} ('{self.command_line('revoke')} --help' lists the options)", returncode=2)
