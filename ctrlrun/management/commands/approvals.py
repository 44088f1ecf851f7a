from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from ... import store
from ...display import dumps, hidden_fields, reveal, warning
from ...states import ApprovalStatus
from ..base import CtrlrunCommand, span

#: The console's word for a pending request ("waiting for a person"), accepted by --status.
WAITING = "waiting"


def _answer(a: store.ApprovalView) -> str:
    """What became of an answered request, each part said of whoever did it: the person granted or
    denied it; the call (its action id) consumed it; the clock expired it."""
    by = f" by {reveal(a.approver)}" if a.approver else ""
    if a.status == ApprovalStatus.CONSUMED:
        return f"granted{by}, consumed by {reveal(a.consumed_by)}" if a.consumed_by else f"granted{by}, consumed"
    if a.status == ApprovalStatus.EXPIRED:
        return f"granted{by}, expired unused" if a.approver else "expired unanswered"
    return f"{a.status}{by}"  # granted by X, denied by X


class Command(CtrlrunCommand):
    help = "List approval requests: pending first (oldest first), with action, arguments, principal, age and expiry."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--status", choices=[*(s.value for s in ApprovalStatus), WAITING],
                            help="only requests in this status ('waiting', the console's word, is pending)")

    def run(self, *, status: str | None, **_: Any) -> None:
        if status == WAITING:
            status = ApprovalStatus.PENDING.value
        approvals = store.list_approvals(status)
        if not approvals:
            self.stdout.write(f"no approval requests are {status}" if status else "no approval requests yet")
            return
        now = store.now()  # the store's clock, as leases and expiries are kept
        for a in approvals:
            # Every name and value with its invisible or direction-changing characters escaped
            # (ctrlrun.display): a terminal would render them, and show other text than what runs.
            who = reveal(a.agent) + (f" (user {reveal(a.user)})" if a.user else "")
            arguments = dumps(a.arguments, sort_keys=True, separators=(",", ":"))
            if a.status == ApprovalStatus.PENDING:
                expiry = f"expires in {span(a.expires_at - now)}" if a.expires_at > now else "expired (not yet marked)"
                if a.approvals_required > 1 or a.required_roles:  # M-of-N, roles (policy v6): how far it is
                    roles = ", ".join(reveal(r.role) for r in a.required_roles)
                    expiry = f"{a.tally}" + (f" (roles {roles})" if roles else "") + f", {expiry}"
            else:
                expiry = _answer(a)
            self.stdout.write(
                f"{a.approval_id}  {a.status}  {reveal(a.action)}  {arguments}  {who}  age {span(now - a.created_at)}  "
                f"{expiry}"
            )
            hidden = hidden_fields(a.canonical_action, a.effect_key)
            if hidden:  # on stderr: stdout keeps one line per request
                self.stderr.write(f"warning: {a.approval_id}: {warning(hidden)}")
