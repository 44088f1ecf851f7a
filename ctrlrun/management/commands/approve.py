from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ... import store
from ...canonical import evidence_time
from ..base import CtrlrunCommand, default_person


#: What every grant from the command line says: it verifies nobody (§D4).
UNVERIFIED_NOTE = ("note: an answer from the command line carries no verified approver (it verifies nobody): it "
                   "cannot satisfy a control's approver_role nor count toward approvals_required; a person answers "
                   "those in the console")


class Command(CtrlrunCommand):
    help = "Grant a pending approval request: it authorises exactly the action it names, once, until it expires."
    grant = True

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("approval_id", help="the apr_... id (from the agent's ApprovalRequired, or 'approvals')")
        parser.add_argument("--by", default=None, metavar="NAME",
                            help="who answers (default: the operating-system user)")
        parser.add_argument("--note", default=None, metavar="TEXT", help="why, kept with the answer")

    def run(self, *, approval_id: str, by: str | None, note: str | None, **_: Any) -> None:
        person = by if by is not None else default_person()
        approval = store.answer_approval(approval_id, self.grant, by=person, note=note)
        if self.grant and approval.status == "pending":  # M-of-N: a command's answer counts toward nothing
            self.stdout.write(f"recorded {approval.approval_id}: {approval.tally}")
            self.stdout.write(UNVERIFIED_NOTE)
            return
        if self.grant:
            self.stdout.write(f"granted {approval.approval_id} for {approval.action_hash}")
            self.stdout.write(f"expires {evidence_time(approval.expires_at)}")
            self.stdout.write(f"the agent may now retry inside ctrlrun.with_approval('{approval.approval_id}')")
            self.stdout.write(UNVERIFIED_NOTE)
        else:
            self.stdout.write(f"denied {approval.approval_id}")
